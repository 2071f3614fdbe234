"""Running the test on one nightly and turning its exit into good / bad / skip.

Exit codes follow ``git bisect run``: 0 passes, 125 cannot be tested (skip), 1-127 fails,
128 and above (and death by a signal) abort the bisect. ``--match`` keeps a failure only
when its output carries the regression's signature; other failures become skips.
``--regress success`` swaps what "bad" means: the search looks for where it started to pass.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .search import Outcome

SKIP_CODE = 125
TAIL_CHARS = 4000
_MATCH_LIMIT = 8 << 20  # the --match regex sees at most the last 8 MiB of output


@dataclass(frozen=True)
class Attempt:
    exit_code: int | None   # None: timed out
    duration_s: float
    output: str

    @property
    def timed_out(self) -> bool:
        return self.exit_code is None

    @property
    def tail(self) -> str:
        return self.output[-TAIL_CHARS:]


class Abort(Exception):
    """The probe asked to stop the bisect (exit >= 128, or killed by a signal)."""


class CannotStart(Abort):
    """The test command could not be started at all (no such program, not executable)."""


@dataclass(frozen=True)
class Verdict:
    outcome: Outcome
    reason: str        # one line a user reads in the progress and the report
    passed: bool | None  # the raw result (None: neither, a skip)


def run_command(cmd: Sequence[str], env: dict[str, str] | None, timeout: float | None,
                cwd: Path | None = None) -> Attempt:
    """Run ``cmd`` with stdout and stderr together; kill its whole process group on timeout."""
    start = time.monotonic()
    with tempfile.TemporaryFile() as out:
        try:
            proc = subprocess.Popen(list(cmd), stdout=out, stderr=subprocess.STDOUT, env=env,
                                    cwd=cwd, stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError as exc:
            # a command that cannot start is not a verdict on the nightly: git bisect aborts too
            raise CannotStart(f"{cmd[0]!r} cannot be run: {exc.strerror or exc}") from None
        try:
            code: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            code = None
        except BaseException:
            _kill_group(proc)
            raise
        out.seek(0, os.SEEK_END)
        size = out.tell()
        out.seek(max(0, size - _MATCH_LIMIT))
        text = out.read().decode("utf-8", "replace")
    return Attempt(code, time.monotonic() - start, text)


def _kill_group(proc: subprocess.Popen) -> None:
    # the probe runs in its own session: killing the group takes its children too
    if hasattr(os, "killpg"):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            proc.kill()
    else:
        proc.kill()
    proc.wait()


def classify(attempt: Attempt, *, match: re.Pattern[str] | None = None,
             regress: str = "failure", timeout_skip: bool = False) -> Verdict:
    """good / bad / skip for one attempt; raises Abort for exit codes git bisect aborts on."""
    code = attempt.exit_code
    if code is None:
        if timeout_skip:
            return Verdict(Outcome.SKIP, f"timed out after {attempt.duration_s:.0f} s (skipped)", None)
        passed, reason = False, f"timed out after {attempt.duration_s:.0f} s"
    elif code < 0 or code >= 128:
        name = _signal_name(-code if code < 0 else code - 128)
        raise Abort(f"the test command exited with {code}{name}; git bisect run semantics stop "
                    "the bisect on 128 and above (exit 1 to mark a nightly bad, 125 to skip it)")
    elif code == SKIP_CODE:
        return Verdict(Outcome.SKIP, "exit 125 (cannot be tested)", None)
    elif code == 0:
        passed, reason = True, "exit 0"
    else:
        passed, reason = False, f"exit {code}"
        if match is not None and not match.search(attempt.output):
            return Verdict(Outcome.SKIP, f"exit {code} without the --match signature "
                           f"{match.pattern!r} (skipped as unrelated)", False)
    bad = (not passed) if regress == "failure" else passed
    return Verdict(Outcome.BAD if bad else Outcome.GOOD, reason, passed)


def _signal_name(number: int) -> str:
    try:
        return f" ({signal.Signals(number).name})"
    except ValueError:
        return ""
