"""CPU benchmarks: opforge_ops beside torchvision.ops, same process, same inputs, 2 threads.

    python benchmarks/bench_cpu.py [--threads 2] [--min-run-time 1.0] [--json results.json]

Needs torchvision and an opforge_ops built against the same torch (CPU kernels suffice).
The rows are the ops' "cpu" rows in extension/recipes.py (BENCHMARKS), op by op.
Each row times the forward, or forward+backward, of one op with torch.utils.benchmark:
the two libraries are measured in alternation for --rounds rounds and each keeps its best
median, so load from other processes on a shared machine does not decide a row. "ratio" is
opforge time / torchvision time (below 1: opforge is faster). Every row first checks that both libraries agree, so a fast wrong kernel cannot pass.
Exit status 1 if any row is slower than torchvision by more than --tolerance.
"""

import argparse
import json
import sys
from functools import partial

import bench_rows
import torch
import torch.utils.benchmark as benchmark


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

    def run():
        for i in grad:
            leaves[i].grad = None
        out = call(lib, *leaves)
        out.backward(torch.ones_like(out))
        return [leaves[i].grad for i in grad]

    return run


def cases(ours, tv):
    """(name, ours_fn, tv_fn) for each CPU row of extension/recipes.py's BENCHMARKS; a row's
    inputs are built when the generator reaches it."""
    for op, row in bench_rows.rows("cpu"):
        if not hasattr(ours, op):  # a build without the op (bench_abi.py compares two builds)
            continue
        inputs, call, grad = row["inputs"]("cpu"), row["call"], row.get("grad")
        if grad:
            yield (row["label"], forward_backward(call, ours, inputs, grad),
                   forward_backward(call, tv, inputs, grad))
        else:
            yield row["label"], partial(call, ours, *inputs), partial(call, tv, *inputs)


def assert_agree(name, ours, theirs):
    if ours is None and theirs is None:  # neither library gives this input a gradient
        return
    if isinstance(ours, torch.Tensor) and ours.is_quantized:
        if not torch.equal(ours.int_repr(), theirs.int_repr()):
            fail(f"{name}: opforge and torchvision disagree")
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


def measure(fn, min_run_time):
    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    return timer.blocked_autorange(min_run_time=min_run_time).median


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2)")
    parser.add_argument("--min-run-time", type=float, default=1.0, help="seconds per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="alternating measurements per row")
    parser.add_argument("--tolerance", type=float, default=1.05, help="largest acceptable ratio")
    parser.add_argument("--only", default="", help="run only rows whose name contains this text")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args(argv)

    ours, tv = load_libraries()
    torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, opforge_ops {build_label(ours.build_info())}, "
        f"threads {torch.get_num_threads()}",
        flush=True,
    )
    rows = []
    header = f"{'case':<44} {'opforge ms':>11} {'torchvision ms':>15} {'ratio':>7}"
    print(header)
    print("-" * len(header))
    for name, ours_fn, tv_fn in cases(ours, tv):
        if args.only not in name:
            continue
        assert_agree(name, ours_fn(), tv_fn())
        ours_s = tv_s = float("inf")
        for _ in range(args.rounds):
            ours_s = min(ours_s, measure(ours_fn, args.min_run_time))
            tv_s = min(tv_s, measure(tv_fn, args.min_run_time))
        rows.append(
            {
                "case": name,
                "opforge_ms": ours_s * 1e3,
                "torchvision_ms": tv_s * 1e3,
                "ratio": ours_s / tv_s,
            }
        )
        print(
            f"{name:<44} {ours_s * 1e3:>11.3f} {tv_s * 1e3:>15.3f} {ours_s / tv_s:>7.2f}",
            flush=True,
        )
    if args.json:
        with open(args.json, "w") as out:
            json.dump(
                {"torch": torch.__version__, "threads": args.threads, "rows": rows}, out, indent=2
            )
    slower = [row["case"] for row in rows if row["ratio"] > args.tolerance]
    if slower:
        print(f"slower than torchvision (ratio > {args.tolerance}): {', '.join(slower)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
