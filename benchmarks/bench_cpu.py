"""CPU benchmarks: opforge_ops beside torchvision.ops, same process, same inputs, 1 and 2 threads.

    python benchmarks/bench_cpu.py [--threads 1,2] [--contended] [--min-speedup 2.0]
        [--max-thread-cost 1.2] [--rounds 15] [--min-run-time 0.05] [--only TEXT] [--json FILE]

Needs torchvision and an opforge_ops built against the same torch (CPU kernels suffice).
The rows are the ops' "cpu" rows in extension/recipes.py (BENCHMARKS), op by op. Each row
times the forward, or forward+backward, of one op at every thread count of --threads, for
opforge and for torchvision (and the row's baseline), with benchmarks/timing.py: --rounds
interleaved rounds, each measuring every one of those conditions once for --min-run-time
seconds in an order that turns from round to round, so load from other processes on a shared
machine hits every condition alike. A ratio is the median over rounds of that round's ratio
(a median of medians); the number after "±" is its noise, half the interquartile range of the
rounds' ratios:

  ms@T      opforge's median time per call on T threads
  x@T       speed-up on T threads: torchvision time / opforge time
  2t/1t     opforge's time on the most threads / on one thread: what a second thread costs
            (above 1: a call waited on a thread) or gains (below 1)
  tv 2t/1t  the same for torchvision, beside it: what the machine does to a second thread

A row with a "baseline" (deform_conv2d beside a plain conv2d of the same shape) also times
that baseline on one thread: "vs base" is opforge time / baseline time, which must not exceed
the row's "floor".

--contended runs every row while as many busy processes as this process may use CPUs (two
on a 2-core machine) hold the cores: a call that waits on a second thread shows up as a
2t/1t above 1.

Every row first checks that both libraries agree, so a fast wrong kernel cannot pass. Exit
status 1 if a row's one-thread speed-up is below --min-speedup, a row's 2t/1t is above
--max-thread-cost (with --contended; without it, above 1 + 2 * (--max-thread-cost - 1): on an
idle machine a second thread must not cost), or a row is slower than its baseline allows;
2 for bad arguments or a missing library.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from functools import partial

import bench_rows
import timing
import torch


def fail(message):
    print(f"bench_cpu: {message}", file=sys.stderr)
    raise SystemExit(2)


def load_libraries():
    try:
        import opforge_ops
    except ImportError as error:
        fail(f"cannot import opforge_ops: {error}")
    try:
        import torchvision.ops
    except ImportError as error:
        fail(f"cannot import torchvision, which the comparison needs: {error}")
    return opforge_ops, torchvision.ops


def forward_backward(call, lib, inputs, grad):
    """A closure running call(lib, ...) forward and backward on fresh grads of inputs[grad]."""
    leaves = [t.detach().requires_grad_() if i in grad else t for i, t in enumerate(inputs)]
    # The output's gradient is made once, outside the timed call: it is torch's fill, the same
    # on both sides, and on a busy machine with two threads its OpenMP team alone can take
    # milliseconds (a scheduler time slice), which would hide the op's own 2t/1t.
    seed = []

    def run():
        for i in grad:
            leaves[i].grad = None
        out = call(lib, *leaves)
        if not seed or seed[0].shape != out.shape or seed[0].dtype != out.dtype:
            seed[:] = [torch.ones_like(out)]
        out.backward(seed[0])
        return [leaves[i].grad for i in grad]

    return run


def cases(ours, tv):
    """(name, ours_fn, tv_fn) for each CPU row of extension/recipes.py's BENCHMARKS; a row's
    inputs are built when the generator reaches it."""
    for name, ours_fn, tv_fn, _ in rows_with_baselines(ours, tv):
        yield name, ours_fn, tv_fn


def rows_with_baselines(ours, tv):
    """As cases(), with each row's (baseline fn, floor), or None where it has no baseline."""
    for op, row in bench_rows.rows("cpu"):
        if not hasattr(ours, op):  # a build without the op (bench_abi.py compares two builds)
            continue
        inputs, call, grad = row["inputs"]("cpu"), row["call"], row.get("grad")
        baseline = None
        if "baseline" in row:
            baseline = (partial(row["baseline"], *inputs), row["floor"])
        if grad:
            yield (row["label"], forward_backward(call, ours, inputs, grad),
                   forward_backward(call, tv, inputs, grad), baseline)
        else:
            yield row["label"], partial(call, ours, *inputs), partial(call, tv, *inputs), baseline


