"""Speed protection on a machine with only a CPU, end to end through `opforge bench --python`
on this interpreter (its torch; no environment is created): a third-party pure-Python
``torch.library.custom_op`` package whose kernel is made N times slower by an environment
variable, as a regression would.

- ``--reference cpu``: each op's only reference is its own CPU kernel, so its rows are timed
  alone; ``--save`` records them and ``--against`` fails the slowed op, naming it and the factor
  (before: "0 timed, 0 failed, N skipped", exit 0).
- ``--baseline FILE`` (what the nightly canary runs): the first passing run becomes the
  baseline, a slowed run fails against it and leaves it untouched, saying so in one line.
- ``naive`` is 20x slower than its reference by design: matrix.yaml declares it
  (``max_slowdown: 40``) and it passes; without the declaration the 0.1x floor fails it.

An op timed alone is paired with a fixed plain-Python yardstick, so what is compared across
runs is a ratio from each run (its pace), which this shared machine's load moves little; the
planted slowdown (12x) is far beyond the 1.5x allowed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import opforge

pytest.importorskip("torch")

SLOWED = 12

PACKAGE = '''
import os

import torch

# op=N,op=N: run that op's work N times over (the same answer, N times slower)
SLOW = dict((op, int(n)) for op, n in
            (item.split("=") for item in os.environ.get("SLOWOPS_SLOW", "").split(",") if item))


def work(reps):
    total = 0
    for i in range(reps):
        total += i * i
    return total


@torch.library.custom_op("slowops::scale", mutates_args=())
def scale(x: torch.Tensor, reps: int) -> torch.Tensor:
    for _ in range(SLOW.get("scale", 1)):
        work(reps)
    return x * 2


@torch.library.custom_op("slowops::steady", mutates_args=())
def steady(x: torch.Tensor, reps: int) -> torch.Tensor:
    for _ in range(SLOW.get("steady", 1)):
        work(reps)
    return x * 2


@torch.library.custom_op("slowops::naive", mutates_args=())
def naive(x: torch.Tensor, reps: int) -> torch.Tensor:
    work(20 * reps)  # correct, and 20x slower than the reference: by design
    return x * 2
'''

RECIPES = '''
import torch


def inputs(dtype):
    return [torch.rand(64, generator=torch.Generator().manual_seed(0)).to(dtype), 3000]


def fast_reference(x, reps):
    total = 0
    for i in range(reps):
        total += i * i
    return x * 2


RECIPES = {
    "scale": {"inputs": inputs, "workloads": {"small": {"inputs": inputs}}},
    "steady": {"inputs": inputs, "workloads": {"small": {"inputs": inputs}}},
    "naive": {"inputs": inputs, "reference": fast_reference,
              "workloads": {"small": {"inputs": inputs}}},
}
'''

MATRIX = '''\
extension:
  path: .
  package: slowops
  namespace: slowops
  recipes: recipes.py
  ops: [scale, steady, {naive_entry}]
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
    expected_keys: [CPU]
'''


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("slowops")
    (root / "slowops").mkdir()
    (root / "slowops" / "__init__.py").write_text(textwrap.dedent(PACKAGE), encoding="utf-8")
    (root / "recipes.py").write_text(textwrap.dedent(RECIPES), encoding="utf-8")
    (root / "matrix.yaml").write_text(MATRIX.replace("{naive_entry}",
                                                     "{naive: {max_slowdown: 40}}"))
    (root / "undeclared.yaml").write_text(MATRIX.replace("{naive_entry}", "naive"))
    return root


def bench(project: Path, *argv: str, slow: str = "", matrix: str = "matrix.yaml"):
    src = str(Path(opforge.__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{project}", "SLOWOPS_SLOW": slow,
           "OPFORGE_CACHE_DIR": str(project / "cache")}
    env.pop("GITHUB_STEP_SUMMARY", None)
    out = project / "out.json"
    proc = subprocess.run([sys.executable, "-m", "opforge", "bench", "--python", sys.executable,
                           "--file", str(project / matrix), "--budget", "0.05", "--json",
                           str(out), *argv], capture_output=True, text=True, env=env,
                          cwd=project, timeout=300)
    rows = {r["op"]: r for r in json.loads(out.read_text())["rows"]} if out.is_file() else {}
    out.unlink(missing_ok=True)
    return proc.returncode, rows, proc.stdout + proc.stderr


def slower_by(output: str, op: str) -> float:
    found = re.search(rf"FAIL {op} small fwd on cpu: ([0-9.]+)x slower than baseline", output)
    assert found, output
    return float(found.group(1))


@pytest.fixture(scope="module")
def reference_cpu(project):
    """--reference cpu: save a run, then a run with scale slowed, --against it."""
    saved = bench(project, "--reference", "cpu", "--save", "base")
    slowed = bench(project, "--reference", "cpu", "--against", "base", "--save", "after",
                   slow=f"scale={SLOWED}")
    return saved, slowed


def test_reference_cpu_on_a_cpu_only_machine_times_each_op_alone(reference_cpu):
    code, rows, output = reference_cpu[0]
    assert code == 0, output
    assert set(rows) == {"scale", "steady", "naive"}
    for row in rows.values():
        assert row["status"] == "pass" and row["alone"] is True and row["ours_s"] > 0, row
        assert "speedup" not in row and row["rounds"] >= 5 and row["pace"] > 0
    assert "3 timed, 0 failed, 0 skipped" in output
    assert re.search(r"saved this run as baseline base \(.*base\.json\): 3 rows timed", output)


def test_a_slowed_kernel_fails_against_the_saved_run_naming_op_and_factor(reference_cpu):
    code, rows, output = reference_cpu[1]
    assert code == 1, output
    assert rows["scale"]["status"] == "fail" and rows["scale"]["baseline"]["by"] == "pace"
    assert slower_by(output, "scale") > SLOWED / 3
    assert "timed alone" in rows["scale"]["message"]


def test_save_of_a_failing_run_says_it_saved_nothing_and_why(project, reference_cpu):
    _, _, output = reference_cpu[1]
    line = [x for x in output.splitlines() if "not saved as baseline after" in x]
    assert len(line) == 1 and "scale/small/forward/cpu" in line[0], output
    assert "was not written" in line[0]
    assert not (project / "cache" / "bench" / "after.json").exists()


@pytest.fixture(scope="module")
def canary(project):
    """--baseline FILE twice, as the nightly canary runs it: a first night, a slowed night."""
    baseline = project / "canary" / "baseline.json"
    first = bench(project, "--baseline", str(baseline))
    recorded = baseline.read_bytes() if baseline.is_file() else None
    slowed = bench(project, "--baseline", str(baseline), "--against-label", "the first green "
                   "run", slow=f"scale={SLOWED}")
    return first, recorded, slowed, baseline


def test_the_first_green_run_becomes_the_baseline(canary):
    (code, rows, output), recorded, _, baseline = canary
    assert code == 0, output
    assert recorded is not None and json.loads(recorded)["kind"] == "bench"
    assert f"saved this run as the baseline ({baseline}): 3 rows timed" in output
    assert "does not exist yet: this run becomes the baseline if it passes" in output


def test_an_op_declared_slower_in_the_matrix_passes(canary):
    (_, rows, _), _, _, _ = canary
    naive = rows["naive"]
    assert naive["status"] == "pass" and naive["speedup"] < 0.1, naive
    assert naive["declared_slower"] is True and naive["min_speedup"] == pytest.approx(1 / 40)
    assert "as declared (matrix.yaml declares naive up to 40x slower)" in naive["message"]


def test_a_later_slower_night_fails_and_keeps_the_baseline(canary):
    _, recorded, (code, rows, output), baseline = canary
    assert code == 1, output
    assert slower_by(output, "scale") > SLOWED / 3
    assert "than baseline the first green run" in rows["scale"]["message"]
    assert baseline.read_bytes() == recorded
    assert f"kept the baseline {baseline} as it was" in output


def test_without_the_declaration_the_naive_op_fails_the_floor(project):
    code, rows, output = bench(project, "--ops", "naive", matrix="undeclared.yaml")
    assert code == 1, output
    assert rows["naive"]["status"] == "fail"
    assert "slower than the 0.1x allowed" in rows["naive"]["message"]
