"""The speed verdicts, end to end through `opforge smoke --python` and `opforge bench --python`
on this interpreter (it has torch: no environment is created, one probe run each), on planted
kernels (tests/smoke/planted.py has the table).

smoke times a device kernel against the CPU (the device is Meta, OPFORGE_SPEED_EXTRA_DEVICES);
bench times each op against its reference, and a reference that disagrees fails before
anything is timed; the JSON, the Markdown summary and its SVG chart too.

No assertion rests on a measured time: each check and row must carry both times, and its
verdict must follow its own numbers by the documented rule (smoke: fail above the factor;
bench: fail below the floor beyond noise); a verdict that must come out one way is forced by
a limit no real timing reaches (``--min-speedup 1e9``, ``max_slowdown: 1000000000``), or taken
on injected numbers (``time_against_cpu`` with ``paired`` answering). How well real timings
catch the planted 30x kernels is ``benchmarks/bench_planted.py``'s to measure.
"""

from __future__ import annotations

import base64
import json
import math
import re
import sys
import xml.etree.ElementTree as ET

import pytest
from planted import planted_env, write_planted
from projectkit import matrix_yaml

from opforge.cli import main

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    return write_planted(tmp_path_factory.mktemp("planted"))


def _run(planted, tmp_path, *argv) -> int:
    root, recipes = planted
    with pytest.MonkeyPatch.context() as mp:
        for name, value in planted_env(root).items():
            mp.setenv(name, value)
        mp.delenv("GITHUB_STEP_SUMMARY", raising=False)
        return main([*argv, "--python", sys.executable, "--package", "planted", "--namespace",
                     "planted", "--recipes", str(recipes)])


@pytest.fixture(scope="module")
def smoke(planted, tmp_path_factory):
    out = tmp_path_factory.mktemp("smoke") / "doc.json"
    code = _run(planted, out.parent, "smoke", "--json", str(out))
    doc = json.loads(out.read_text())
    return code, {c["id"]: c for c in doc["checks"] if c["category"] == "speed"}, doc


@pytest.fixture(scope="module")
def bench(planted, tmp_path_factory):
    folder = tmp_path_factory.mktemp("bench")
    code = _run(planted, folder, "bench", "--budget", "0.1", "--json", str(folder / "b.json"),
                "--summary", str(folder / "summary.md"))
    doc = json.loads((folder / "b.json").read_text())
    return code, {r["op"]: r for r in doc["rows"]}, (folder / "summary.md").read_text()


