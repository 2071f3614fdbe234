"""Bench rounds and bisect steps say where they are: plain lines in a log, none with -q."""

from __future__ import annotations

import re
import sys
from datetime import date

import pytest

from opforge import progress
from opforge.bench.target.bench import PROGRESS_PREFIX
from opforge.smoke.live import run_with_progress as _run_with_progress

ESCAPE = re.compile(r"[\x1b\r\x07\x08]")

# a target that times two rows and says something else on stderr, as a bench does
TARGET = f"""
import json, sys
for i, row in enumerate(["nms/small/forward/cpu", "nms/large/forward/cpu"]):
    print({PROGRESS_PREFIX!r} + json.dumps({{"done": i, "total": 2, "current": row}}),
          file=sys.stderr, flush=True)
print("UserWarning: something the package said", file=sys.stderr)
print({PROGRESS_PREFIX!r} + "not json", file=sys.stderr)
sys.exit(1)
"""


@pytest.fixture(autouse=True)
def log(monkeypatch):
    monkeypatch.setenv("CI", "1")
    progress.set_quiet(False)
    yield
    progress.set_quiet(False)


def test_bench_rows_are_lines_in_a_log_and_the_rest_of_stderr_is_kept(tmp_path, capsys):
    rc, stderr = _run_with_progress([sys.executable, "-c", TARGET], tmp_path, {}, 60,
                                    "bench: timing the workloads")
    err = capsys.readouterr().err
    assert rc == 1
    assert stderr.splitlines() == ["UserWarning: something the package said",
                                   PROGRESS_PREFIX + "not json"]
    lines = err.splitlines()
    assert [ln.split(" (")[0] for ln in lines[:-1]] == [
        "opforge: bench: timing the workloads: 0/2 rows nms/small/forward/cpu",
        "opforge: bench: timing the workloads: 1/2 rows nms/large/forward/cpu"]
    assert lines[-1].startswith("opforge: bench: timing the workloads (1/2 rows, ")
    assert not ESCAPE.search(err)


def test_a_target_past_its_time_is_stopped_and_said_as_such(tmp_path, capsys):
    rc, _ = _run_with_progress([sys.executable, "-c", "import time; time.sleep(60)"], tmp_path,
                               {}, 0.5, "bench: timing the workloads")
    assert rc is None
    assert capsys.readouterr().err == ""  # no line says it finished


def test_quiet_bench_says_nothing(tmp_path, capsys):
    progress.set_quiet(True)
    _run_with_progress([sys.executable, "-c", TARGET], tmp_path, {}, 60, "bench")
    assert capsys.readouterr().err == ""


def _record(nightly, outcome):
    from opforge.bisect.state import StepRecord

    return StepRecord(nightly=nightly, outcome=outcome, reason="exit 0", exit_code=0,
                      attempts=1, duration_s=1.5, sha256=None, git_version=None,
                      reused_env=False)


def _bisect_steps() -> None:
    from opforge.bisect.index import Nightly
    from opforge.bisect.report import Display
    from opforge.bisect.search import Outcome

    nightly = Nightly(date(2026, 1, 2), "2.14.0.dev20260102+cpu", "torch.whl", "file:///x")
    with Display() as display:
        display.left(3)
        display.start(nightly)
        display.step(nightly, "running the test")
        display.done(_record(nightly, Outcome.GOOD))


def test_bisect_steps_are_plain_lines_with_the_count_in_a_log(capsys):
    _bisect_steps()
    err = capsys.readouterr().err
    assert not ESCAPE.search(err)
    lines = [" ".join(ln.split()) for ln in err.splitlines()]
    assert lines[0] == "bisect: 2026-01-02: preparing the environment (0 done, ~3 left)"
    assert lines[1] == "bisect: 2026-01-02: running the test (0 done, ~3 left)"
    assert lines[2].endswith("(1.50 s, new env, 1 done, ~2 left)")


def test_quiet_bisect_shows_no_steps(capsys):
    progress.set_quiet(True)
    _bisect_steps()
    assert capsys.readouterr().err == ""