def assert_agree(name, ours, theirs):
    if ours is None and theirs is None:  # neither library gives this input a gradient
        return
    if isinstance(ours, torch.Tensor) and ours.is_quantized:
        # the same quantization, values within one quantum: a kernel that requantizes its float
        # result (the stable build's Python QuantizedCPU kernel) rounds differently from one that
        # sums the integer values (torchvision's, the legacy build's), as torchvision's own
        # tests allow
        same_q = (ours.dtype, ours.q_scale(), ours.q_zero_point()) == \
            (theirs.dtype, theirs.q_scale(), theirs.q_zero_point())
        quanta = (ours.int_repr().int() - theirs.int_repr().int()).abs().max().item() \
            if ours.numel() else 0
        if not same_q or ours.shape != theirs.shape or quanta > 1:
            fail(f"{name}: opforge and torchvision disagree"
                 f"{f' (by {quanta} quanta)' if same_q and ours.shape == theirs.shape else ''}")
        return
    if isinstance(ours, (list, tuple)):
        for a, b in zip(ours, theirs, strict=True):
            assert_agree(name, a, b)
        return
    if ours.dtype == torch.int64:
        # The same kept boxes; torchvision's order among equal scores is unspecified.
        if not torch.equal(ours.sort().values, theirs.sort().values):
            fail(f"{name}: opforge and torchvision disagree")
        return
    scale = max(theirs.abs().max().item(), 1.0)
    if not torch.allclose(ours, theirs, rtol=1e-4, atol=1e-4 * scale):
        fail(
            f"{name}: opforge and torchvision disagree (max abs diff {(ours - theirs).abs().max().item():.3g})"
        )


def build_label(info):
    """A wheel's record carries its version; an in-place build only says what it is."""
    return info.get("version") or info.get("variant", "?")


def thread_counts(text):
    try:
        counts = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: thread counts such as 1,2") from None
    if not counts or counts[0] < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: thread counts such as 1,2")
    return counts


class BusyCores:
    """`count` processes that spin until closed: a machine whose cores are all taken. Each
    also stops when this process is gone (killed, timed out), so none outlives the run."""

    SPIN = "import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n    pass\n"

    def __init__(self, count):
        self.procs = [subprocess.Popen([sys.executable, "-c", self.SPIN]) for _ in range(count)]

    def close(self):
        for proc in self.procs:
            proc.kill()
            proc.wait()


def time_row(ours_fn, tv_fn, threads, rounds, seconds, base_fn=None):
    """{(side, T): seconds per call, round by round} for side "ours" and "tv" at every thread
    count T, and ("base", 1) for a baseline: every condition measured once per round, the
    rounds interleaved (timing.py), so that a ratio of two conditions compares neighbours."""
    conditions = {}
    for t in threads:
        conditions[("ours", t)] = ours_fn
        conditions[("tv", t)] = tv_fn
    if base_fn is not None:
        conditions[("base", 1)] = base_fn
    return timing.interleaved(conditions, rounds, seconds,
                              prepare=lambda key: torch.set_num_threads(key[1]))


def summarize(name, times, threads, floor=None):
    """The row's figures: medians of per-round ratios, each with its noise (timing.ratio)."""
    row = {"case": name}
    for t in threads:
        ours_s, tv_s = times[("ours", t)], times[("tv", t)]
        row[f"opforge_ms@{t}"] = statistics.median(ours_s) * 1e3
        row[f"torchvision_ms@{t}"] = statistics.median(tv_s) * 1e3
        row[f"speedup@{t}"], row[f"speedup_noise@{t}"] = timing.ratio(tv_s, ours_s)
    if len(threads) > 1:
        first, last = threads[0], threads[-1]
        row["thread_cost"], row["thread_cost_noise"] = timing.ratio(
            times[("ours", last)], times[("ours", first)])
        row["tv_thread_cost"], row["tv_thread_cost_noise"] = timing.ratio(
            times[("tv", last)], times[("tv", first)])
    if ("base", 1) in times:
        row["baseline_ms@1"] = statistics.median(times[("base", 1)]) * 1e3
        row["vs_baseline"], row["vs_baseline_noise"] = timing.ratio(
            times[("ours", 1)], times[("base", 1)])
        row["floor"] = floor
    return row


