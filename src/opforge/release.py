"""opforge's own release, from a ``vX.Y.Z`` tag: stamp, build, check, install, run.

The tag is the version. ``stamp`` writes it and the tagged commit into ``opforge/_release.py``
(``VERSION``, which the distribution's metadata and ``opforge.__version__`` read, and
``WORKFLOWS_COMMIT``, the commit ``opforge init`` pins the reusable workflows to), after
checking that the reusable workflows at that commit install this version by default (else a
caller pinned to the commit would run another opforge). ``build`` makes the sdist and the
wheel (PEP 517, ``python -m build``), ``check`` runs ``twine check --strict`` on them, and
``try_installed`` installs the wheel into a fresh environment and runs the CLI there: its
``--version`` and the stamped commit must be the release's. The release workflow
(.github/workflows/release.yml) runs these through ``nox -s release`` and then publishes the
files to PyPI with trusted publishing; the tests run the same steps on a copy of the tree.

(setuptools-scm would derive a version from every commit - ``0.2.1.dev4+g1a2b3c`` - which no
index serves and which the reusable workflows' ``opforge==<version>`` defaults could never
match; a release is a tag, and between tags the tree keeps the last release's version.)
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import yaml
from packaging.version import InvalidVersion, Version

from opforge.errors import OpforgeError, UsageError
from opforge.files import write_atomic
from opforge.venv import create_venv, install

RELEASE_FILE = Path("src") / "opforge" / "_release.py"
REUSABLE = (".github/workflows/reusable-build-smoke.yml", ".github/workflows/reusable-nightly.yml",
            ".github/workflows/reusable-bisect.yml", ".github/workflows/reusable-release.yml")
_COMMIT = re.compile(r"[0-9a-f]{40}\Z")


def version_from_tag(tag: str) -> str:
    """``v0.2.0`` -> ``0.2.0``: a public PEP 440 version behind a ``v``."""
    if not tag.startswith("v"):
        raise UsageError(f"tag {tag!r}: a release tag is v<version> (v0.2.0)")
    try:
        version = Version(tag[1:])
    except InvalidVersion:
        raise UsageError(f"tag {tag!r}: {tag[1:]!r} is not a PEP 440 version") from None
    if version.local or str(version) != tag[1:]:
        raise UsageError(f"tag {tag!r}: write the version as {version.public} (normalized, no "
                         "local label: PyPI refuses local versions)")
    return str(version)


def _default_opforge(text: str) -> str | None:
    """The ``opforge`` input's default in a reusable workflow's text (None: no such input)."""
    data = yaml.safe_load(text) or {}
    on = data.get("on", data.get(True)) or {}
    inputs = ((on.get("workflow_call") or {}) if isinstance(on, dict) else {}).get("inputs") or {}
    spec = inputs.get("opforge")
    return str(spec.get("default")) if isinstance(spec, dict) else None


def stamp(root: Path, tag: str, commit: str) -> str:
    """Write the tag's version and ``commit`` into ``root``'s ``opforge/_release.py``."""
    version = version_from_tag(tag)
    if not _COMMIT.match(commit):
        raise UsageError(f"--commit {commit!r}: give the full 40-hex commit the tag points to")
    wrong = []
    for rel in REUSABLE:
        path = root / rel
        if path.is_file():
            default = _default_opforge(path.read_text(encoding="utf-8"))
            if default is not None and default != f"opforge=={version}":
                wrong.append(f"{rel} ({default})")
    if wrong:
        raise OpforgeError(f"tag {tag}: the reusable workflows at this commit install another "
                           f"opforge by default: {', '.join(wrong)}; set their opforge input's "
                           f"default to opforge=={version}, commit, and tag that commit")
    path = root / RELEASE_FILE
    text = path.read_text(encoding="utf-8")
    new, count = re.subn(r'^VERSION = "[^"\n]*"$', f'VERSION = "{version}"', text, flags=re.M)
    new, count2 = re.subn(r'^WORKFLOWS_COMMIT = "[^"\n]*"$', f'WORKFLOWS_COMMIT = "{commit}"',
                          new, flags=re.M)
    if (count, count2) != (1, 1):
        raise OpforgeError(f"{path}: expected one VERSION and one WORKFLOWS_COMMIT line")

    write_atomic(path, new)
    return version


def _run(argv: list[str], what: str, timeout: float = 1800, **kw) -> str:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)
    if result.returncode != 0:
        tail = " | ".join((result.stdout + result.stderr).strip().splitlines()[-5:])
        raise OpforgeError(f"{what} failed (exit {result.returncode}): {tail}")
    return result.stdout


def build(root: Path, out: Path, python: str = sys.executable, *,
          isolated: bool = True) -> tuple[Path, Path]:
    """The sdist and the wheel of ``root`` in ``out`` (``python -m build``)."""
    out.mkdir(parents=True, exist_ok=True)
    for old in [*out.glob("*.whl"), *out.glob("*.tar.gz")]:
        old.unlink()
    _run([python, "-m", "build", "--sdist", "--wheel", "--outdir", str(out),
          *([] if isolated else ["--no-isolation"]), str(root)], "python -m build")
    sdists, wheels = sorted(out.glob("*.tar.gz")), sorted(out.glob("*.whl"))
    if len(sdists) != 1 or len(wheels) != 1:
        raise OpforgeError(f"the build left {len(sdists)} sdists and {len(wheels)} wheels in "
                           f"{out}, expected one of each")
    return sdists[0], wheels[0]


def check(paths: list[Path], python: str = sys.executable) -> None:
    """``twine check --strict``: the metadata PyPI will render and accept."""
    _run([python, "-m", "twine", "check", "--strict", *map(str, paths)], "twine check")


def try_installed(wheel: Path, env_dir: Path, version: str, commit: str) -> str:
    """Install ``wheel`` in a fresh environment and run the CLI there; its output."""
    python = create_venv(env_dir)
    install(python, str(wheel))
    binary = Path(python).parent / ("opforge.exe" if sys.platform == "win32" else "opforge")
    said = _run([str(binary), "--version"], "the installed opforge --version", timeout=120,
                cwd=env_dir).strip()
    if said != f"opforge {version}":
        raise OpforgeError(f"the installed wheel says {said!r}, expected 'opforge {version}'")
    stamped = _run([str(python), "-c", "from opforge import _release; "
                    "print(_release.WORKFLOWS_COMMIT)"], "reading the stamped commit",
                   timeout=120, cwd=env_dir).strip()
    if stamped != commit:
        raise OpforgeError(f"the installed wheel pins the workflows to {stamped!r}, expected "
                           f"{commit}")
    _run([str(binary), "matrix", "--help"], "the installed opforge matrix --help", timeout=120,
         cwd=env_dir)
    return said


def release(root: Path, tag: str, commit: str, out: Path, *, isolated: bool = True,
            log=print) -> tuple[Path, Path]:
    """Every local step of a release; the files to publish."""
    version = stamp(root, tag, commit)
    log(f"opforge release: stamped {RELEASE_FILE}: {version}, workflows at {commit}")
    sdist, wheel = build(root, out, isolated=isolated)
    log(f"opforge release: built {sdist.name} and {wheel.name}")
    check([sdist, wheel])
    log("opforge release: twine check --strict passed")
    said = try_installed(wheel, out.parent / f".{out.name}-try", version, commit)
    log(f"opforge release: a fresh environment with the wheel runs: {said}")
    return sdist, wheel


def main(argv: list[str] | None = None) -> int:
    """``nox -s release -- --tag vX.Y.Z --commit SHA [--out DIR]`` (run in the checkout)."""
    parser = argparse.ArgumentParser(prog="opforge release")
    parser.add_argument("--tag", required=True)
    parser.add_argument("--commit", required=True)
    parser.add_argument("--out", type=Path, default=Path("dist-release"))
    parser.add_argument("--root", type=Path, default=Path("."))
    args = parser.parse_args(argv)
    try:
        release(args.root, args.tag, args.commit, args.out)
    except OpforgeError as exc:
        print(f"opforge release: error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0
