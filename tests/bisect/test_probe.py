"""Exit codes to verdicts (git bisect run semantics), --match, --regress, timeouts."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest

from opforge.bisect.probe import Abort, Attempt, classify, run_command
from opforge.bisect.search import Outcome

G, B, S = Outcome.GOOD, Outcome.BAD, Outcome.SKIP


@pytest.mark.parametrize("code, outcome", [(0, G), (1, B), (2, B), (124, B), (125, S), (126, B),
                                           (127, B)])
def test_git_bisect_run_exit_codes(code, outcome):
    assert classify(Attempt(code, 0.1, "")).outcome is outcome


@pytest.mark.parametrize("code", [128, 130, 255, -9, -11])
def test_128_and_above_or_a_signal_abort(code):
    with pytest.raises(Abort, match="128 and above"):
        classify(Attempt(code, 0.1, ""))


def test_match_keeps_only_failures_with_the_signature():
    sig = re.compile("does not exist")
    assert classify(Attempt(1, 0, "operator opforge::nms does not exist"), match=sig).outcome is B
    unrelated = classify(Attempt(1, 0, "ImportError: libgomp.so.1"), match=sig)
    assert unrelated.outcome is S and "--match" in unrelated.reason
    assert classify(Attempt(0, 0, "fine"), match=sig).outcome is G


def test_regress_success_swaps_good_and_bad():
    assert classify(Attempt(0, 0, ""), regress="success").outcome is B
    assert classify(Attempt(1, 0, ""), regress="success").outcome is G
    assert classify(Attempt(125, 0, ""), regress="success").outcome is S


def test_timeout_is_a_failure_or_a_skip():
    assert classify(Attempt(None, 3, "")).outcome is B
    assert classify(Attempt(None, 3, ""), regress="success").outcome is G
    skipped = classify(Attempt(None, 3, ""), timeout_skip=True)
    assert skipped.outcome is S and "timed out" in skipped.reason


def test_timeout_kills_the_whole_process_group(tmp_path):
    pidfile = tmp_path / "child.pid"
    script = ("import os, subprocess, sys, time\n"
              "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
              f"open({str(pidfile)!r}, 'w').write(str(child.pid))\n"
              "print('started', flush=True)\n"
              "time.sleep(60)\n"
              "print('finished', flush=True)\n")
    attempt = run_command([sys.executable, "-c", script], None, timeout=5)
    # stopped at its timeout, not waited for: it never got to say it finished
    assert attempt.timed_out and "finished" not in attempt.output
    assert "started" in attempt.output
    status = Path(f"/proc/{pidfile.read_text()}/status")
    deadline = time.monotonic() + 5
    while status.exists() and "State:\tZ" not in status.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not status.exists() or "State:\tZ" in status.read_text(), "grandchild survived"


def test_output_is_stdout_and_stderr_together(tmp_path):
    attempt = run_command([sys.executable, "-c",
                           "import sys; print('out'); print('err', file=sys.stderr); sys.exit(4)"],
                          None, timeout=30)
    assert attempt.exit_code == 4
    assert "out" in attempt.output and "err" in attempt.output


def test_a_command_that_cannot_start_aborts():
    with pytest.raises(Abort, match="'no-such-command-xyz' cannot be run"):
        run_command(["no-such-command-xyz"], None, timeout=5)
