"""The CPU rows of bench_cpu.py, two builds of opforge_ops side by side (e.g. legacy vs stable ABI).

    python benchmarks/bench_abi.py --a /path/legacy-venv/bin/python --b /path/stable-venv/bin/python \
        [--threads 1] [--cpus 1] [--min-run-time 1.0] [--rounds 3] [--only TEXT] [--json results.json]
        [--labels before,after]

Two builds register the same torch.ops.opforge namespace, so they cannot share a process: each
runs in a worker (its own interpreter and environment) that stays up for the whole run, and
the parent asks the two for each row in alternation, --rounds times, keeping each build's best
median of CPU seconds per call (process CPU time, so that load from other processes on a
shared machine does not decide a row; use --threads 1 for that to hold). Both workers are
pinned to the same CPUs (--cpus; default: the last --threads CPUs this process may use): on a
machine whose cores are not equally loaded one core can be twice as slow as another, and a
build must not win a row by the core it got. Both workers allocate alike: glibc's
MALLOC_MMAP_THRESHOLD_ is fixed at 64 KiB (unless set), so every large tensor is fresh pages in
both; with glibc's adaptive threshold, whether a row's outputs reused warm heap memory depended
on each process's allocation history and moved single rows by up to 20% either way. "ratio" is
b time / a time. Both workers first compute every row once and their results must agree.
Exit status 1 if any row's ratio is above --tolerance.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def worker(threads, min_run_time):
    """Serve rows on stdin: 'check NAME' -> a digest of the result, 'time NAME' -> median s."""
    import warnings

    import torch

    warnings.simplefilter("ignore")  # quantized-tensor deprecation notices, once per worker
    sys.path.insert(0, str(HERE))
    import bench_cpu
    import opforge_ops

    torch.set_num_threads(threads)
    # bench_cpu builds a row's inputs when its generator reaches the row: rows are taken one at
    # a time ('next'), as bench_cpu itself runs them, so a worker holds one row's tensors.
    rows = ((name, ours) for name, ours, _ in bench_cpu.cases(opforge_ops, None))
    current = None
    print(json.dumps({"abi": opforge_ops.build_info().get("abi", "legacy")}), flush=True)
    for line in sys.stdin:
        command = line.strip()
        try:
            if command == "next":
                name, current = next(rows, (None, None))
                reply = name
            elif command == "check":
                out = current()
                outs = out if isinstance(out, (list, tuple)) else [out]
                reply = [None if t is None else t.double().sum().item() if not t.is_quantized
                         else t.int_repr().double().sum().item() for t in outs]
            else:
                reply = cpu_time_per_call(current, min_run_time)
        except (RuntimeError, NotImplementedError) as error:  # e.g. quantized rows on stable
            reply = {"error": str(error).splitlines()[0]}
        print(json.dumps(reply), flush=True)


def cpu_time_per_call(fn, min_run_time, blocks=5):
    """The median over `blocks` blocks of this process's CPU seconds per call. CPU time, not
    wall time: on a shared, loaded machine it counts only the cycles the call itself used."""
    fn()
    per_block = min_run_time / blocks
    start, calls = time.process_time(), 0
    while time.process_time() - start < per_block / 4 or calls < 1:
        fn()
        calls += 1
    n = max(1, int(calls * per_block / max(time.process_time() - start, 1e-9) / 4) or 1)
    samples = []
    for _ in range(blocks):
        start = time.process_time()
        for _ in range(n):
            fn()
        samples.append((time.process_time() - start) / n)
    return statistics.median(samples)


class Worker:
    def __init__(self, python, threads, min_run_time, cpus):
        self.proc = subprocess.Popen(
            [python, __file__, "--worker", "--threads", str(threads), "--min-run-time", str(min_run_time)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd="/",
            env={"MALLOC_MMAP_THRESHOLD_": "65536", **os.environ})
        if cpus:
            os.sched_setaffinity(self.proc.pid, cpus)  # before torch starts its threads
        hello = self.proc.stdout.readline()
        if not hello:
            raise SystemExit(f"bench_abi: the worker {python} did not start")
        self.abi = json.loads(hello)["abi"]

    def ask(self, command):
        self.proc.stdin.write(f"{command}\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()


def pinned_cpus(spec, threads):
    """The CPUs both workers run on: `spec` ("3", "2,3", "2-3"), else the last `threads` of
    this process's; none where the platform cannot pin."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    allowed = sorted(os.sched_getaffinity(0))
    if not spec:
        return set(allowed[-max(1, threads):])
    cpus = set()
    for part in spec.split(","):
        low, _, high = part.partition("-")
        try:
            cpus.update(range(int(low), int(high or low) + 1))
        except ValueError:
            raise SystemExit(f"bench_abi: --cpus takes CPU numbers such as 3, 2,3 or 2-3, not {spec!r}") from None
    if not cpus <= set(allowed):
        raise SystemExit(f"bench_abi: --cpus {spec}: this process may use CPUs {allowed} only")
    return cpus


