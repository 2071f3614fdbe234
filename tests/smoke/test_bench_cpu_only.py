"""Speed protection on a machine with only a CPU, end to end through `opforge bench --python`
on this interpreter (its torch; no environment is created), on a third-party pure-Python
``torch.library.custom_op`` package.

- ``--reference cpu``: each op's only reference is its own CPU kernel, so its rows are timed
  alone; ``--save`` records them and ``--against`` fails an op that is slower than the saved
  run, naming it and the factor (before: "0 timed, 0 failed, N skipped", exit 0).
- ``--baseline FILE`` (what the nightly canary runs): the first passing run becomes the
  baseline, a slower run fails against it and leaves it untouched, saying so in one line.
- ``naive`` is slower than its reference by design: matrix.yaml declares it and it passes;
  without the declaration the floor fails it.

No assertion rests on a measured time. The slower run is made by the baseline, not by the
clock: the saved row of ``scale`` is edited to a time a million times shorter (and a pace a
million times higher), which no real run can come back to; the floors are set where no real
speed-up can reach (``--min-speedup 1e9``, ``max_slowdown: 1000000000``). How well real
timings catch a real slowdown is ``benchmarks/bench_planted.py``'s to measure; the comparison's
rules on chosen numbers are ``test_bench_baseline.py``'s.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from projectkit import write_project

import opforge

pytest.importorskip("torch")

FASTER = 1e6  # how much faster the edited baseline says scale was

PACKAGE = '''
import torch

def work(reps):
    total = 0
    for i in range(reps):
        total += i * i
    return total


@torch.library.custom_op("slowops::scale", mutates_args=())
def scale(x: torch.Tensor, reps: int) -> torch.Tensor:
    work(reps)
    return x * 2


@torch.library.custom_op("slowops::steady", mutates_args=())
def steady(x: torch.Tensor, reps: int) -> torch.Tensor:
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



@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("slowops")
    write_project(root, "slowops", PACKAGE, ["scale", "steady",
                                              {"naive": {"max_slowdown": 1000000000}}],
                  recipes=RECIPES)
    write_project(root, "slowops", PACKAGE, ["scale", "steady", "naive"], recipes=RECIPES,
                  matrix="undeclared.yaml")
    return root


def bench(project: Path, *argv: str, matrix: str = "matrix.yaml"):
    src = str(Path(opforge.__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{project}",
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


def positive(value) -> bool:
    return isinstance(value, float) and math.isfinite(value) and value > 0


def make_faster(path: Path, op: str) -> bytes:
    """Edit the baseline at ``path``: ``op``'s saved time FASTER times shorter, its pace or
    speed-up as much higher (the other side as saved); the file's new bytes."""
    doc = json.loads(path.read_text())
    for row in doc["rows"]:
        if row["op"] == op:
            row["ours_s"] /= FASTER
            row["pace" if row.get("alone") else "speedup"] *= FASTER
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path.read_bytes()


def says_slower(output: str, row: dict, name: str) -> None:
    """The row failed on our own time, and its FAIL line names the factor it was judged by."""
    factor = row["baseline"]["ours_change"]
    assert row["status"] == "fail" and row["baseline"]["verdict"] == "fail", row
    assert positive(factor) and factor > 1, row
    assert (f"FAIL {row['op']} small fwd on cpu: {factor:.2f}x slower than baseline {name} ("
            in output), output


@pytest.fixture(scope="module")
def reference_cpu(project):
    """--reference cpu: save a run, make its scale impossibly fast, then a run --against it."""
    saved = bench(project, "--reference", "cpu", "--save", "base")
    make_faster(project / "cache" / "bench" / "base.json", "scale")
    slowed = bench(project, "--reference", "cpu", "--against", "base", "--save", "after")
    return saved, slowed


