"""CPU benchmarks: opforge_ops beside torchvision.ops, same process, same inputs, 2 threads.

    python benchmarks/bench_cpu.py [--threads 2] [--min-run-time 1.0] [--json results.json]

Needs torchvision and an opforge_ops built against the same torch (CPU kernels suffice).
Each row times the forward, or forward+backward, of one op with torch.utils.benchmark:
the two libraries are measured in alternation for --rounds rounds and each keeps its best
median, so load from other processes on a shared machine does not decide a row. "ratio" is
opforge time / torchvision time (below 1: opforge is faster). Every row first checks that both libraries agree, so a fast wrong kernel cannot pass.
Exit status 1 if any row is slower than torchvision by more than --tolerance.
"""

import argparse
import json
import sys

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


def boxes_and_scores(n, generator):
    xy = torch.rand(n, 2, generator=generator) * 1000
    wh = torch.rand(n, 2, generator=generator) * 100 + 1
    return torch.cat([xy, xy + wh], 1), torch.rand(n, generator=generator)


def feature_rois(batch, channels, size, num_rois, generator):
    features = torch.randn(batch, channels, size, size, generator=generator)
    xy = torch.rand(num_rois, 2, generator=generator) * size * 0.75
    wh = torch.rand(num_rois, 2, generator=generator) * size * 0.25 + 1
    index = torch.randint(0, batch, (num_rois, 1), generator=generator).float()
    return features, torch.cat([index, xy, xy + wh], 1)


def forward_backward(op, *inputs):
    """A closure running op forward and backward on fresh grads of the float inputs."""
    leaves = [
        t.detach().requires_grad_(t.is_floating_point()) if isinstance(t, torch.Tensor) else t
        for t in inputs
    ]

    def run():
        for t in leaves:
            if isinstance(t, torch.Tensor):
                t.grad = None
        out = op(*leaves)
        out.backward(torch.ones_like(out))
        return [t.grad for t in leaves if isinstance(t, torch.Tensor) and t.requires_grad]

    return run