def positive(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def test_smoke_times_each_device_kernel_against_the_cpu_and_judges_by_its_ratio(smoke):
    code, checks, doc = smoke
    assert set(checks) == {f"speed:{op}:meta" for op in ("fair", "slow_device", "slow_cpu",
                                                         "mismatch")}, checks
    for check in checks.values():
        assert check["device"] == "meta" and check["factor"] == 10, check
        assert positive(check["device_s"]) and positive(check["cpu_s"]), check
        assert positive(check["ratio"]), check
        slow = check["ratio"] > check["factor"]
        assert check["status"] == ("fail" if slow else "pass"), check
        # the message shows the ratio to 0.1, the JSON to 0.001 (each rounded on its own)
        said = re.search(r": ([0-9.]+)x the CPU's time \((more than|within) the 10x allowed; "
                         r"median of ", check["message"])
        assert said and check["message"].startswith(f"{check['op']} on meta: "), check
        assert abs(float(said.group(1)) - check["ratio"]) <= 0.051, check
        assert said.group(2) == ("more than" if slow else "within"), check
    if any(c["status"] == "fail" for c in checks.values()):
        assert code == 1


class _Report:
    def __init__(self):
        self.checks = []

    def check(self, check_id, category, status, message, **fields):
        self.checks.append({"id": check_id, "category": category, "status": status,
                            "message": message, **fields})


@pytest.mark.parametrize(("ratio", "status", "says"), [
    (30.0, "fail", "30.0x the CPU's time (more than the 10x allowed; median of 7 paired rounds)"),
    (9.5, "pass", "9.5x the CPU's time (within the 10x allowed; median of 7 paired rounds)"),
])
def test_smoke_fails_a_device_kernel_above_the_factor_on_injected_timings(monkeypatch, ratio,
                                                                          status, says):
    from types import SimpleNamespace

    from opforge.smoke.probe import checks

    monkeypatch.setattr(checks, "calls_per_block", lambda call, sync, target_s: 1)
    monkeypatch.setattr(checks, "paired", lambda a, b, budget_s: {
        "a_s": 1e-3, "b_s": ratio * 1e-3, "ratio": ratio, "spread": 0.0, "rounds": 7})
    runner = SimpleNamespace(t=None, report=_Report())
    checks.time_against_cpu(runner, "op", None, "meta", [], [], 10.0, "speed:op:meta")
    (check,) = runner.report.checks
    assert check["status"] == status and check["ratio"] == ratio and check["factor"] == 10
    assert check["message"] == f"op on meta: {ratio:.3g} ms per call, on cpu 1 ms: {says}"


def test_bench_rows_carry_both_sides_and_a_verdict_that_follows_their_numbers(bench):
    code, rows, summary = bench
    for op in ("fair", "slow_device", "slow_cpu"):
        row = rows[op]
        assert row["workload"] == "small" and row["device"] == "cpu", row
        assert row["reference"] == "reference" and row["direction"] == "forward", row
        assert all(positive(row[k]) for k in ("ours_s", "reference_s", "speedup")), row
        assert row["noise"] >= 0 and row["reference_noise"] >= 0 and row["rounds"] >= 5, row
        slow = row["speedup"] * (1 + row["noise"]) < 0.1
        assert row["status"] == ("fail" if slow else "pass"), row
        assert row["message"].startswith(f"{row['speedup']:.3g}x the reference's speed"), row
        assert ("slower than the 0.1x allowed" in row["message"]) == slow, row
    assert code == 1  # the mismatch fails whatever the timings
    assert "❌" in summary


def test_bench_fails_a_row_below_the_floor_naming_it(planted, tmp_path):
    out = tmp_path / "b.json"
    code = _run(planted, tmp_path, "bench", "--budget", "0.05", "--ops", "fair",
                "--min-speedup", "1e9", "--json", str(out))
    (row,) = json.loads(out.read_text())["rows"]
    assert code == 1 and row["status"] == "fail", row
    assert row["message"] == f"{row['speedup']:.3g}x the reference's speed: slower than the " \
                             "1e+09x allowed"


def test_bench_fails_a_reference_that_disagrees_before_timing(bench):
    _, rows, _ = bench
    row = rows["mismatch"]
    assert row["status"] == "fail" and "speedup" not in row
    assert "ours and the reference disagree" in row["message"]


def test_bench_summary_has_a_table_and_one_chart_per_timed_op(bench):
    _, _, summary = bench
    charts = re.findall(r"data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)", summary)
    assert len(charts) == 3  # fair, slow_device, slow_cpu: the mismatch was never timed
    for data in charts:
        svg = ET.fromstring(base64.b64decode(data))
        assert svg.tag.endswith("svg") and len(svg.findall("{*}rect")) == 1
    assert "| `fair` | small fwd | cpu | reference |" in summary




def test_smoke_passes_a_device_kernel_the_matrix_declares_slower(planted, tmp_path):
    """The planted 30x slower Meta kernel, declared in matrix.yaml (``max_slowdown`` for that
    op, the declaration bench honours too): its speed check takes that factor, which no real
    ratio reaches, and passes within it; the other ops keep the default."""
    root, recipes = planted
    matrix = root / "declared.yaml"
    matrix.write_text(matrix_yaml("planted", ["fair", {"slow_device": {"max_slowdown": 1000000000}},
                                              "slow_cpu", "mismatch"], recipes=recipes.name,
                                  expected_keys=("CPU", "Meta")))
    out = tmp_path / "doc.json"
    with pytest.MonkeyPatch.context() as mp:
        for name, value in planted_env(root).items():
            mp.setenv(name, value)
        mp.delenv("GITHUB_STEP_SUMMARY", raising=False)
        main(["smoke", "--python", sys.executable, "--file", str(matrix), "--json", str(out)])
    checks = {c["id"]: c for c in json.loads(out.read_text())["checks"]}
    check = checks["speed:slow_device:meta"]
    assert check["status"] == "pass" and check["factor"] == 1e9 and positive(check["ratio"])
    assert "within the 1e+09x allowed" in check["message"]
    assert checks["speed:fair:meta"]["factor"] == 10  # the other ops keep the default