def test_reference_cpu_on_a_cpu_only_machine_times_each_op_alone(reference_cpu):
    code, rows, output = reference_cpu[0]
    assert code == 0, output
    assert set(rows) == {"scale", "steady", "naive"}
    for row in rows.values():
        assert row["status"] == "pass" and row["alone"] is True, row
        assert "speedup" not in row and row["rounds"] >= 5
        assert all(positive(row[k]) for k in ("ours_s", "yardstick_s", "pace")), row
        assert all(row[k] >= 0 for k in ("noise", "yardstick_noise")), row
    assert "3 timed, 0 failed, 0 skipped" in output
    assert re.search(r"saved this run as baseline base \(.*base\.json\): 3 rows timed", output)


def test_a_kernel_slower_than_the_saved_run_fails_naming_op_and_factor(reference_cpu):
    code, rows, output = reference_cpu[1]
    assert code == 1, output
    scale = rows["scale"]
    assert scale["baseline"]["by"] == "pace" and "ours" in scale["baseline"]["moved"]
    says_slower(output, scale, "base")
    assert "; ours " in scale["message"] and "yardstick" in scale["message"]
    assert "pace against the yardstick" in scale["message"]


def test_save_of_a_failing_run_says_it_saved_nothing_and_why(project, reference_cpu):
    _, _, output = reference_cpu[1]
    line = [x for x in output.splitlines() if "not saved as baseline after" in x]
    assert len(line) == 1 and "scale/small/forward/cpu" in line[0], output
    assert "was not written" in line[0]
    assert not (project / "cache" / "bench" / "after.json").exists()


@pytest.fixture(scope="module")
def canary(project):
    """--baseline FILE twice, as the nightly canary runs it: a first night (floors no real
    speed-up reaches: naive passes as declared), then, against a baseline whose scale is made
    impossibly fast, a second night."""
    baseline = project / "canary" / "baseline.json"
    first = bench(project, "--baseline", str(baseline), "--min-speedup", "1e9")
    written = json.loads(baseline.read_bytes()) if baseline.is_file() else None
    recorded = make_faster(baseline, "scale") if baseline.is_file() else None
    slowed = bench(project, "--baseline", str(baseline), "--against-label", "the first green "
                   "run")
    return first, written, recorded, slowed, baseline


def test_the_first_green_run_becomes_the_baseline(canary):
    (code, rows, output), written, _, _, baseline = canary
    assert code == 0, output
    assert written is not None and written["kind"] == "bench"
    assert {r["op"] for r in written["rows"]} == {"scale", "steady", "naive"}
    naive = next(r for r in written["rows"] if r["op"] == "naive")
    assert positive(naive["reference_s"]) and naive["reference_noise"] >= 0  # both sides kept
    assert f"saved this run as the baseline ({baseline}): 3 rows timed" in output
    assert "does not exist yet: this run becomes the baseline if it passes" in output


def test_an_op_declared_slower_in_the_matrix_passes(canary):
    (_, rows, _), _, _, _, _ = canary
    naive = rows["naive"]
    assert naive["status"] == "pass" and positive(naive["speedup"]), naive
    assert naive["declared_slower"] is True and naive["min_speedup"] == pytest.approx(1e-9)
    assert naive["message"].endswith("slower than 1e+09x, as declared (matrix.yaml declares "
                                     "naive up to 1e+09x slower)")


def test_a_later_slower_night_fails_and_keeps_the_baseline(canary):
    _, _, recorded, (code, rows, output), baseline = canary
    assert code == 1, output
    says_slower(output, rows["scale"], "the first green run")
    assert baseline.read_bytes() == recorded
    assert f"kept the baseline {baseline} as it was" in output


def test_without_the_declaration_the_naive_op_fails_the_floor(project):
    code, rows, output = bench(project, "--ops", "naive", "--min-speedup", "1e9",
                               matrix="undeclared.yaml")
    assert code == 1, output
    assert rows["naive"]["status"] == "fail"
    assert "slower than the 1e+09x allowed" in rows["naive"]["message"]
