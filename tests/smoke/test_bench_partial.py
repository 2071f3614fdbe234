"""A bench that stops part-way still leaves a valid JSON report: the rows it finished, the rows
it did not (``missing``), ``complete: false`` and why it stopped.

The second op's workload stops the run on purpose (tests/smoke/planted.py's extension, this
interpreter's torch): the probe killed (SIGKILL: no chance to write anything more), the probe
interrupted (SIGINT inside it), and ``opforge bench`` itself interrupted (SIGINT to the CLI
while the probe runs, as Ctrl-C or a cancelled CI job does).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from planted import RECIPES, planted_env, write_planted

import opforge

pytest.importorskip("torch")

STOP = '''
import os, signal


def stop_inputs(dtype):
    os.kill(os.getppid() if os.environ["STOP_WHO"] == "parent" else os.getpid(),
            getattr(signal, os.environ["STOP_WITH"]))
    import time
    time.sleep(30)  # the signal arrives meanwhile
    return inputs(dtype)


RECIPES = {"fair": recipe(reference),
           "slow_cpu": {"inputs": inputs, "reference": reference,
                        "workloads": {"small": {"inputs": stop_inputs}}}}
'''


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    root, _ = write_planted(tmp_path_factory.mktemp("planted"))
    recipes = root / "stop_recipes.py"
    recipes.write_text(RECIPES + STOP, encoding="utf-8")
    return root, recipes


def run_bench(planted, tmp_path: Path, who: str, signal_name: str):
    root, recipes = planted
    src = str(Path(opforge.__file__).resolve().parent.parent)
    env = {**os.environ, **planted_env(root), "PYTHONPATH": f"{src}{os.pathsep}{root}",
           "STOP_WHO": who, "STOP_WITH": signal_name}
    env.pop("GITHUB_STEP_SUMMARY", None)
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "-m", "opforge", "bench", "--python", sys.executable,
                           "--package", "planted", "--namespace", "planted", "--recipes",
                           str(recipes), "--budget", "0.05", "--forward-only", "--json",
                           # a floor no real speed-up is under: the finished row passes
                           # whatever the machine's load (no verdict here rests on a time)
                           str(out), "--min-speedup", "1e-9"], capture_output=True, text=True,
                          env=env, timeout=300)
    return proc, out


@pytest.mark.parametrize("who, signal_name, why", [
    ("probe", "SIGKILL", "died with SIGKILL"),
    ("probe", "SIGINT", "the probe itself failed"),
])
def test_a_probe_that_stops_leaves_the_finished_rows_and_names_the_missing(
        planted, tmp_path, who, signal_name, why):
    proc, out = run_bench(planted, tmp_path, who, signal_name)
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(out.read_text())
    assert doc["complete"] is False
    assert [(r["op"], r["status"]) for r in doc["rows"]] == [("fair", "pass")]
    assert doc["missing"] == ["slow_cpu/small/forward/cpu"]
    probe = [c for c in doc["checks"] if c["id"] == "probe"]
    assert probe and probe[0]["status"] == "fail" and why in probe[0]["message"]
    assert not list(tmp_path.glob("*.partial")) and not list(tmp_path.glob(".bench.json.*"))


def test_an_interrupted_bench_writes_what_it_finished(planted, tmp_path):
    proc, out = run_bench(planted, tmp_path, "parent", "SIGINT")
    assert proc.returncode == 130, proc.stderr
    doc = json.loads(out.read_text())
    assert doc["interrupted"] is True and doc["complete"] is False
    assert [(r["op"], r["status"]) for r in doc["rows"]] == [("fair", "pass")]
    assert doc["missing"] == ["slow_cpu/small/forward/cpu"]
    assert "interrupted: 1 rows written" in proc.stderr
