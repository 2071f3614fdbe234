"""Down to the commit without compiling: a main-branch commit's Python over a nightly's binaries.

After the nightly boundary, the main-branch commits between the two nightlies are the
suspects. A commit that changes only Python (and files a wheel does not ship: tests, docs,
CI) can be tested by overlaying its ``torch/`` Python files on the bad-side nightly's
installed torch, the way pytorch's ``tools/nightly.py`` makes a development tree from
nightly binaries. A commit that touches compiled code (C++, CUDA, codegen YAML, build
files) cannot: it is skipped and named. The overlay environment is a hard-linked copy of the
nightly's; each overlaid file is replaced (unlinked, then written), never written through.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from opforge.errors import OpforgeError

from .index import Nightly

# paths a torch wheel does not ship: changing them changes nothing a probe can see
_NOT_SHIPPED = ("test/", "docs/", ".github/", ".ci/", "benchmarks/", "scripts/", ".circleci/")
_PYTHON = (".py", ".pyi")
MARKER = "opforge-overlay.json"


@dataclass(frozen=True)
class Commit:
    """A main-branch commit tested as its Python over ``base``'s (the bad nightly's) binaries."""

    sha: str
    subject: str
    base: Nightly
    base_main: str                  # the main commit the base nightly was cut from
    repo: str                       # the local pytorch clone the files come from
    compiled: tuple[str, ...] = ()  # files it changes that need a compiler (then: skipped)

    @property
    def key(self) -> str:
        return self.sha[:12]

    @property
    def version(self) -> str:
        return f"{self.base.version} + {self.key} (Python)"

    @property
    def url(self) -> str:
        return f"https://github.com/pytorch/pytorch/commit/{self.sha}"

    @property
    def filename(self) -> str:
        return f"commit-{self.key}"

    def to_json(self) -> dict:
        return {"kind": "commit", "sha": self.sha, "subject": self.subject,
                "base": self.base.to_json(), "base_main": self.base_main, "repo": self.repo,
                "compiled": list(self.compiled), "version": self.version, "url": self.url}

    @classmethod
    def from_json(cls, data: dict) -> Commit:
        if not all(isinstance(data.get(k), str) for k in ("sha", "subject", "base_main", "repo")):
            raise TypeError("a commit's sha, subject, base_main and repo are strings")
        return cls(data["sha"], data["subject"], Nightly.from_json(data["base"]),
                   data["base_main"], data["repo"], tuple(str(f) for f in data.get("compiled", [])))


def _git(repo: Path, *args: str, binary: bool = False):
    result = subprocess.run(["git", "-C", str(repo), *args], capture_output=True,
                            text=not binary)
    if result.returncode != 0:
        raise OpforgeError(f"git {' '.join(args[:3])} in {repo} failed: "
                           f"{(result.stderr if not binary else result.stderr.decode())[-300:]}")
    return result.stdout


def compiled_files(repo: Path, sha: str) -> tuple[str, ...]:
    """The files ``sha`` changes (against its first parent) that a Python overlay cannot carry."""
    names = _git(repo, "diff-tree", "--no-commit-id", "--name-only", "-r", "-m",
                 "--first-parent", sha).split("\n")
    return tuple(n for n in names if n and not n.endswith(_PYTHON)
                 and not n.startswith(_NOT_SHIPPED) and not n.endswith((".md", ".rst")))


def suspects(repo: Path, commits: list[tuple[str, str]], base: Nightly,
             base_main: str) -> list[Commit]:
    """The listed main commits (newest first, as commits.py lists them), oldest first."""
    return [Commit(sha, subject, base, base_main, str(repo), compiled_files(repo, sha))
            for sha, subject in reversed(commits)]


def changed_python(repo: Path, sha: str, base_sha: str) -> dict[str, bytes | None]:
    """``torch/`` Python files that differ between the base's commit and ``sha``: their
    content at ``sha`` (None: the file does not exist there)."""
    names = [n for n in _git(repo, "diff", "--name-only", base_sha, sha, "--", "torch").split("\n")
             if n.endswith(_PYTHON)]
    out: dict[str, bytes | None] = {}
    for name in names:
        exists = subprocess.run(["git", "-C", str(repo), "cat-file", "-e", f"{sha}:{name}"],
                                capture_output=True).returncode == 0
        out[name] = _git(repo, "show", f"{sha}:{name}", binary=True) if exists else None
    return out


def make_overlay(base_env: Path, target: Path, files: dict[str, bytes | None]) -> None:
    """``target``: a hard-linked copy of ``base_env`` with ``files`` replaced in its
    site-packages; valid once its marker is written (last)."""
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(base_env, target, symlinks=True, copy_function=os.link)
    sites = sorted(target.glob("lib/python*/site-packages")) or [target / "Lib" / "site-packages"]
    site = sites[0]
    for name, content in files.items():
        dest = site / name
        if dest.exists() or dest.is_symlink():
            dest.unlink()  # a hard link to the nightly's file: replace it, never write through
        if content is not None:
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(content)
    (target / MARKER).write_text(json.dumps({"files": sorted(files)}, indent=1))


def overlay_ready(target: Path) -> bool:
    return (target / MARKER).is_file()
