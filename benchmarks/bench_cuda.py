"""CUDA benchmarks: opforge_ops beside torchvision's CUDA ops, same process, same inputs.

    python benchmarks/bench_cuda.py [--repeat 20] [--json results.json]

Cases: nms at 1k, 30k and 100k boxes; roi_align, ps_roi_align, ps_roi_pool forward and forward+backward;
deform_conv2d forward and forward+backward. Times are medians of CUDA-event timings
after warm-up; "ratio" is opforge time / torchvision time (below 1: opforge is faster).
Each case also checks that both libraries agree, so a fast wrong kernel cannot pass.
"""

import argparse
import json
import statistics
import sys

import torch


def fail(message):
    print(f"bench_cuda: {message}", file=sys.stderr)
    raise SystemExit(2)


def load_libraries():
    if not torch.cuda.is_available():
        fail("no CUDA device is available (torch.cuda.is_available() is False); run this on a machine with a GPU")
    try:
        import opforge_ops
    except ImportError as error:
        fail(f"cannot import opforge_ops: {error}")
    if "cuda" not in opforge_ops.build_info().get("backends", []):
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


def boxes_and_scores(n, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    xy = torch.rand(n, 2, device="cuda", generator=g) * 1000
    wh = torch.rand(n, 2, device="cuda", generator=g) * 100 + 1
    return torch.cat([xy, xy + wh], 1), torch.rand(n, device="cuda", generator=g)


def nms_cases():
    for n in (1_000, 30_000, 100_000):
        boxes, scores = boxes_and_scores(n)
        yield (
            f"nms {n // 1000}k boxes",
            lambda b=boxes, s=scores: torch.ops.opforge.nms(b, s, 0.5),
            lambda b=boxes, s=scores: torch.ops.torchvision.nms(b, s, 0.5),
            "equal",
        )


def roi_align_cases():
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(4, 256, 64, 64, device="cuda", generator=g)
    xy = torch.rand(1000, 2, device="cuda", generator=g) * 200
    wh = torch.rand(1000, 2, device="cuda", generator=g) * 56 + 8
    index = torch.randint(0, 4, (1000, 1), device="cuda", generator=g).float()
    rois = torch.cat([index, xy, xy + wh], 1)
    args = (0.25, 7, 7, 2, True)
    yield (
        "roi_align fwd (4x256x64x64, 1000 rois)",
        lambda: torch.ops.opforge.roi_align(x, rois, *args),
        lambda: torch.ops.torchvision.roi_align(x, rois, *args),
        "close",
    )
    xg = x.clone().requires_grad_()
    grad = torch.randn(1000, 256, 7, 7, device="cuda", generator=g)

    def fwd_bwd(op):
        return lambda: torch.autograd.grad(op(xg, rois, *args), xg, grad)[0]

    yield (
        "roi_align fwd+bwd",
        fwd_bwd(torch.ops.opforge.roi_align),
        fwd_bwd(torch.ops.torchvision.roi_align),
        "close",
    )


def ps_roi_cases():
    # R-FCN heads: 10 outputs per 7x7 bin grid (490 channels), 1000 rois.
    g = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(4, 490, 64, 64, device="cuda", generator=g)
    # boxes end before the last row and column, where torchvision's ps_roi_pool backward
    # is not the gradient of its forward
    xy = torch.rand(1000, 2, device="cuda", generator=g) * 180
    wh = torch.rand(1000, 2, device="cuda", generator=g) * 56 + 8
    index = torch.randint(0, 4, (1000, 1), device="cuda", generator=g).float()
    rois = torch.cat([index, xy, xy + wh], 1)
    xg = x.clone().requires_grad_()
    grad = torch.randn(1000, 10, 7, 7, device="cuda", generator=g)
    for name, args in (("ps_roi_align", (0.25, 7, 7, 2)), ("ps_roi_pool", (0.25, 7, 7))):
        ours, theirs = getattr(torch.ops.opforge, name), getattr(torch.ops.torchvision, name)
        yield (
            f"{name} fwd (4x490x64x64, 1000 rois)",
            lambda o=ours, a=args: o(x, rois, *a)[0],
            lambda t=theirs, a=args: t(x, rois, *a)[0],
            "close",
        )
        yield (
            f"{name} fwd+bwd",
            lambda o=ours, a=args: torch.autograd.grad(o(xg, rois, *a)[0], xg, grad)[0],
            lambda t=theirs, a=args: torch.autograd.grad(t(xg, rois, *a)[0], xg, grad)[0],
            "close",
        )


def deform_cases():
    g = torch.Generator(device="cuda").manual_seed(2)
    n, cin, cout, h, w, k = 8, 64, 64, 56, 56, 3
    tensors = [
        torch.randn(n, cin, h, w, device="cuda", generator=g),
        torch.randn(cout, cin, k, k, device="cuda", generator=g) * 0.05,
        torch.randn(n, 2 * k * k, h, w, device="cuda", generator=g),
        torch.rand(n, k * k, h, w, device="cuda", generator=g),
        torch.randn(cout, device="cuda", generator=g),
    ]
    args = (1, 1, 1, 1, 1, 1, 1, 1, True)
    yield (
        f"deform_conv2d fwd ({n}x{cin}x{h}x{w}, {cout}x{cin}x{k}x{k})",
        lambda: torch.ops.opforge.deform_conv2d(*tensors, *args),
        lambda: torch.ops.torchvision.deform_conv2d(*tensors, *args),
        "close",
    )
    leaves = [t.clone().requires_grad_() for t in tensors]
    grad = torch.randn(n, cout, h, w, device="cuda", generator=g)

    def fwd_bwd(op):
        return lambda: torch.autograd.grad(op(*leaves, *args), leaves, grad)

    yield ("deform_conv2d fwd+bwd", fwd_bwd(torch.ops.opforge.deform_conv2d),
           fwd_bwd(torch.ops.torchvision.deform_conv2d), "close")


def agree(ours, theirs, how):
    ours = ours if isinstance(ours, (tuple, list)) else (ours,)
    theirs = theirs if isinstance(theirs, (tuple, list)) else (theirs,)
    for a, b in zip(ours, theirs):
        if how == "equal" and not torch.equal(a, b):
            # Different rounding of an IoU that sits on the threshold flips a decision now and
            # then; more than one in a thousand kept boxes is a real disagreement.
            differing = len(set(a.tolist()) ^ set(b.tolist()))
            if differing > max(2, 1e-3 * b.numel()):
                return f"differ ({differing} indices; {a.numel()} vs {b.numel()} kept)"
            return f"ok ({differing} of {b.numel()} kept indices differ)"
        if how == "close":
            scale = b.abs().max().item() or 1.0
            error = (a - b).abs().max().item()
            if error > 1e-3 * scale:
                return f"differ (max error {error:.3g}, scale {scale:.3g})"
    return "ok"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20, help="timed runs per case (median is reported)")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    options = parser.parse_args(argv)
    opforge_ops = load_libraries()
    torch.backends.cuda.matmul.allow_tf32 = False
    info = opforge_ops.build_info()
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  "
          f"opforge_ops {info['version']} (arch {info.get('cuda_arch_list')})")
    rows = []
    for cases in (nms_cases, roi_align_cases, ps_roi_cases, deform_cases):
        for name, ours, theirs, how in cases():
            check = agree(ours(), theirs(), how)
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