def agree(a, b):
    if isinstance(a, dict) or isinstance(b, dict):
        return True  # a row one build cannot run is reported, not compared
    return all((x is None) == (y is None) and (x is None or abs(x - y) <= 1e-3 * max(1.0, abs(x)))
               for x, y in zip(a, b, strict=True))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--a", help="python of the first build's environment (the baseline)")
    parser.add_argument("--b", help="python of the second build's environment")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cpus", default="", help="CPUs both workers are pinned to (e.g. 3 or 2-3)")
    parser.add_argument("--min-run-time", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tolerance", type=float, default=1.05)
    parser.add_argument("--only", default="")
    parser.add_argument("--json")
    parser.add_argument("--labels", default="",
                        help="column names of the two builds, A,B (default: their ABIs), e.g. "
                             "before,after for two builds of one ABI")
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args.threads, args.min_run_time)
    if not (args.a and args.b):
        parser.error("--a and --b name the two environments' python")
    cpus = pinned_cpus(args.cpus, args.threads)
    a = Worker(args.a, args.threads, args.min_run_time, cpus)
    b = Worker(args.b, args.threads, args.min_run_time, cpus)
    if cpus:
        print(f"both builds pinned to CPU {','.join(map(str, sorted(cpus)))}")
    results, worst = [], 0.0
    label_a, _, label_b = args.labels.partition(",")
    print(f"{'row':58} {label_a or a.abi:>10} {label_b or b.abi:>10}  ratio")
    while True:
        name = a.ask("next")
        if b.ask("next") != name:
            raise SystemExit("bench_abi: the two builds' bench_cpu.py rows differ")
        if name is None:
            break
        if args.only not in name:
            continue
        check_a, check_b = a.ask("check"), b.ask("check")
        if not agree(check_a, check_b):
            raise SystemExit(f"bench_abi: {name}: the two builds disagree ({check_a} vs {check_b})")
        best_a = best_b = None
        for _ in range(args.rounds):
            for worker_, best in ((a, "a"), (b, "b")):
                t = worker_.ask("time")
                if isinstance(t, dict):
                    t = None
                if best == "a":
                    best_a = t if best_a is None or (t is not None and t < best_a) else best_a
                else:
                    best_b = t if best_b is None or (t is not None and t < best_b) else best_b
        ratio = best_b / best_a if best_a and best_b else None
        worst = max(worst, ratio or 0.0)
        fmt = lambda t: f"{t * 1e3:8.3f}ms" if t else f"{'n/a':>10}"  # noqa: E731
        print(f"{name:58} {fmt(best_a)} {fmt(best_b)}  {ratio:.3f}" if ratio else
              f"{name:58} {fmt(best_a)} {fmt(best_b)}  n/a", flush=True)
        results.append({"row": name, "a_s": best_a, "b_s": best_b, "ratio": ratio})
    a.close()
    b.close()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 1 if worst > args.tolerance else 0


if __name__ == "__main__":
    sys.exit(main())
