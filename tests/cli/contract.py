"""The bad-input contract, as one assertion the generative tests apply to every case.

``check(argv, codes)`` runs ``opforge ARGV`` in-process (``opforge.cli.main``, the console
script's function) and asserts what a user is promised: an exit code from ``codes`` (each a
documented one), never a traceback, exactly one line on stderr when the input is refused
(``opforge <command>: error: ...``), finished within a time bound, and no file under the
watched folders changed, added or removed when the input was refused. ``PATH_KINDS`` makes
every kind of path a user can hand over: missing, a directory, a FIFO, a symlink loop, a
dangling symlink, a path under a regular file, a character device, an unwritable place, a name
too long.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import stat
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

from hypothesis import HealthCheck, settings

from opforge.cli import main
from opforge.errors import EXIT_CODES

# CI runs a fixed profile: derandomized (the same cases every run) and bounded (a few minutes
# in all). OPFORGE_CONTRACT_SCALE=10 multiplies every example count for a deeper local run;
# OPFORGE_CONTRACT_RANDOM=1 draws new cases instead of the fixed ones.
SCALE = max(1, int(os.environ.get("OPFORGE_CONTRACT_SCALE", "1")))
settings.register_profile(
    "contract", derandomize=not os.environ.get("OPFORGE_CONTRACT_RANDOM"), database=None,
    deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.filter_too_much, HealthCheck.large_base_example])


def examples(n: int) -> settings:
    """The contract profile with ``n`` examples (times OPFORGE_CONTRACT_SCALE)."""
    return settings(settings.get_profile("contract"), max_examples=n * SCALE)

DOCUMENTED = {code for code, _ in EXIT_CODES}
TIME_BOUND_S = 20.0   # in-process cases take milliseconds; a hang or a bomb takes far longer

# cases and seconds per subcommand, printed at the end of the run (conftest.py)
CASES: Counter[str] = Counter()
SECONDS: defaultdict[str, float] = defaultdict(float)
CODES: defaultdict[str, Counter[int]] = defaultdict(Counter)


@dataclass
class Result:
    code: int
    out: str
    err: str
    seconds: float


def snapshot(*roots: Path) -> dict[str, tuple]:
    """Every entry under ``roots``: its type, and a regular file's bytes and mode."""
    seen: dict[str, tuple] = {}
    for root in roots:
        for folder, dirs, files in os.walk(root, followlinks=False):
            for name in dirs + files:
                path = os.path.join(folder, name)
                info = os.lstat(path)
                if stat.S_ISREG(info.st_mode):
                    with open(path, "rb") as fh:
                        seen[path] = ("file", info.st_mode, fh.read())
                elif stat.S_ISLNK(info.st_mode):
                    seen[path] = ("link", os.readlink(path))
                else:
                    seen[path] = (stat.S_IFMT(info.st_mode), info.st_mode)
    return seen


# every case runs in this scratch folder: relative paths in generated arguments land here,
# never in the checkout (it is watched like the inputs, and emptied after a case that may
# write)
CWD = Path(tempfile.mkdtemp(prefix="opforge-contract-cwd-"))


def run(argv: list[str]) -> Result:
    out, err = io.StringIO(), io.StringIO()
    here = os.getcwd()
    start = time.monotonic()
    os.chdir(CWD)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
    finally:
        os.chdir(here)
    return Result(code, out.getvalue(), err.getvalue(), time.monotonic() - start)


def check(argv: list[str], codes: set[int], *, watch: tuple[Path, ...] = (),
          changes_allowed: bool = False) -> Result:
    """Run one case and assert the contract; returns the result for further checks."""
    assert codes <= DOCUMENTED, codes - DOCUMENTED
    command = argv[0]
    watch = (*watch, CWD)
    before = snapshot(*watch)
    result = run(argv)
    CASES[command] += 1
    SECONDS[command] += result.seconds
    CODES[command][result.code] += 1
    context = f"opforge {' '.join(map(repr, argv))} -> {result.code}\nstderr: {result.err!r}"
    assert "Traceback" not in result.err and "Traceback" not in result.out, context
    assert result.code in codes, context
    assert result.seconds < TIME_BOUND_S, context
    if result.code == 2:
        lines = result.err.strip("\n").splitlines()
        assert len(lines) == 1, context
        assert lines[0].startswith(f"opforge {command}: error: "), context
    if result.code == 2 or not changes_allowed:
        assert snapshot(*watch) == before, f"files changed\n{context}"
    for entry in CWD.iterdir():  # what an accepted case wrote, for the next case
        shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    return result


# -- paths of every kind ---------------------------------------------------------------------

PATH_KINDS = ("missing", "directory", "fifo", "symlink-loop", "dangling-symlink",
              "under-a-file", "char-device", "unwritable", "long-name", "empty-file")


def make_path(kind: str, base: Path, name: str = "target") -> Path:
    """A path of ``kind`` inside ``base`` (made fresh; ``base`` must exist)."""
    path = base / name
    if kind == "missing":
        return base / "no-such-folder" / name
    if kind == "directory":
        path.mkdir(exist_ok=True)
    elif kind == "fifo":
        if not path.exists():
            os.mkfifo(path)
    elif kind == "symlink-loop":
        if not path.is_symlink():
            os.symlink(path.name, path)   # points at itself
    elif kind == "dangling-symlink":
        if not path.is_symlink():
            os.symlink(base / "nothing-here", path)
    elif kind == "under-a-file":
        blocker = base / f"{name}-file"
        blocker.write_text("a regular file\n")
        return blocker / name
    elif kind == "char-device":
        return Path(os.devnull)
    elif kind == "unwritable":
        if os.geteuid() == 0 or sys.platform != "linux":
            # root writes anywhere a mode allows nothing; /proc refuses new files to everyone
            return Path("/proc") / f"opforge-contract-{name}"
        folder = base / "read-only"
        folder.mkdir(exist_ok=True)
        folder.chmod(0o500)
        return folder / name
    elif kind == "long-name":
        return base / ("x" * 300)
    elif kind == "empty-file":
        path.write_bytes(b"")
    return path
