"""``opforge bisect --slower-than``: the real CLI on a fake nightly index whose wheels differ
only in speed (fake_speed.py), real venvs, real workload servers, paired timing.

The planted slowdown is 30x (from 2024-06-06 on) and the threshold 5x, so the verdicts never
rest on a small difference; the ``steady`` op runs as fast on every nightly and must never be
named.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fake_speed import SLOW_FROM, build_speed_index

import opforge
from opforge.bisect.search import Outcome
from opforge.bisect.speed import RowTiming, verdict

SRC = str(Path(opforge.__file__).resolve().parent.parent)


@pytest.fixture(scope="module")
def speed_index(tmp_path_factory):
    return build_speed_index(tmp_path_factory.mktemp("speed-nightlies"))


def bisect(speed_index, tmp_path, *args, env=None, timeout=600):
    environ = {**os.environ, "OPFORGE_CACHE_DIR": str(tmp_path / "cache"),
               "PYTHONPATH": SRC, "COLUMNS": "200", **(env or {})}
    argv = [sys.executable, "-m", "opforge", "bisect", "--index", str(speed_index.root),
            "--wheel", str(speed_index.wheel), "--state", str(tmp_path / "state.json"), *args]
    return subprocess.run(argv, capture_output=True, text=True, env=environ,
                          cwd=speed_index.project, timeout=timeout)


@pytest.mark.slow
def test_speed_bisect_names_the_first_slow_nightly_and_both_timings(speed_index, tmp_path):
    run = bisect(speed_index, tmp_path, "--good", "2024-06-01", "--bad", "2024-06-10",
                 "--slower-than", "5", "--json", str(tmp_path / "out.json"))
    assert run.returncode == 0, run.stderr
    data = json.loads((tmp_path / "out.json").read_text())
    assert data["first_bad"]["date"] == SLOW_FROM.isoformat()
    assert data["last_good"]["date"] == "2024-06-05"
    assert data["exact"] and data["skipped"] == []
    boundary = data["speed"]["boundary"]
    assert (boundary["last_good"], boundary["first_bad"]) == ("2024-06-05", "2024-06-06")
    # only the workload that slowed is named; the steady op, as fast everywhere, is not
    assert [row["workload"] for row in boundary["rows"]] == ["scale/small/forward/cpu"]
    row = boundary["rows"][0]
    # both timings at the boundary, re-measured for the report: reported, never judged here
    assert row["first_bad_s"] > 0 and row["last_good_s"] > 0 and row["ratio"] > 0
    assert "--slower-than 5" in data["rerun"]
    # the report says both timings at the boundary
    assert "scale/small/forward/cpu:" in run.stdout and "on 2024-06-05 ->" in run.stdout
    # every probed nightly's verdict follows the planted dates
    steps = json.loads((tmp_path / "state.json").read_text())["steps"]
    assert len(steps) >= 4
    for step in steps:
        day = step["nightly"]["date"]
        assert step["outcome"] == ("bad" if day >= SLOW_FROM.isoformat() else "good"), step


@pytest.mark.slow
def test_nightlies_only_as_fast_are_not_flagged(speed_index, tmp_path):
    run = bisect(speed_index, tmp_path, "--good", "2024-06-01", "--bad", "2024-06-05",
                 "--slower-than", "5")
    assert run.returncode == 1
    assert "is not bad: nothing to bisect" in run.stderr
    assert "2024-06-05" in run.stderr and "not slower than 5x" in run.stderr


@pytest.mark.parametrize("ratio", ["0", "-2", "1", "abc", "nan", "inf"])
def test_a_ratio_that_is_not_a_factor_above_one_is_one_line_exit_2(speed_index, tmp_path,
                                                                    ratio):
    run = bisect(speed_index, tmp_path, "--good", "2024-06-01", f"--slower-than={ratio}",
                 timeout=60)
    assert run.returncode == 2
    assert run.stderr.count("\n") == 1 and "--slower-than" in run.stderr
    assert "Traceback" not in run.stderr
    assert not (tmp_path / "state.json").exists() and not (tmp_path / "cache").exists()


@pytest.mark.parametrize("args, message", [
    (["--bad", "2024-06-10"], "--slower-than needs --good"),
    (["--good", "2024-06-01", "--match", "x"], "--match does not apply"),
    (["--good", "2024-06-01", "--", "true"], "takes no test command"),
])
def test_speed_options_that_do_not_fit_are_one_line_exit_2(speed_index, tmp_path, args,
                                                          message):
    run = bisect(speed_index, tmp_path, "--slower-than", "2", *args, timeout=60)
    assert run.returncode == 2 and message in run.stderr, run.stderr
    assert run.stderr.count("\n") == 1 and not (tmp_path / "state.json").exists()


@pytest.mark.slow
def test_a_workload_whose_recipe_raises_is_one_line_exit_2(speed_index, tmp_path):
    run = bisect(speed_index, tmp_path, "--good", "2024-06-01", "--bad", "2024-06-10",
                 "--slower-than", "5", env={"SPEEDOPS_RECIPE_RAISES": "1"}, timeout=120)
    assert run.returncode == 2, run.stderr
    # the good nightly's environment is made first (progress lines); then one error line
    errors = [line for line in run.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and errors[0] == run.stderr.splitlines()[-1]
    assert "the recipe is broken on purpose" in errors[0] and "recipes.py:6" in errors[0]
    assert "Traceback" not in run.stderr
    assert not (tmp_path / "state.json").exists()


def timing(ratio, noise=0.05, spread=0.05, key="op/small/forward/cpu"):
    return RowTiming(key, ratio, 1e-3, ratio * 1e-3, spread, 5, noise)


def test_verdict_clearly_slower_is_bad_clearly_not_is_good():
    assert verdict([timing(1.0), timing(30.0, key="b")], 5)[0] is Outcome.BAD
    assert verdict([timing(1.0), timing(2.0, key="b")], 5)[0] is Outcome.GOOD


def test_verdict_within_noise_of_the_threshold_is_a_skip_not_a_guess():
    # 5.5x against a 5x threshold with 20% noise: neither clearly slower nor clearly not
    outcome, reason = verdict([timing(5.5, noise=0.2)], 5)
    assert outcome is Outcome.SKIP and "within noise" in reason
    assert verdict([], 5)[0] is Outcome.SKIP
