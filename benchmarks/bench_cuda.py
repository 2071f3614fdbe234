"""CUDA benchmarks: opforge_ops beside torchvision's CUDA ops, same process, same inputs.

    python benchmarks/bench_cuda.py [--repeat 20] [--json results.json] [--dry-run]

The cases are the ops' "cuda" rows in extension/recipes.py (BENCHMARKS), op by op: forward,
and forward+backward against a random output gradient. Times are medians of CUDA-event timings
after warm-up; "ratio" is opforge time / torchvision time (below 1: opforge is faster).
Each case also checks that both libraries agree, so a fast wrong kernel cannot pass.
--dry-run builds every case on the CPU and runs it once through both libraries' CPU kernels
(no GPU needed, nothing timed): a check that the rows are well formed.
"""

import argparse
import json
import statistics
import sys
from functools import partial

import bench_rows
import torch


def fail(message):
    print(f"bench_cuda: {message}", file=sys.stderr)
    raise SystemExit(2)


def load_libraries(dry_run=False):
    if not dry_run and not torch.cuda.is_available():
        fail("no CUDA device is available (torch.cuda.is_available() is False); run this on a machine with a GPU")
    try:
        import opforge_ops
    except ImportError as error:
        fail(f"cannot import opforge_ops: {error}")
    if not dry_run and "cuda" not in opforge_ops.build_info().get("backends", []):
        fail("opforge_ops was built without CUDA kernels (build_info backends); build it with FORCE_CUDA=1")
    try:
        import torchvision  # noqa: F401
        import torchvision.ops  # noqa: F401
    except ImportError as error:
        fail(f"cannot import torchvision, which the comparison needs: {error}")
    return opforge_ops


def time_cuda(fn, repeat, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def forward_backward(call, ops, inputs, grad, grad_output):
    """A closure differentiating call(ops, ...) for inputs[grad] (copies that require grad)."""
    leaves = [t.clone().requires_grad_() if i in grad else t for i, t in enumerate(inputs)]
    wrt = [leaves[i] for i in grad]
    return lambda: torch.autograd.grad(call(ops, *leaves), wrt, grad_output)


def cases(device="cuda"):
    """(name, ours_fn, tv_fn) for each CUDA row of extension/recipes.py's BENCHMARKS, its
    inputs built on `device` when the generator reaches it."""
    ours, theirs = torch.ops.opforge, torch.ops.torchvision
    for _, row in bench_rows.rows("cuda"):
        inputs, call, grad = row["inputs"](device), row["call"], row.get("grad")
        if grad:
            shape = call(ours, *inputs).shape
            g = torch.Generator(device=device).manual_seed(0)
            grad_output = torch.randn(shape, device=device, generator=g)
            yield (row["label"], forward_backward(call, ours, inputs, grad, grad_output),
                   forward_backward(call, theirs, inputs, grad, grad_output))
        else:
            yield row["label"], partial(call, ours, *inputs), partial(call, theirs, *inputs)


def agree(ours, theirs):
    """Indices (nms) must be equal up to a few flips, floating results close."""
    ours = ours if isinstance(ours, (tuple, list)) else (ours,)
    theirs = theirs if isinstance(theirs, (tuple, list)) else (theirs,)
    for a, b in zip(ours, theirs):
        if not b.is_floating_point() and not torch.equal(a, b):
            # Different rounding of an IoU that sits on the threshold flips a decision now and
            # then; more than one in a thousand kept boxes is a real disagreement.
            differing = len(set(a.tolist()) ^ set(b.tolist()))
            if differing > max(2, 1e-3 * b.numel()):
                return f"differ ({differing} indices; {a.numel()} vs {b.numel()} kept)"
            return f"ok ({differing} of {b.numel()} kept indices differ)"
        if b.is_floating_point():
            scale = b.abs().max().item() or 1.0
            error = (a - b).abs().max().item()
            if error > 1e-3 * scale:
                return f"differ (max error {error:.3g}, scale {scale:.3g})"
    return "ok"


def dry_run():
    print(f"dry run on the CPU: torch {torch.__version__}, no GPU timing")
    checks = []
    for name, ours, theirs in cases("cpu"):
        checks.append(agree(ours(), theirs()))
        print(f"{name:<44}  {checks[-1]}", flush=True)
    return 0 if checks and all(c.startswith("ok") for c in checks) else 1


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20, help="timed runs per case (median is reported)")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    parser.add_argument("--dry-run", action="store_true",
                        help="run each case once on the CPU, check agreement, time nothing")
    options = parser.parse_args(argv)
    opforge_ops = load_libraries(options.dry_run)
    if options.dry_run:
        return dry_run()
    torch.backends.cuda.matmul.allow_tf32 = False
    info = opforge_ops.build_info()
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  "
          f"opforge_ops {info['version']} (arch {info.get('cuda_arch_list')})")
    rows = []
    for name, ours, theirs in cases():
        check = agree(ours(), theirs())
        t_ours = time_cuda(ours, options.repeat)
        t_theirs = time_cuda(theirs, options.repeat)
        rows.append(dict(case=name, opforge_ms=t_ours, torchvision_ms=t_theirs,
                         ratio=t_ours / t_theirs, agree=check))
        torch.cuda.empty_cache()
    width = max(len(r["case"]) for r in rows)
    print(f"{'case':<{width}}  {'opforge ms':>11}  {'torchvision ms':>14}  {'ratio':>6}  agree")
    for r in rows:
        print(f"{r['case']:<{width}}  {r['opforge_ms']:>11.3f}  {r['torchvision_ms']:>14.3f}  "
              f"{r['ratio']:>6.2f}  {r['agree']}")
    if options.json:
        with open(options.json, "w") as out:
            json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, rows=rows), out, indent=2)
    return 0 if all(r["agree"].startswith("ok") for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
