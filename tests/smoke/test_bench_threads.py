"""`opforge bench --threads/--contended/--max-thread-cost` and a workload's `plain` op, end to
end through `opforge bench --python` on this interpreter, on a third-party pure-Python
``torch.library.custom_op`` package with planted defects:

- ``waits`` does four times its work whenever torch may use more than one thread (an op that
  waits on a second thread instead of gaining from it); ``steady`` does the same work on any
  thread count. With ``--threads 1,2 --max-thread-cost 1.5`` the first fails, naming the
  counts and the factor, and the second passes.
- ``heavy`` is ten times the time of its workload's ``plain`` function on the same arguments;
  ``max_vs_plain: 3`` fails it, ``light`` (the same as its plain function) passes.
- ``--contended`` runs the CPU rows beside busy processes, says so, and leaves none behind;
  the busy processes leave by themselves when the process that started them is killed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import opforge

pytest.importorskip("torch")

PACKAGE = '''
import torch


def work(reps):
    total = 0
    for i in range(reps):
        total += i * i
    return total


@torch.library.custom_op("threadops::waits", mutates_args=())
def waits(x: torch.Tensor, reps: int) -> torch.Tensor:
    work(reps * (4 if torch.get_num_threads() > 1 else 1))
    return x * 2


@torch.library.custom_op("threadops::steady", mutates_args=())
def steady(x: torch.Tensor, reps: int) -> torch.Tensor:
    work(reps)
    return x * 2


@torch.library.custom_op("threadops::heavy", mutates_args=())
def heavy(x: torch.Tensor, reps: int) -> torch.Tensor:
    work(10 * reps)
    return x * 2


@torch.library.custom_op("threadops::light", mutates_args=())
def light(x: torch.Tensor, reps: int) -> torch.Tensor:
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
    "waits": {"inputs": inputs, "workloads": load()},
    "steady": {"inputs": inputs, "workloads": load()},
    "heavy": {"inputs": inputs, "workloads": load(plain=plain, max_vs_plain=3)},
    "light": {"inputs": inputs, "workloads": load(plain=plain, max_vs_plain=3)},
}
'''

MATRIX = '''\
extension:
  path: .
  package: threadops
  namespace: threadops
  recipes: recipes.py
  ops: [waits, steady, heavy, light]
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
    root = tmp_path_factory.mktemp("threadops")
    (root / "threadops").mkdir()
    (root / "threadops" / "__init__.py").write_text(textwrap.dedent(PACKAGE), encoding="utf-8")
    (root / "recipes.py").write_text(textwrap.dedent(RECIPES), encoding="utf-8")
    (root / "matrix.yaml").write_text(MATRIX, encoding="utf-8")
    return root


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


@pytest.fixture(scope="module")
def threaded(project):
    return bench(project, "--ops", "waits,steady", "--threads", "1,2", "--max-thread-cost",
                 "1.5")


def test_each_thread_count_is_a_row_and_later_counts_carry_their_thread_cost(threaded):
    code, doc, output = threaded
    rows = rows_by(doc)
    assert set(rows) == {(op, n) for op in ("waits", "steady") for n in (1, 2)}, output
    assert doc["environment"]["thread_counts"] == [1, 2]
    for op in ("waits", "steady"):
        assert "thread_cost" not in rows[(op, 1)]
        assert rows[(op, 2)]["thread_cost_of"] == 1
        assert rows[(op, 2)]["thread_cost"] == pytest.approx(
            rows[(op, 2)]["ours_s"] / rows[(op, 1)]["ours_s"])
    assert "small fwd @2t" in output and "CPU rows at 1,2 threads" in output


def test_an_op_that_waits_on_a_second_thread_fails_and_a_steady_one_passes(threaded):
    code, doc, output = threaded
    rows = rows_by(doc)
    assert code == 1, output
    assert rows[("waits", 2)]["status"] == "fail", rows[("waits", 2)]
    assert rows[("waits", 2)]["thread_cost"] > 2.5
    assert "2 threads take" in rows[("waits", 2)]["message"]
    assert "at most 1.5x allowed" in rows[("waits", 2)]["message"]
    assert "FAIL waits small fwd @2t on cpu: 2 threads take" in output
    for key in (("waits", 1), ("steady", 1), ("steady", 2)):
        assert rows[key]["status"] == "pass", rows[key]
    assert rows[("steady", 2)]["thread_cost"] < 1.5


def test_an_op_slower_than_its_plain_op_allows_fails(project):
    code, doc, output = bench(project, "--ops", "heavy,light")
    rows = rows_by(doc)
    assert code == 1, output
    heavy, light = rows[("heavy", None)], rows[("light", None)]
    assert heavy["status"] == "fail" and heavy["vs_plain"] > 5, heavy
    assert heavy["plain"] == "plain" and heavy["max_vs_plain"] == 3
    assert "the time of plain on the same arguments (at most 3x allowed" in heavy["message"]
    assert light["status"] == "pass" and light["vs_plain"] < 3, light


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
    code, doc, output = bench(project, "--ops", "steady", "--contended")
    assert code == 0, output
    assert doc["environment"]["contended"] is True and len(doc["rows"]) == 1
    assert "contended (busy processes on every core)" in output
    assert spinners() - before == set()


@pytest.mark.skipif(NO_PS, reason="needs `ps` to list processes (not on Windows)")
def test_busy_processes_leave_when_their_parent_is_killed(tmp_path):
    src = str(Path(opforge.__file__).resolve().parent.parent)
    script = ("import time\nfrom opforge.bench.target.bench import busy_cores\n"
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
    from opforge.smoke.probe import recipes

    recipe = {"inputs": lambda dtype: [], "workloads": {"small": {"inputs": lambda d: [],
                                                                  **workload}}}
    problem = recipes.validate("op", recipe, "recipes.py")
    assert problem is not None and says in problem, problem
    assert "RECIPES['op']['workloads']['small']" in problem
