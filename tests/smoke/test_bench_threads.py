"""`opforge bench --threads/--contended/--max-thread-cost` and a workload's `plain` op, end to
end through `opforge bench --python` on this interpreter, on a third-party pure-Python
``torch.library.custom_op`` package.

No assertion here rests on a measured time: the limits are set where no real timing can land
on the other side (``--max-thread-cost 1e-9``: every later thread count fails;
``max_vs_plain`` 1e-9 against 1e8), so what is checked is that the options reach the rows, the
rows carry their numbers (positive, finite, each thread cost its row's time over the first
count's) and a row fails with its counts and factor named. The verdicts on chosen numbers are
``test_bench_verdicts.py``'s; how well real timings catch an op that waits on a thread or is
heavier than its plain op, ``benchmarks/bench_planted.py`` measures.

- ``--contended`` runs the CPU rows beside busy processes, says so, and leaves none behind;
  the busy processes leave by themselves when the process that started them is killed.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from projectkit import write_project

import opforge

pytest.importorskip("torch")

PACKAGE = '''
import torch


def work(reps):
    total = 0
    for i in range(reps):
        total += i * i
    return total


@torch.library.custom_op("threadops::scale", mutates_args=())
def scale(x: torch.Tensor, reps: int) -> torch.Tensor:
    work(reps)
    return x * 2


@torch.library.custom_op("threadops::shift", mutates_args=())
def shift(x: torch.Tensor, reps: int) -> torch.Tensor:
    work(reps)
    return x + 2


@torch.library.custom_op("threadops::tight", mutates_args=())
def tight(x: torch.Tensor, reps: int) -> torch.Tensor:
    work(reps)
    return x * 2


@torch.library.custom_op("threadops::loose", mutates_args=())
def loose(x: torch.Tensor, reps: int) -> torch.Tensor:
    work(reps)
    return x * 2
'''

RECIPES = '''
import torch


def inputs(dtype):
    return [torch.rand(64, generator=torch.Generator().manual_seed(0)).to(dtype), 3000]


def plain(x, reps):
    total = 0
    for i in range(reps):
        total += i * i
    return x * 2


def load(**extra):
    return {"small": {"inputs": inputs, **extra}}


RECIPES = {
    "scale": {"inputs": inputs, "workloads": load()},
    "shift": {"inputs": inputs, "workloads": load()},
    # no real time is within 1e-9x of its plain op's, every real one within 1e8x
    "tight": {"inputs": inputs, "workloads": load(plain=plain, max_vs_plain=1e-9)},
    "loose": {"inputs": inputs, "workloads": load(plain=plain, max_vs_plain=1e8)},
}
'''



@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("threadops")
    return write_project(root, "threadops", PACKAGE, ["scale", "shift", "tight", "loose"],
                         recipes=RECIPES)


def bench(project: Path, *argv: str):
    src = str(Path(opforge.__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{project}",
           "OPFORGE_CACHE_DIR": str(project / "cache")}
    env.pop("GITHUB_STEP_SUMMARY", None)
    out = project / "out.json"
    proc = subprocess.run([sys.executable, "-m", "opforge", "bench", "--python", sys.executable,
                           "--file", str(project / "matrix.yaml"), "--budget", "0.05",
                           "--json", str(out), *argv], capture_output=True, text=True, env=env,
                          cwd=project, timeout=300)
    doc = json.loads(out.read_text()) if out.is_file() else {}
    out.unlink(missing_ok=True)
    return proc.returncode, doc, proc.stdout + proc.stderr


def rows_by(doc: dict) -> dict:
    return {(r["op"], r.get("threads")): r for r in doc.get("rows", [])}


def positive(value) -> bool:
    return isinstance(value, float) and math.isfinite(value) and value > 0


@pytest.fixture(scope="module")
def threaded(project):
    # a limit below any real thread cost: every later count's row fails, whatever the machine
    return bench(project, "--ops", "scale,shift", "--threads", "1,2", "--max-thread-cost",
                 "1e-9")


def test_each_thread_count_is_a_row_and_later_counts_carry_their_thread_cost(threaded):
    code, doc, output = threaded
    rows = rows_by(doc)
    assert set(rows) == {(op, n) for op in ("scale", "shift") for n in (1, 2)}, output
    assert doc["environment"]["thread_counts"] == [1, 2]
    for op in ("scale", "shift"):
        assert "thread_cost" not in rows[(op, 1)]
        assert rows[(op, 2)]["thread_cost_of"] == 1
        assert rows[(op, 2)]["thread_cost"] == pytest.approx(
            rows[(op, 2)]["ours_s"] / rows[(op, 1)]["ours_s"])
        for n in (1, 2):
            row = rows[(op, n)]
            assert row["threads"] == n and row["rounds"] >= 5, row
            assert all(positive(row[k]) for k in ("ours_s", "yardstick_s", "pace")), row
    assert "small fwd @2t" in output and "CPU rows at 1,2 threads" in output


def test_a_thread_cost_above_the_limit_fails_the_row_naming_counts_and_factor(threaded):
    code, doc, output = threaded
    rows = rows_by(doc)
    assert code == 1, output
    for op in ("scale", "shift"):
        assert rows[(op, 1)]["status"] == "pass", rows[(op, 1)]  # the first count: no cost
        later = rows[(op, 2)]
        assert later["status"] == "fail", later
        assert later["message"].startswith(f"2 threads take {later['thread_cost']:.2f}x the "
                                           "time of 1 (at most 1e-09x allowed, beyond noise ±")
        assert f"FAIL {op} small fwd @2t on cpu: 2 threads take" in output


def test_a_row_slower_than_its_plain_op_allows_fails_and_one_within_passes(project):
    code, doc, output = bench(project, "--ops", "tight,loose")
    rows = rows_by(doc)
    assert code == 1, output
    tight, loose = rows[("tight", None)], rows[("loose", None)]
    for row in (tight, loose):
        assert row["plain"] == "plain" and positive(row["plain_s"]), row
        assert positive(row["vs_plain"]), row
    assert tight["status"] == "fail" and tight["max_vs_plain"] == 1e-9, tight
    assert tight["message"].startswith(f"{tight['vs_plain']:.2f}x the time of plain on the same "
                                       "arguments (at most 1e-09x allowed, beyond noise ±")
    assert loose["status"] == "pass" and loose["max_vs_plain"] == 1e8, loose
    assert "FAIL tight small fwd on cpu:" in output and "FAIL loose" not in output


def spinners() -> set[int]:
    """Pids of live processes running the busy loop, from `ps` (Linux and macOS alike).

    ``-ww``: without it ps cuts each line at $COLUMNS (80 where CI sets it), which can cut
    the busy loop's command line before the text looked for. A zombie (state Z) has left.
    """
    listing = subprocess.run(["ps", "-ww", "-eo", "pid=,stat=,args="], capture_output=True,
                             text=True, check=True).stdout
    pids = set()
    for line in listing.splitlines():
        pid, stat, args = (line.split(None, 2) + ["", ""])[:3]
        if "parent = os.getppid()" in args and not stat.startswith("Z"):
            pids.add(int(pid))
    return pids


NO_PS = shutil.which("ps") is None  # Windows: no ps to list the busy processes with


@pytest.mark.skipif(NO_PS, reason="needs `ps` to list processes (not on Windows)")
def test_contended_runs_beside_busy_processes_and_leaves_none(project):
    before = spinners()
    # one row: the busy processes take a core from the other tests while it runs
    code, doc, output = bench(project, "--ops", "scale", "--contended")
    assert code == 0, output
    assert doc["environment"]["contended"] is True and len(doc["rows"]) == 1
    assert "contended (busy processes on every core)" in output
    assert spinners() - before == set()


@pytest.mark.skipif(NO_PS, reason="needs `ps` to list processes (not on Windows)")
def test_busy_processes_leave_when_their_parent_is_killed(tmp_path):
    src = str(Path(opforge.__file__).resolve().parent.parent)
    script = ("import time\nfrom opforge.bench.target.cores import busy_cores\n"
              "with busy_cores(True):\n    print('ready', flush=True)\n    time.sleep(120)\n")
    before = spinners()
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": src})
    try:
        assert parent.stdout.readline().strip() == "ready"
        started = spinners() - before
        assert started, "no busy process started"
    finally:
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
    deadline = time.monotonic() + 10
    while started & spinners() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not started & spinners(), "busy processes outlived the process that started them"


def test_bad_thread_options_exit_2_with_one_line(project):
    for argv, says in ((["--threads", "0,2"], "thread counts between 1 and 1024"),
                       (["--threads", "one"], "thread counts such as 1,2"),
                       (["--max-thread-cost", "1.2"], "--max-thread-cost compares thread counts"),
                       (["--threads", "2", "--max-thread-cost", "1.2"], "two or more")):
        code, _, output = bench(project, *argv)
        assert code == 2, (argv, output)
        assert says in output and "Traceback" not in output, (argv, output)


@pytest.mark.parametrize(("workload", "says"), [
    ({"plain": 3}, "['plain'] must be a callable taking the workload's arguments"),
    ({"plain": "cpu"}, "['plain'] must be a callable"),
    ({"max_vs_plain": 2}, "bounds the time against 'plain', which is not given"),
    ({"plain": "torch.add", "max_vs_plain": 0}, "must be a positive number"),
    ({"plain": "torch.add", "max_vs_plain": True}, "must be a positive number"),
])
def test_a_bad_plain_or_max_vs_plain_is_named_in_one_line(workload, says):
    from opforge.smoke.probe import checks, recipes

    recipe = {"inputs": lambda dtype: [], "workloads": {"small": {"inputs": lambda d: [],
                                                                  **workload}}}
    problem = recipes.validate("op", recipe, "recipes.py", checks.skippable())
    assert problem is not None and says in problem, problem
    assert "RECIPES['op']['workloads']['small']" in problem