def cell(value, noise, width):
    return f"{f'{value:.2f}±{noise:.2f}':>{width}}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=thread_counts, default=[1, 2],
                        help="thread counts, comma-separated (default 1,2)")
    parser.add_argument("--contended", action="store_true",
                        help="run the rows while busy processes hold every core")
    parser.add_argument("--min-run-time", type=float, default=0.05,
                        help="seconds per measurement (one condition, one round)")
    parser.add_argument("--rounds", type=int, default=15,
                        help="interleaved rounds per row: each measures every condition once")
    parser.add_argument("--min-speedup", type=float, default=2.0,
                        help="smallest acceptable one-thread speed-up over torchvision")
    parser.add_argument("--max-thread-cost", type=float, default=1.2,
                        help="largest acceptable 2t/1t under --contended")
    parser.add_argument("--only", default="", help="run only rows whose name contains this text")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.min_run_time <= 0:
        parser.error("--rounds and --min-run-time must be positive")

    ours, tv = load_libraries()
    threads = args.threads
    cost_limit = args.max_thread_cost if args.contended else 1 + 2 * (args.max_thread_cost - 1)
    busy = BusyCores(len(os.sched_getaffinity(0)) if args.contended else 0)
    try:
        load = os.getloadavg()[0]
        print(f"torch {torch.__version__}, opforge_ops {build_label(ours.build_info())}, "
              f"threads {','.join(map(str, threads))}"
              f"{f', contended ({len(busy.procs)} busy processes)' if busy.procs else ''}, "
              f"load {load:.2f}", flush=True)
        columns = "".join(f" {f'ms@{t}':>9} {f'x@{t}':>11}" for t in threads)
        header = (f"{'case':<48}{columns} {'2t/1t':>11} {'tv 2t/1t':>11} {'vs base':>11}")
        print(header)
        print("-" * len(header))
        rows, failures = [], []
        for name, ours_fn, tv_fn, baseline in rows_with_baselines(ours, tv):
            if args.only not in name:
                continue
            torch.set_num_threads(threads[-1])
            assert_agree(name, ours_fn(), tv_fn())
            base_fn, floor = baseline if baseline and 1 in threads else (None, None)
            times = time_row(ours_fn, tv_fn, threads, args.rounds, args.min_run_time, base_fn)
            row = summarize(name, times, threads, floor)
            rows.append(row)
            cells = "".join(f" {row[f'opforge_ms@{t}']:>9.3f} "
                            f"{cell(row[f'speedup@{t}'], row[f'speedup_noise@{t}'], 11)}"
                            for t in threads)
            blank = f"{'':>11}"
            cost = cell(row["thread_cost"], row["thread_cost_noise"], 11) \
                if "thread_cost" in row else blank
            tv_cost = cell(row["tv_thread_cost"], row["tv_thread_cost_noise"], 11) \
                if "tv_thread_cost" in row else blank
            base = cell(row["vs_baseline"], row["vs_baseline_noise"], 11) \
                if "vs_baseline" in row else blank
            print(f"{name:<48}{cells} {cost} {tv_cost} {base}", flush=True)
            if 1 in threads and row["speedup@1"] < args.min_speedup:
                failures.append(f"{name}: {row['speedup@1']:.2f}x torchvision on one thread")
            if row.get("thread_cost", 0) > cost_limit:
                failures.append(f"{name}: {threads[-1]} threads take {row['thread_cost']:.2f}x "
                                f"one thread's time")
            if "vs_baseline" in row and row["vs_baseline"] > row["floor"]:
                failures.append(f"{name}: {row['vs_baseline']:.2f}x its baseline's time "
                                f"(at most {row['floor']})")
    finally:
        busy.close()
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"torch": torch.__version__, "threads": threads, "contended": args.contended,
                       "load": load, "rows": rows}, out, indent=2)
    for failure in failures:
        print(f"below target: {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