def cases(ours, tv):
    g = torch.Generator().manual_seed(0)
    for n in (1_000, 5_000):
        boxes, scores = boxes_and_scores(n, g)
        yield (
            f"nms {n} boxes",
            lambda b=boxes, s=scores: ours.nms(b, s, 0.5),
            lambda b=boxes, s=scores: tv.nms(b, s, 0.5),
        )
    # Small calls, where the Python wrappers' argument handling is most of the time.
    boxes, scores = boxes_and_scores(50, g)
    yield (
        "nms 50 boxes",
        lambda: ours.nms(boxes, scores, 0.5),
        lambda: tv.nms(boxes, scores, 0.5),
    )
    idxs = torch.randint(0, 5, (50,), generator=g)
    yield (
        "batched_nms 50 boxes, 5 classes",
        lambda: ours.batched_nms(boxes, scores, idxs, 0.5),
        lambda: tv.batched_nms(boxes, scores, idxs, 0.5),
    )
    small, small_rois = feature_rois(2, 16, 20, 8, g)
    per_image = [small_rois[small_rois[:, 0] == i, 1:] for i in range(2)]
    yield (
        "roi_align fwd 8 rois 16ch 7x7, list boxes",
        lambda: ours.roi_align(small, per_image, 7, 0.5, 2, True),
        lambda: tv.roi_align(small, per_image, 7, 0.5, 2, True),
    )
    boxes, scores = boxes_and_scores(5_000, g)
    idxs = torch.randint(0, 80, (5_000,), generator=g)
    yield (
        "batched_nms 5000 boxes, 80 classes",
        lambda: ours.batched_nms(boxes, scores, idxs, 0.5),
        lambda: tv.batched_nms(boxes, scores, idxs, 0.5),
    )

    # Faster R-CNN box head on one FPN level: 2 images, 256 channels, 512 rois, 7x7.
    features, rois = feature_rois(2, 256, 50, 512, g)
    for aligned in (False, True):
        args = ((7, 7), 0.5, 2, aligned)
        yield (
            f"roi_align fwd 512 rois 256ch 7x7 sr2 aligned={aligned}",
            lambda a=args: ours.roi_align(features, rois, *a),
            lambda a=args: tv.roi_align(features, rois, *a),
        )
    args = ((7, 7), 0.5, -1, True)
    yield (
        "roi_align fwd 512 rois 256ch 7x7 adaptive",
        lambda: ours.roi_align(features, rois, *args),
        lambda: tv.roi_align(features, rois, *args),
    )
    yield (
        "roi_align fwd+bwd 512 rois 256ch 7x7 sr2",
        forward_backward(lambda x, r: ours.roi_align(x, r, (7, 7), 0.5, 2, True), features, rois),
        forward_backward(lambda x, r: tv.roi_align(x, r, (7, 7), 0.5, 2, True), features, rois),
    )
    # Mask head: 14x14 output on fewer rois.
    yield (
        "roi_align fwd+bwd 128 rois 256ch 14x14 sr2",
        forward_backward(
            lambda x, r: ours.roi_align(x, r, (14, 14), 0.5, 2, True), features, rois[:128]
        ),
        forward_backward(
            lambda x, r: tv.roi_align(x, r, (14, 14), 0.5, 2, True), features, rois[:128]
        ),
    )
    yield (
        "roi_pool fwd 512 rois 256ch 7x7",
        lambda: ours.roi_pool(features, rois, (7, 7), 0.5),
        lambda: tv.roi_pool(features, rois, (7, 7), 0.5),
    )
    yield (
        "roi_pool fwd+bwd 512 rois 256ch 7x7",
        forward_backward(lambda x, r: ours.roi_pool(x, r, (7, 7), 0.5), features, rois),
        forward_backward(lambda x, r: tv.roi_pool(x, r, (7, 7), 0.5), features, rois),
    )

    # Quantized (QuantizedCPU kernels): detection post-processing and a box head, quint8.
    boxes, scores = boxes_and_scores(1_000, g)
    qboxes = torch.quantize_per_tensor(boxes, 5.0, 0, torch.qint32)
    qscores_32 = torch.quantize_per_tensor(scores, 0.005, 0, torch.qint32)
    yield (
        "nms quantized qint32 1000 boxes",
        lambda: ours.nms(qboxes, qscores_32, 0.5),
        lambda: tv.nms(qboxes, qscores_32, 0.5),
    )
    qfeatures = torch.quantize_per_tensor(features[:1].relu(), 0.02, 0, torch.quint8)
    rois0 = rois[:256].clone()
    rois0[:, 0] = 0
    qrois = torch.quantize_per_tensor(rois0, 0.125, 0, torch.quint8)
    yield (
        "roi_align quantized quint8 256 rois 256ch 7x7",
        lambda: ours.roi_align(qfeatures, qrois, (7, 7), 0.5, 2, True),
        lambda: tv.roi_align(qfeatures, qrois, (7, 7), 0.5, 2, True),
    )

    # R-FCN heads: position-sensitive score maps, 10 outputs per 7x7 bin grid (490 channels).
    ps_features, ps_rois = feature_rois(2, 490, 50, 512, g)
    yield (
        "ps_roi_align fwd 512 rois 490ch 7x7 sr2",
        lambda: ours.ps_roi_align(ps_features, ps_rois, (7, 7), 0.5, 2),
        lambda: tv.ps_roi_align(ps_features, ps_rois, (7, 7), 0.5, 2),
    )
    yield (
        "ps_roi_align fwd 512 rois 441ch 3x3 adaptive",
        lambda: ours.ps_roi_align(ps_features[:, :441], ps_rois, (3, 3), 0.5, -1),
        lambda: tv.ps_roi_align(ps_features[:, :441], ps_rois, (3, 3), 0.5, -1),
    )
    yield (
        "ps_roi_align fwd+bwd 512 rois 490ch 7x7 sr2",
        forward_backward(lambda x, r: ours.ps_roi_align(x, r, (7, 7), 0.5, 2), ps_features, ps_rois),
        forward_backward(lambda x, r: tv.ps_roi_align(x, r, (7, 7), 0.5, 2), ps_features, ps_rois),
    )
    yield (
        "ps_roi_pool fwd 512 rois 490ch 7x7",
        lambda: ours.ps_roi_pool(ps_features, ps_rois, (7, 7), 0.5),
        lambda: tv.ps_roi_pool(ps_features, ps_rois, (7, 7), 0.5),
    )
    yield (
        "ps_roi_pool fwd+bwd 512 rois 490ch 7x7",
        forward_backward(lambda x, r: ours.ps_roi_pool(x, r, (7, 7), 0.5), ps_features, ps_rois),
        forward_backward(lambda x, r: tv.ps_roi_pool(x, r, (7, 7), 0.5), ps_features, ps_rois),
    )

    if hasattr(ours, "deform_conv2d"):
        for label, (n, c, size, groups, use_mask) in {
            "b8 c64 56x56 mask": (8, 64, 56, 1, True),
            "b1 c256 28x28 mask": (1, 256, 28, 1, True),
            "b4 c128 28x28 og4": (4, 128, 28, 4, False),
        }.items():
            x = torch.randn(n, c, size, size, generator=g)
            weight = torch.randn(c, c, 3, 3, generator=g) * 0.05
            offset = torch.randn(n, 2 * groups * 9, size, size, generator=g)
            mask = torch.rand(n, groups * 9, size, size, generator=g) if use_mask else None
            bias = torch.randn(c, generator=g)

            def call(lib, x, offset, weight, bias, mask):
                return lib.deform_conv2d(x, offset, weight, bias, padding=(1, 1), mask=mask)

            yield (
                f"deform_conv2d fwd {label}",
                lambda x=x, o=offset, w=weight, b=bias, m=mask: call(ours, x, o, w, b, m),
                lambda x=x, o=offset, w=weight, b=bias, m=mask: call(tv, x, o, w, b, m),
            )
            inputs = (x, offset, weight, bias) + ((mask,) if use_mask else ())
            yield (
                f"deform_conv2d fwd+bwd {label}",
                forward_backward(lambda x, o, w, b, m=None: call(ours, x, o, w, b, m), *inputs),
                forward_backward(lambda x, o, w, b, m=None: call(tv, x, o, w, b, m), *inputs),
            )


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
