"""Planted slowdowns, end to end through `opforge smoke --python` and `opforge bench --python`
on this interpreter (it has torch: no environment is created, one probe run each).

smoke: a device kernel 30x slower than the CPU fails with its op, device, both times and the
ratio; kernels only as fast as the CPU pass. The device is Meta (OPFORGE_SPEED_EXTRA_DEVICES),
whose kernels the planted extension makes slow (tests/smoke/planted.py has the table).
bench: a kernel 30x slower than its reference fails its row, one as fast passes, a reference
that disagrees fails before anything is timed; the JSON, Markdown summary and SVG chart too.
"""

from __future__ import annotations

import base64
import json
import re
import sys
import xml.etree.ElementTree as ET

import pytest
from planted import planted_env, write_planted

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
    return code, {c["id"]: c for c in doc["checks"] if c["category"] == "speed"}


@pytest.fixture(scope="module")
def bench(planted, tmp_path_factory):
    folder = tmp_path_factory.mktemp("bench")
    code = _run(planted, folder, "bench", "--budget", "0.1", "--json", str(folder / "b.json"),
                "--summary", str(folder / "summary.md"))
    doc = json.loads((folder / "b.json").read_text())
    return code, {r["op"]: r for r in doc["rows"]}, (folder / "summary.md").read_text()


def test_smoke_fails_a_device_kernel_30x_slower_than_the_cpu(smoke):
    code, checks = smoke
    check = checks["speed:slow_device:meta"]
    assert code == 1 and check["status"] == "fail", check
    assert check["op"] == "slow_device" and check["device"] == "meta"
    assert check["ratio"] > 10 and check["device_s"] > check["cpu_s"]  # the verdict is the ratio
    assert "x the CPU's time" in check["message"] and "more than the 10x allowed" in check["message"]


def test_smoke_passes_device_kernels_as_fast_as_the_cpu(smoke):
    _, checks = smoke
    for op in ("fair", "slow_cpu", "mismatch"):
        check = checks[f"speed:{op}:meta"]
        assert check["status"] == "pass" and check["ratio"] < 10, check


def test_bench_fails_a_kernel_30x_slower_than_its_reference(bench):
    code, rows, summary = bench
    row = rows["slow_cpu"]
    assert code == 1 and row["status"] == "fail", row
    assert row["speedup"] < 0.1 and "slower than the 0.1x allowed" in row["message"]
    assert row["ours_s"] > row["reference_s"] and row["rounds"] >= 5
    assert "❌" in summary


def test_bench_passes_kernels_as_fast_as_their_reference(bench):
    _, rows, _ = bench
    for op in ("fair", "slow_device"):
        row = rows[op]
        assert row["status"] == "pass" and 0.1 < row["speedup"] < 10, row
        assert row["workload"] == "small" and row["device"] == "cpu"
        assert row["reference"] == "reference" and row["direction"] == "forward"


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


DECLARED = """\
extension:
  path: .
  package: planted
  namespace: planted
  recipes: {recipes}
  ops: [fair, {{slow_device: {{max_slowdown: 100}}}}, slow_cpu, mismatch]
torch:
  channel: stable
  version: "2.13.0"
  index: https://download.pytorch.org/whl
pythons: ["3.11"]
platforms:
  linux-x86_64:
    runner: ubuntu-24.04
variants:
  - name: cpu
    platforms: [linux-x86_64]
    expected_keys: [CPU, Meta]
"""


def test_smoke_passes_a_device_kernel_the_matrix_declares_slower(planted, tmp_path):
    """The same 30x slower Meta kernel, declared in matrix.yaml (``max_slowdown: 100`` for
    that op, the declaration bench honours too): its speed check passes within 100x."""
    root, recipes = planted
    matrix = root / "declared.yaml"
    matrix.write_text(DECLARED.format(recipes=recipes.name))
    out = tmp_path / "doc.json"
    with pytest.MonkeyPatch.context() as mp:
        for name, value in planted_env(root).items():
            mp.setenv(name, value)
        mp.delenv("GITHUB_STEP_SUMMARY", raising=False)
        main(["smoke", "--python", sys.executable, "--file", str(matrix), "--json", str(out)])
    checks = {c["id"]: c for c in json.loads(out.read_text())["checks"]}
    check = checks["speed:slow_device:meta"]
    assert check["status"] == "pass" and check["factor"] == 100 and check["ratio"] > 10, check
    assert "within the 100x allowed" in check["message"]
    assert checks["speed:fair:meta"]["factor"] == 10  # the other ops keep the default
