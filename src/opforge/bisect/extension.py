"""The glue to the rest of opforge: build the checkout's extension, run the smoke test.

Kept in one module, imported only by the default and ``--wheel`` modes, so the ``-- CMD``
mode (and its tests) need neither a matrix nor a compiler.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

from opforge.build import build_wheel  # lazily: needs matrix.yaml and a compiler
from opforge.errors import OpforgeError
from opforge.matrix import find_matrix, load_matrix


def checkout_root(matrix: str | None = None) -> Path:
    """The checkout whose extension is built: where its matrix.yaml is (as `opforge build`):
    ``matrix`` (--file's), else the one ``find_matrix`` finds."""
    return (Path(matrix) if matrix else find_matrix()).parent


def checkout_revision(root: Path) -> str:
    """HEAD of the checkout, plus "-dirty" when it has local changes (then nothing is reused)."""
    def git(*args: str) -> str | None:
        result = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)
        return result.stdout.strip() if result.returncode == 0 else None

    head = git("rev-parse", "--short=12", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return head if dirty == "" else f"{head}-dirty"


def build_against(variant: str, env_python: Path, torch_version: str,
                  out_dir: Path, work_dir: Path, log, matrix: str | None = None) -> Path:
    """Build the checkout's wheel for ``variant`` inside the nightly's environment, with
    ``matrix`` (--file's; None: the one ``find_matrix`` finds), as ``opforge build --file``.

    Everything the build prints (pip, the compiler) goes to ``work_dir/build-output.log``,
    not over the progress display; a failure's message names that log.
    """
    work_dir.mkdir(parents=True, exist_ok=True)
    logfile = work_dir / "build-output.log"
    try:
        with output_to(logfile):
            # torch is already in the env (the pin is satisfied); "pypi" keeps the build tools
            # (setuptools, ninja, ...) coming from the default index, not the nightly one.
            return build_wheel(variant, matrix=load_matrix(matrix), python=str(env_python),
                               out_dir=out_dir, work_dir=work_dir,
                               torch_spec=f"torch=={torch_version}", torch_index="pypi",
                               log=log)
    except OpforgeError as exc:
        tail = logfile.read_text(encoding="utf-8", errors="replace")[-3000:]
        first = first_compile_error(work_dir)
        raise OpforgeError(f"the extension does not build against torch {torch_version}: "
                           f"{first or exc} (output: {logfile})\n{tail}") from None


_COMPILE_ERROR = re.compile(r"([^\s/]+:\d+(?::\d+)?: (?:fatal )?error: .*)")


def first_compile_error(work_dir: Path) -> str | None:
    """The compiler's first error line in the build's logs (what the report should name)."""
    for log in sorted(work_dir.glob("*.log")):
        try:
            text = log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        found = _COMPILE_ERROR.search(text)
        if found:
            return found.group(1).strip()[:240]
    return None


@contextlib.contextmanager
def output_to(logfile: Path):
    """Send this process's stdout and stderr (and its children's) to ``logfile``, at fd level."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(logfile, "ab") as out:
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def smoke_command(env_python: Path, variant: str, package: str | None = None,
                  matrix: str | None = None) -> list[str]:
    """``opforge smoke`` run on an existing environment (it writes its own report); the
    extension's package compared with ``matrix``'s (--file's, else the one found)."""
    cmd = [sys.executable, "-m", "opforge", "smoke", "--python", str(env_python),
           "--variant", variant]
    if package:
        cmd += ["--package", package]
        if package != load_matrix(matrix).extension.package:
            cmd += ["--namespace", package]  # another project's wheel: torchvision -> torchvision
    return cmd


def smoke_env(matrix: str | None = None) -> dict[str, str]:
    """The smoke run's environment: one report per nightly must not land in the job summary;
    ``matrix`` (--file's) is its $OPFORGE_MATRIX."""
    env = dict(os.environ)
    env.pop("GITHUB_STEP_SUMMARY", None)
    if matrix:
        env["OPFORGE_MATRIX"] = matrix
    return env


def wheel_package(wheel: Path) -> str | None:
    """The import name a wheel provides (its top-level package), for ``opforge smoke``."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            names = archive.namelist()
            for name in names:
                if name.endswith(".dist-info/top_level.txt"):
                    tops = archive.read(name).decode().split()
                    if tops:
                        return tops[0]
    except (OSError, zipfile.BadZipFile):
        return None
    tops = {n.split("/", 1)[0] for n in names if "/" in n and ".dist-info/" not in n
            and ".data/" not in n}
    return sorted(tops)[0] if len(tops) == 1 else None
