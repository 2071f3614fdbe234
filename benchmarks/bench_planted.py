"""How well opforge's speed verdicts catch planted defects with real timings, and how often a
healthy op is failed (false alarms): the timing half of what the test suite checks on
injected numbers (no test asserts a time: tests/smoke/test_bench_verdicts.py and friends).

    python benchmarks/bench_planted.py [--repeat 3] [--budget 0.05] [--contended] [--json F]

Every scenario runs the real `opforge bench` (or `opforge smoke`) on this interpreter
(`--python`: no environment is made) on a pure-Python ``torch.library.custom_op`` package
whose kernels do plain-Python work, made N times heavier by environment variables:

  thread-wait      `waits` does 4x its work when torch may use more than one thread;
                   `--threads 1,2 --max-thread-cost 1.5`: its 2-thread cost must fail,
                   `steady`'s must pass
  plain            `heavy` does 10x the work of its workload's plain function, `light` 1x;
                   `max_vs_plain: 3` must fail heavy and pass light
  baseline-ours    a run saved, then `scale` made 12x slower and compared `--against` it:
                   scale must fail, `steady` must not
  baseline-ref     a run saved, then the reference of `shifty` made 20x faster while ours
                   stays: a WARN naming the reference, never a FAIL
  floor            `naive` is 20x slower than its reference: the 0.1x floor must fail it,
                   matrix.yaml's `max_slowdown: 40` must pass it
  smoke-speed      the smoke speed check on tests/smoke/planted.py: the 30x slower Meta
                   kernel must fail (above 10x), the fair one pass

Per scenario: the number each verdict rests on (median and range over the repeats) and how
many repeats gave the expected verdict. ``--contended`` runs it all beside busy processes on
every core. Exit 1 when a repeat missed a planted defect or failed a healthy op.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"

PACKAGE = '''
import os

import torch


def _factors(name):
    return dict((op, int(n)) for op, n in
                (item.split("=") for item in os.environ.get(name, "").split(",") if item))


SLOW = _factors("BENCHOPS_SLOW")   # op -> how many times its work
WAIT = _factors("BENCHOPS_WAIT")   # op -> how many times its work when threads > 1
BASE = {"heavy": 10, "naive": 20}  # slower by design


def work(reps):
    total = 0
    for i in range(reps):
        total += i * i
    return total


def _make(op):
    def kernel(x: torch.Tensor, reps: int) -> torch.Tensor:
        n = BASE.get(op, 1) * SLOW.get(op, 1)
        n *= WAIT.get(op, 1) if torch.get_num_threads() > 1 else 1
        for _ in range(n):
            work(reps)
        return x * 2
    kernel.__name__ = op
    return torch.library.custom_op(f"benchops::{op}", mutates_args=())(kernel)


for _op in ("scale", "steady", "waits", "heavy", "light", "naive", "shifty"):
    globals()[_op] = _make(_op)
'''

RECIPES = '''
import os

import torch

REF = int(os.environ.get("BENCHOPS_REF_SLOW", "1"))  # the reference of shifty, N times


def inputs(dtype):
    return [torch.rand(64, generator=torch.Generator().manual_seed(0)).to(dtype), 3000]


def work(reps):
    total = 0
    for i in range(reps):
        total += i * i
    return total


def plain(x, reps):
    work(reps)
    return x * 2


def fast_reference(x, reps):
    work(reps)
    return x * 2


def moving_reference(x, reps):
    for _ in range(REF):
        work(reps)
    return x * 2


def alone():
    return {"inputs": inputs, "workloads": {"small": {"inputs": inputs}}}


def with_plain():
    return {"inputs": inputs, "workloads": {"small": {"inputs": inputs, "plain": plain,
                                                      "max_vs_plain": 3}}}


RECIPES = {
    "scale": alone(), "steady": alone(), "waits": alone(),
    "heavy": with_plain(), "light": with_plain(),
    "naive": {**alone(), "reference": fast_reference},
    "shifty": {**alone(), "reference": moving_reference},
}
'''

MATRIX = '''\
extension:
  path: .
  package: benchops
  namespace: benchops
  recipes: recipes.py
  ops: [scale, steady, waits, heavy, light, {naive}, shifty]
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


def write_project(root: Path) -> None:
    (root / "benchops").mkdir(parents=True)
    (root / "benchops" / "__init__.py").write_text(textwrap.dedent(PACKAGE), encoding="utf-8")
    (root / "recipes.py").write_text(textwrap.dedent(RECIPES), encoding="utf-8")
    (root / "matrix.yaml").write_text(MATRIX.replace("{naive}", "{naive: {max_slowdown: 40}}"))
    (root / "undeclared.yaml").write_text(MATRIX.replace("{naive}", "naive"))


def opforge(root: Path, *argv: str, env: dict | None = None) -> tuple[int, dict]:
    out = root / "out.json"
    out.unlink(missing_ok=True)
    environ = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{root}",
               "OPFORGE_CACHE_DIR": str(root / "cache"), **(env or {})}
    environ.pop("GITHUB_STEP_SUMMARY", None)
    proc = subprocess.run([sys.executable, "-m", "opforge", *argv, "--python", sys.executable,
                           "--json", str(out)], capture_output=True, text=True, env=environ,
                          cwd=root, timeout=900)
    doc = json.loads(out.read_text()) if out.is_file() else {}
    if not doc:
        raise SystemExit(f"opforge {' '.join(argv)} wrote no report:\n{proc.stderr[-2000:]}")
    return proc.returncode, doc


def rows(doc: dict) -> dict:
    return {(r["op"], r.get("threads")): r for r in doc.get("rows", [])}


def thread_wait(root: Path, budget: str) -> list[tuple]:
    _, doc = opforge(root, "bench", "--file", "matrix.yaml", "--budget", budget, "--ops",
                     "waits,steady", "--threads", "1,2", "--max-thread-cost", "1.5",
                     env={"BENCHOPS_WAIT": "waits=4"})
    got = rows(doc)
    return [("thread-wait", "waits@2t thread cost", got[("waits", 2)]["thread_cost"],
             got[("waits", 2)]["status"] == "fail"),
            ("thread-wait", "steady@2t thread cost", got[("steady", 2)]["thread_cost"],
             got[("steady", 2)]["status"] == "pass")]


def plain(root: Path, budget: str) -> list[tuple]:
    _, doc = opforge(root, "bench", "--file", "matrix.yaml", "--budget", budget, "--ops",
                     "heavy,light")
    got = rows(doc)
    return [("plain", "heavy vs_plain", got[("heavy", None)]["vs_plain"],
             got[("heavy", None)]["status"] == "fail"),
            ("plain", "light vs_plain", got[("light", None)]["vs_plain"],
             got[("light", None)]["status"] == "pass")]


def baseline_ours(root: Path, budget: str) -> list[tuple]:
    common = ("bench", "--file", "matrix.yaml", "--budget", budget, "--ops", "scale,steady")
    opforge(root, *common, "--save", "ours")
    _, doc = opforge(root, *common, "--against", "ours", env={"BENCHOPS_SLOW": "scale=12"})
    got = rows(doc)
    scale, steady = got[("scale", None)], got[("steady", None)]
    return [("baseline-ours", "scale (12x slower) time vs baseline",
             scale["baseline"]["ours_change"], scale["status"] == "fail"),
            ("baseline-ours", "steady time vs baseline", steady["baseline"]["ours_change"],
             steady["status"] == "pass")]


def baseline_ref(root: Path, budget: str) -> list[tuple]:
    common = ("bench", "--file", "matrix.yaml", "--budget", budget, "--ops", "shifty")
    opforge(root, *common, "--save", "ref", env={"BENCHOPS_REF_SLOW": "20"})
    _, doc = opforge(root, *common, "--against", "ref")
    row = rows(doc)[("shifty", None)]
    return [("baseline-ref", "shifty reference (20x faster) time vs baseline",
             row["baseline"]["reference_change"],
             row["status"] == "pass" and "reference" in row["baseline"]["moved"]
             and row.get("warning", "").startswith("the reference moved, not ours")),
            ("baseline-ref", "shifty our time vs baseline", row["baseline"]["ours_change"],
             row["status"] == "pass")]


def floor(root: Path, budget: str) -> list[tuple]:
    _, declared = opforge(root, "bench", "--file", "matrix.yaml", "--budget", budget, "--ops",
                          "naive")
    _, undeclared = opforge(root, "bench", "--file", "undeclared.yaml", "--budget", budget,
                            "--ops", "naive")
    yes, no = rows(declared)[("naive", None)], rows(undeclared)[("naive", None)]
    return [("floor", "naive speed-up, declared 40x", yes["speedup"], yes["status"] == "pass"),
            ("floor", "naive speed-up, 0.1x floor", no["speedup"], no["status"] == "fail")]


def smoke_speed(root: Path, budget: str) -> list[tuple]:
    sys.path.insert(0, str(ROOT / "tests" / "smoke"))
    from planted import planted_env, write_planted

    where, recipes = write_planted(root / "planted")
    _, doc = opforge(root, "smoke", "--package", "planted", "--namespace", "planted",
                     "--recipes", str(recipes),
                     env={**planted_env(where),
                          "PYTHONPATH": f"{SRC}{os.pathsep}{where}"})
    checks = {c["id"]: c for c in doc["checks"] if c["category"] == "speed"}
    slow, fair = checks["speed:slow_device:meta"], checks["speed:fair:meta"]
    return [("smoke-speed", "slow_device (30x) Meta / CPU", slow["ratio"],
             slow["status"] == "fail"),
            ("smoke-speed", "fair Meta / CPU", fair["ratio"], fair["status"] == "pass")]


SCENARIOS = {"thread-wait": thread_wait, "plain": plain, "baseline-ours": baseline_ours,
             "baseline-ref": baseline_ref, "floor": floor, "smoke-speed": smoke_speed}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--budget", default="0.05")
    p.add_argument("--only", choices=sorted(SCENARIOS), action="append")
    p.add_argument("--contended", action="store_true",
                   help="busy processes on every core while it runs")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    if args.repeat < 1:
        p.error("--repeat: at least 1")
    spinners = []
    if args.contended:
        spin = "while True:\n    pass\n"
        spinners = [subprocess.Popen([sys.executable, "-c", spin])
                    for _ in range(len(os.sched_getaffinity(0)))]
    results: dict[tuple, list] = {}
    try:
        for _ in range(args.repeat):
            for name in args.only or SCENARIOS:
                with tempfile.TemporaryDirectory(prefix=f"bench-planted-{name}-") as scratch:
                    root = Path(scratch)
                    write_project(root)
                    for scenario, what, number, right in SCENARIOS[name](root, args.budget):
                        results.setdefault((scenario, what), []).append((number, right))
    finally:
        for proc in spinners:
            proc.kill()
            proc.wait()
    table = []
    print(f"{'scenario':<14} {'measured':<48} {'median':>9} {'range':>17}  verdict right")
    for (scenario, what), seen in results.items():
        numbers = [n for n, _ in seen]
        right = sum(1 for _, ok in seen if ok)
        table.append({"scenario": scenario, "measured": what, "values": numbers,
                      "median": statistics.median(numbers), "right": right,
                      "repeats": len(seen)})
        print(f"{scenario:<14} {what:<48} {statistics.median(numbers):>8.3g}x "
              f"{min(numbers):>7.3g}-{max(numbers):<7.3g}x  {right}/{len(seen)}")
    if args.json:
        args.json.write_text(json.dumps({"contended": args.contended, "budget": args.budget,
                                         "rows": table}, indent=1) + "\n")
    return 0 if all(r["right"] == r["repeats"] for r in table) else 1


if __name__ == "__main__":
    sys.exit(main())
