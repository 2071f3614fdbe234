"""A bisect loses nothing: bad commands leave the saved state alone, signals stop the whole
test command and are journaled, and --resume continues (real signals, real child processes)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ARGS = ("--good", "2024-06-01", "--bad", "2024-06-10")


def _events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status  # a zombie waiting for init to reap it is dead


def _interrupted_bisect(bisector, tmp_path, signum) -> int:
    """A bisect stopped by ``signum`` while its third probe (and that probe's child) runs."""
    marker = tmp_path / "child.pid"
    bisector.env.update(PROBE_MODE="bad_from:20240605", HANG_AT="20240604",
                        HANG_ONCE=str(marker))
    proc = bisector.start(*ARGS)
    deadline = time.monotonic() + 90
    while not marker.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the probe never started its child"
        time.sleep(0.05)
    child = int(marker.read_text())
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signum, err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == \
        f"opforge bisect: interrupted ({signal.Signals(signum).name})"
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child), "the test command's child outlived the bisect"
    return child


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_signal_stops_the_probe_group_journals_it_and_resume_continues(bisector, tmp_path,
                                                                        signum):
    _interrupted_bisect(bisector, tmp_path, signum)
    log = bisector.state.with_suffix(".log.jsonl")
    last = _events(log)[-1]
    assert last["event"] == "interrupted" and last["signal"] == signal.Signals(signum).name
    assert last["steps_done"] == 2
    saved = json.loads(bisector.state.read_text())
    assert saved["stopped"] == "interrupted" and len(saved["steps"]) == 2

    before = bisector.probed()
    assert before == ["2024-06-10", "2024-06-01", "2024-06-04"]
    resumed = bisector(*ARGS, "--resume", "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.json()["first_bad"]["date"] == "2024-06-05"
    again = bisector.probed()[len(before):]
    assert again[0] == "2024-06-04"  # the step that was cut off, then only new ones
    assert not {"2024-06-10", "2024-06-01"} & set(again)


# even with --restart, the state is replaced only once the new bisect has checked its inputs,
# its endpoints and run its first step
@pytest.mark.parametrize("argv, code, words", [
    (("--good", "2024-06-09", "--bad", "2024-06-02", "--restart"), 2, "must be older than"),
    (("--good", "2024-06-06", "--bad", "2024-06-10", "--restart"), 2, "no nightly for that date"),
    (("--good", "2024-06-01", "--bad", "2999-01-01", "--restart"), 2, "in the future"),
    ((*ARGS, "--timeout", "nan", "--restart"), 2, "--timeout nan"),
    ((*ARGS, "--restart", "--resume"), 2, "pick one"),
    (ARGS, 2, "holds an interrupted bisect"),   # the same bisect again, neither flag
])
def test_a_failed_new_bisect_leaves_the_interrupted_state_alone(bisector, tmp_path, argv, code,
                                                               words):
    _interrupted_bisect(bisector, tmp_path, signal.SIGTERM)
    log = bisector.state.with_suffix(".log.jsonl")
    state_before, log_before = bisector.state.read_bytes(), log.read_bytes()
    run = bisector(*argv)
    assert run.returncode == code
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in run.stderr, lines
    if "interrupted bisect" in words:
        assert "--resume" in lines[0] and "--restart" in lines[0]
    assert bisector.state.read_bytes() == state_before
    assert log.read_bytes() == log_before
    resumed = bisector(*ARGS, "--resume", "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.json()["first_bad"]["date"] == "2024-06-05"


def test_restart_replaces_the_interrupted_state_once_the_new_bisect_runs(bisector, tmp_path):
    _interrupted_bisect(bisector, tmp_path, signal.SIGTERM)
    run = bisector("--good", "2024-06-02", "--bad", "2024-06-08", "--restart", "--json")
    assert run.returncode == 0, run.stderr
    assert json.loads(bisector.state.read_text())["params"]["good"] == "2024-06-02"
    assert "replacing the state" in run.stderr


def test_a_command_that_cannot_start_is_a_usage_error_and_writes_no_state(bisector):
    run = bisector(*ARGS, command=["/nonexistent/test-command"])
    assert run.returncode == 2
    assert run.stderr.strip().splitlines()[-1].startswith(
        "opforge bisect: error: the test command '/nonexistent/test-command' cannot be run")
    assert not bisector.state.exists()


@pytest.mark.parametrize("option", ["--state", "--log", "--json", "--markdown"])
def test_report_destinations_are_checked_before_any_probe(bisector, tmp_path, option):
    blocker = tmp_path / "a-file"
    blocker.write_text("mine")
    run = bisector(*ARGS, option, str(blocker / "report.json"))
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        f"opforge bisect: error: {option} {blocker / 'report.json'}: {blocker} is not a directory"]
    assert bisector.probed() == []
    assert blocker.read_text() == "mine"
    run = bisector(*ARGS, option, str(tmp_path))
    assert run.returncode == 2 and "is a directory" in run.stderr
    assert bisector.probed() == []


def test_state_of_the_wrong_shape_is_refused_on_resume_and_kept(bisector):
    for text in ("[]", '{"schema": 1}', '{"schema": 1, "params": 3, "listed": [], "steps": []}',
                 "\xff", "", '{"schema": 1, "params": {}, "listed": {}, "steps": []}'):
        bisector.state.write_bytes(text.encode("latin-1"))
        run = bisector("--resume")
        assert run.returncode == 2, run.stderr
        assert len(run.stderr.strip().splitlines()) == 1 and "--restart" in run.stderr
        again = bisector(*ARGS)
        assert again.returncode == 2 and "--restart" in again.stderr
        assert bisector.state.read_bytes() == text.encode("latin-1")
    os.unlink(bisector.state)
