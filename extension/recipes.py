"""How `opforge smoke` calls each op of torch.ops.opforge (matrix.yaml: extension.recipes).

Loaded by the smoke probe inside the environment under test, so it imports only the standard
library and torch. Inputs are built on the CPU; the probe moves tensors to every present
device and compares each device with the CPU. docs/adopt.md describes every field.
"""

import torch


def _boxes():
    dets = torch.tensor([[0.0, 0.0, 10.0, 10.0], [1.0, 1.0, 11.0, 11.0],
                         [50.0, 50.0, 60.0, 60.0], [0.0, 0.0, 9.0, 10.0],
                         [52.0, 50.0, 62.0, 61.0]])
    scores = torch.tensor([0.9, 0.8, 0.7, 0.95, 0.6])
    return dets, scores


def _rois():
    return torch.tensor([[0.0, 0.5, 0.5, 4.5, 3.5], [0.0, 1.0, 0.0, 3.0, 4.0],
                         [1.0, 0.0, 0.0, 5.0, 5.0]])


def _features(channels, dtype):
    g = torch.Generator().manual_seed(0)
    return torch.rand(2, channels, 6, 6, generator=g).to(dtype)


def nms_inputs(dtype):
    dets, scores = _boxes()
    return [dets.to(dtype), scores.to(dtype), 0.5]


# Output grids are 2 x 3, not square, so a kernel (or a fake kernel: extension/tests/
# test_fake_rules.py builds its valid calls from these recipes) that swaps height and width fails.
def roi_align_inputs(dtype):
    return [_features(3, dtype), _rois().to(dtype), 1.0, 2, 3, 2, True]


def roi_pool_inputs(dtype):
    return [_features(3, dtype), _rois().to(dtype), 1.0, 2, 3]


def ps_roi_align_inputs(dtype):
    # 2 output channels per bin of a 2x3 grid: 12 input channels
    return [_features(12, dtype), _rois().to(dtype), 1.0, 2, 3, 2]


def ps_roi_pool_inputs(dtype):
    return [_features(12, dtype), _rois().to(dtype), 1.0, 2, 3]


def deform_conv2d_inputs(dtype):
    g = torch.Generator().manual_seed(1)
    x = torch.rand(1, 2, 5, 5, generator=g)
    w = torch.rand(3, 2, 3, 3, generator=g)
    b = torch.rand(3, generator=g)
    # no padding: the 3x3 output is not the input's 5x5, so a wrong output shape shows
    offset = torch.rand(1, 18, 3, 3, generator=g) - 0.5
    mask = torch.rand(1, 9, 3, 3, generator=g)
    tensors = [t.to(dtype) for t in (x, w, offset, mask, b)]
    return [*tensors, 1, 1, 0, 0, 1, 1, 1, 1, True]


def constant_map_gives_the_constant(call, args, out):
    """roi_align / roi_pool of a map constant per channel give that constant in every bin."""
    channels = args[0].shape[1]
    x = torch.arange(1.0, 1.0 + channels).view(1, -1, 1, 1).expand_as(args[0]).contiguous()
    res = call(x, *args[1:])
    res = res[0] if isinstance(res, (tuple, list)) else res
    want = torch.arange(1.0, 1.0 + channels).view(1, -1, 1, 1).expand_as(res)
    if not torch.allclose(res, want, atol=1e-5):
        return "on a constant feature map it did not return the constant"
    return None


def each_bin_reads_its_own_channel(call, args, out):
    """ps_roi_align / ps_roi_pool of a map whose channel k is the constant k + 1: output channel
    c of bin (i, j) gives the constant of input channel (c * PH + i) * PW + j."""
    channels, pooled_height, pooled_width = args[0].shape[1], args[3], args[4]
    x = torch.arange(1.0, 1.0 + channels).view(1, -1, 1, 1).expand_as(args[0]).contiguous()
    res = call(x, *args[1:])[0]
    want = torch.arange(1.0, 1.0 + channels).view(1, -1, pooled_height, pooled_width).expand_as(res)
    if not torch.allclose(res, want, atol=1e-5):
        return "on a map constant per channel, a bin did not return its own channel's constant"
    return None


def zero_offsets_give_conv2d(call, args, out):
    """Zero offsets and a mask of ones make deformable convolution a plain convolution."""
    x, w, offset, mask, b = args[:5]
    got = call(x, w, torch.zeros_like(offset), torch.ones_like(mask), b, *args[5:])
    stride, padding, dilation, groups = args[5:7], args[7:9], args[9:11], args[11]
    want = torch.nn.functional.conv2d(x, w, b, stride=stride, padding=padding, dilation=dilation, groups=groups)
    if not torch.allclose(got, want, atol=1e-5, rtol=1e-4):
        return f"with zero offsets it differs from conv2d by {float((got - want).abs().max()):.3g}"
    return None


# ----------------------------------------------------------------------------- workloads
# `opforge bench` times each op on these shapes (forward, and backward where `grad` says) against
# torchvision's kernel; the smoke speed check times the first one (small) against the CPU.


def _torchvision(op):
    """torchvision's kernel of the same schema (torchvision is imported only when bench calls it)."""
    def reference(*args):
        import torchvision  # noqa: F401 - registers torch.ops.torchvision

        return getattr(torch.ops.torchvision, op)(*args)
    reference.__name__ = f"torchvision::{op}"
    return reference


def _random_boxes(n, size, g):
    xy = torch.rand(n, 2, generator=g) * size
    wh = torch.rand(n, 2, generator=g) * size / 4 + 1
    return torch.cat([xy, xy + wh], dim=1)


def _nms_load(n):
    def inputs(dtype):
        g = torch.Generator().manual_seed(n)
        return [_random_boxes(n, 512.0, g).to(dtype), torch.rand(n, generator=g).to(dtype), 0.5]
    return {"inputs": inputs}


def _roi_load(batch, channels, size, rois, extra, interior=False):
    """Features batch x channels x size x size, `rois` boxes spread over the batch. interior:
    boxes stay off the last row and column, where torchvision's ps_roi_pool backward spreads
    gradient its forward never read from (ours is the gradient of the forward: see README)."""
    def inputs(dtype):
        g = torch.Generator().manual_seed(channels * size + rois)
        x = torch.rand(batch, channels, size, size, generator=g)
        index = torch.randint(0, batch, (rois, 1), generator=g).float()
        boxes = _random_boxes(rois, size * 0.9, g)
        if interior:
            boxes = boxes.clamp(max=size - 2)
        return [x.to(dtype), torch.cat([index, boxes], dim=1).to(dtype), *extra]
    return {"inputs": inputs}


def _roi_workloads(pooled, extra_tail, channels_per_bin=None, interior=False):
    """small / medium / large for the four RoI ops; ps_ ops need channels = C * PH * PW."""
    def channels(c):
        return c if channels_per_bin is None else channels_per_bin * c * pooled * pooled // 16
    head = [1.0, pooled, pooled]
    return {"small": _roi_load(1, channels(16), 32, 32, [*head, *extra_tail], interior),
            "medium": _roi_load(2, channels(64), 64, 128, [*head, *extra_tail], interior),
            "large": _roi_load(2, channels(256), 64, 512, [*head, *extra_tail], interior)}


def plain_conv2d(x, weight, offset, mask, bias, stride_h, stride_w, pad_h, pad_w, dil_h, dil_w,
                  groups, offset_groups, use_mask):
    """The plain convolution a deformable one generalises (its offsets at zero), on the same
    arguments: what a deform workload's forward is timed beside."""
    return torch.nn.functional.conv2d(x, weight, bias, (stride_h, stride_w), (pad_h, pad_w),
                                      (dil_h, dil_w), groups)


def _deform_load(batch, channels, size):
    def inputs(dtype):
        g = torch.Generator().manual_seed(channels * size)
        x = torch.rand(batch, channels, size, size, generator=g)
        w = torch.rand(channels, channels, 3, 3, generator=g) / channels
        offset = torch.rand(batch, 18, size, size, generator=g) * 2 - 1
        mask = torch.rand(batch, 9, size, size, generator=g)
        b = torch.rand(channels, generator=g)
        return [*(t.to(dtype) for t in (x, w, offset, mask, b)), 1, 1, 1, 1, 1, 1, 1, 1, True]
    return {"inputs": inputs, "plain": plain_conv2d}


RECIPES = {
    # boxes 3, 0, 1 overlap (IoU > 0.5): 3 wins; boxes 2 and 4 overlap: 2 wins
    "nms": {"inputs": nms_inputs, "expected": [3, 2], "autocast": [0],
            "reference": "torchvision.ops.nms",
            "workloads": {"small": _nms_load(200), "medium": _nms_load(2000),
                          "large": _nms_load(10000)}},
    "roi_align": {"inputs": roi_align_inputs, "check": constant_map_gives_the_constant,
                  "grad": [0], "autocast": [0], "reference": _torchvision("roi_align"),
                  "workloads": _roi_workloads(7, [2, False])},
    # argmax ties may legitimately resolve differently per device: compare the values only
    "roi_pool": {"inputs": roi_pool_inputs, "check": constant_map_gives_the_constant,
                 "grad": [0], "outputs": [0], "reference": _torchvision("roi_pool"),
                 "workloads": _roi_workloads(7, [])},
    "ps_roi_align": {"inputs": ps_roi_align_inputs, "check": each_bin_reads_its_own_channel,
                     "grad": [0], "autocast": [0], "reference": _torchvision("ps_roi_align"),
                     "workloads": _roi_workloads(4, [2], channels_per_bin=1)},
    "ps_roi_pool": {"inputs": ps_roi_pool_inputs, "check": each_bin_reads_its_own_channel,
                    "grad": [0], "autocast": [0], "reference": _torchvision("ps_roi_pool"),
                    "workloads": _roi_workloads(4, [], channels_per_bin=1, interior=True)},
    "deform_conv2d": {"inputs": deform_conv2d_inputs, "check": zero_offsets_give_conv2d,
                      "grad": [0, 1, 2, 3, 4], "reference": _torchvision("deform_conv2d"),
                      "workloads": {"small": _deform_load(1, 8, 16), "medium": _deform_load(2, 32, 32),
                                    "large": _deform_load(4, 64, 64)}},
}


# ----------------------------------------------------------------------------- benchmark rows
# benchmarks/bench_cpu.py and bench_cuda.py time these rows beside torchvision and name no op:
# BENCHMARKS[op] maps "cpu" and "cuda" to that op's rows (every op of RECIPES has an entry).
# Not a recipe field: opforge validates those, and these calls go through the Python API.
#   label   the row's name in the tables; kept unchanged so that results compare across notes
#   inputs  (device) -> arguments, drawn from a generator of that device (rows of one op that
#           share a seed see the same values)
#   call    (lib, *arguments) -> output: lib is the package (opforge_ops or torchvision.ops) in
#           cpu rows, the op namespace (torch.ops.opforge or torch.ops.torchvision) in cuda rows
#   grad    argument indices that get a gradient: a forward+backward row (absent: forward only)
#   baseline, floor  (cpu rows) (*arguments) -> output of a plain torch op the row is also timed
#           against on one thread (deform_conv2d: conv2d), and the largest time ratio it allows


def _row(label, inputs, call, grad=None, **baseline):
    return {"label": label, "inputs": inputs, "call": call, **({"grad": grad} if grad else {}),
            **baseline}


def _draw(device, seed):
    g = torch.Generator(device=device).manual_seed(seed)
    return (lambda *shape: torch.rand(*shape, generator=g, device=device),
            lambda *shape: torch.randn(*shape, generator=g, device=device),
            lambda high, *shape: torch.randint(0, high, shape, generator=g, device=device))


def _detections(n, classes=0, seed=None):
    """n boxes of 1 to 101 px on a 1000 px image, their scores and (classes > 0) class ids."""
    def inputs(device):
        rand, _, randint = _draw(device, n if seed is None else seed)
        xy = rand(n, 2) * 1000
        wh = rand(n, 2) * 100 + 1
        out = [torch.cat([xy, xy + wh], 1), rand(n)]
        return out + [randint(classes, n)] if classes else out
    return inputs


def _quantized_detections(device):
    boxes, scores = _detections(1_000)(device)
    return [torch.quantize_per_tensor(boxes, 5.0, 0, torch.qint32),
            torch.quantize_per_tensor(scores, 0.005, 0, torch.qint32)]


def _feature_rois(batch, channels, size, rois, seed=0):
    """cpu rows: features and `rois` boxes in the top-left three quarters, up to a quarter wide."""
    def inputs(device):
        rand, randn, randint = _draw(device, seed)
        x = randn(batch, channels, size, size)
        xy = rand(rois, 2) * size * 0.75
        wh = rand(rois, 2) * size * 0.25 + 1
        return [x, torch.cat([randint(batch, rois, 1).float(), xy, xy + wh], 1)]
    return inputs


def _per_image(inputs):
    """The same rois as a list of per-image boxes (the Python API's other form)."""
    def listed(device):
        x, rois = inputs(device)
        return [x, [rois[rois[:, 0] == i, 1:] for i in range(x.shape[0])]]
    return listed


def _first_rois(inputs, n):
    def first(device):
        x, rois = inputs(device)
        return [x, rois[:n]]
    return first


def _quantized_box_head(device):
    """quint8: the box head's first image and 256 of its rois, all moved to that image."""
    x, rois = _BOX_HEAD(device)
    rois = rois[:256].clone()
    rois[:, 0] = 0
    return [torch.quantize_per_tensor(x[:1].relu(), 0.02, 0, torch.quint8),
            torch.quantize_per_tensor(rois, 0.125, 0, torch.quint8)]


def _cuda_rois(channels, seed, reach):
    """cuda rows: 4 x channels x 64 x 64 features, 1000 boxes of 8 to 64 px starting below
    `reach` (on the input image; spatial scale 0.25)."""
    def inputs(device):
        rand, randn, randint = _draw(device, seed)
        x = randn(4, channels, 64, 64)
        xy = rand(1000, 2) * reach
        wh = rand(1000, 2) * 56 + 8
        return [x, torch.cat([randint(4, 1000, 1).float(), xy, xy + wh], 1)]
    return inputs


def _deform_inputs(n, c, size, offset_groups, mask, seed=0):
    """x, offset, weight, bias[, mask] of a 3x3 c -> c deformable convolution."""
    def inputs(device):
        rand, randn, _ = _draw(device, seed)
        x = randn(n, c, size, size)
        weight = randn(c, c, 3, 3) * 0.05
        offset = randn(n, 2 * offset_groups * 9, size, size)
        masks = [rand(n, offset_groups * 9, size, size)] if mask else []
        return [x, offset, weight, randn(c), *masks]
    return inputs


def _cuda_deform_inputs(device):
    """x, weight, offset, mask, bias in the op's order: 8 x 64 x 56 x 56, 64 x 64 x 3 x 3."""
    rand, randn, _ = _draw(device, 2)
    return [randn(8, 64, 56, 56), randn(64, 64, 3, 3) * 0.05, randn(8, 18, 56, 56),
            rand(8, 9, 56, 56), randn(64)]


# Faster R-CNN box head on one FPN level: 2 images, 256 channels, 512 rois (mask head: 128)
_BOX_HEAD = _feature_rois(2, 256, 50, 512)
# R-FCN heads: position-sensitive score maps, 10 outputs per 7x7 bin grid (490 channels)
_RFCN_HEAD = _feature_rois(2, 490, 50, 512, seed=1)
# boxes end before the last row and column, where torchvision's ps_roi_pool backward is not the
# gradient of its forward; 10 outputs per 7x7 bin grid
_CUDA_RFCN = _cuda_rois(490, seed=3, reach=180)


def _deform_rows(label, n, c, size, offset_groups, mask):
    inputs = _deform_inputs(n, c, size, offset_groups, mask)

    def call(lib, x, offset, weight, bias, mask=None):
        return lib.deform_conv2d(x, offset, weight, bias, padding=(1, 1), mask=mask)
    grad = list(range(5 if mask else 4))
    return [_row(f"deform_conv2d fwd {label}", inputs, call),
            _row(f"deform_conv2d fwd+bwd {label}", inputs, call, grad)]


def _deform_vs_conv(label, n, c, size):
    """deform_conv2d's forward beside a plain conv2d of the same shape, on one thread: the
    sampling im2col on top of the same GEMM may cost at most half a conv2d more."""
    def conv(x, offset, weight, bias):
        return torch.nn.functional.conv2d(x, weight, bias, padding=1)
    return _row(f"deform_conv2d fwd {label}, vs conv2d", _deform_inputs(n, c, size, 1, False),
                lambda lib, x, offset, weight, bias: lib.deform_conv2d(x, offset, weight, bias,
                                                                       padding=(1, 1)),
                baseline=conv, floor=1.5)


def _cuda_fwd_and_bwd(op, shape, inputs, call, grad=(0,)):
    return [_row(f"{op} fwd ({shape})", inputs, call),
            _row(f"{op} fwd+bwd", inputs, call, list(grad))]


BENCHMARKS = {
    "nms": {
        "cpu": [
            _row("nms 1000 boxes", _detections(1_000), lambda lib, b, s: lib.nms(b, s, 0.5)),
            _row("nms 5000 boxes", _detections(5_000), lambda lib, b, s: lib.nms(b, s, 0.5)),
            # small calls, where the Python wrappers' argument handling is most of the time
            _row("nms 50 boxes", _detections(50), lambda lib, b, s: lib.nms(b, s, 0.5)),
            _row("batched_nms 50 boxes, 5 classes", _detections(50, classes=5),
                 lambda lib, b, s, i: lib.batched_nms(b, s, i, 0.5)),
            _row("batched_nms 5000 boxes, 80 classes", _detections(5_000, classes=80),
                 lambda lib, b, s, i: lib.batched_nms(b, s, i, 0.5)),
            # QuantizedCPU kernels: detection post-processing
            _row("nms quantized qint32 1000 boxes", _quantized_detections,
                 lambda lib, b, s: lib.nms(b, s, 0.5)),
        ],
        "cuda": [_row(f"nms {n // 1000}k boxes", _detections(n, seed=0),
                      lambda ops, b, s: ops.nms(b, s, 0.5))
                 for n in (1_000, 30_000, 100_000)],
    },
    "roi_align": {
        "cpu": [
            _row("roi_align fwd 8 rois 16ch 7x7, list boxes",
                 _per_image(_feature_rois(2, 16, 20, 8)),
                 lambda lib, x, boxes: lib.roi_align(x, boxes, 7, 0.5, 2, True)),
            *(_row(f"roi_align fwd 512 rois 256ch 7x7 sr2 aligned={aligned}", _BOX_HEAD,
                   lambda lib, x, r, a=aligned: lib.roi_align(x, r, (7, 7), 0.5, 2, a))
              for aligned in (False, True)),
            _row("roi_align fwd 512 rois 256ch 7x7 adaptive", _BOX_HEAD,
                 lambda lib, x, r: lib.roi_align(x, r, (7, 7), 0.5, -1, True)),
            _row("roi_align fwd+bwd 512 rois 256ch 7x7 sr2", _BOX_HEAD,
                 lambda lib, x, r: lib.roi_align(x, r, (7, 7), 0.5, 2, True), grad=[0, 1]),
            _row("roi_align fwd+bwd 128 rois 256ch 14x14 sr2", _first_rois(_BOX_HEAD, 128),
                 lambda lib, x, r: lib.roi_align(x, r, (14, 14), 0.5, 2, True), grad=[0, 1]),
            _row("roi_align quantized quint8 256 rois 256ch 7x7", _quantized_box_head,
                 lambda lib, x, r: lib.roi_align(x, r, (7, 7), 0.5, 2, True)),
        ],
        "cuda": _cuda_fwd_and_bwd("roi_align", "4x256x64x64, 1000 rois",
                                  _cuda_rois(256, seed=1, reach=200),
                                  lambda ops, x, r: ops.roi_align(x, r, 0.25, 7, 7, 2, True)),
    },
    "roi_pool": {
        "cpu": [_row(f"roi_pool {kind} 512 rois 256ch 7x7", _BOX_HEAD,
                     lambda lib, x, r: lib.roi_pool(x, r, (7, 7), 0.5), grad)
                for kind, grad in (("fwd", None), ("fwd+bwd", [0, 1]))],
        "cuda": [],  # none yet
    },
    "ps_roi_align": {
        "cpu": [
            _row("ps_roi_align fwd 512 rois 490ch 7x7 sr2", _RFCN_HEAD,
                 lambda lib, x, r: lib.ps_roi_align(x, r, (7, 7), 0.5, 2)),
            _row("ps_roi_align fwd 512 rois 441ch 3x3 adaptive", _RFCN_HEAD,
                 lambda lib, x, r: lib.ps_roi_align(x[:, :441], r, (3, 3), 0.5, -1)),
            _row("ps_roi_align fwd+bwd 512 rois 490ch 7x7 sr2", _RFCN_HEAD,
                 lambda lib, x, r: lib.ps_roi_align(x, r, (7, 7), 0.5, 2), grad=[0, 1]),
        ],
        "cuda": _cuda_fwd_and_bwd("ps_roi_align", "4x490x64x64, 1000 rois", _CUDA_RFCN,
                                  lambda ops, x, r: ops.ps_roi_align(x, r, 0.25, 7, 7, 2)[0]),
    },
    "ps_roi_pool": {
        "cpu": [_row(f"ps_roi_pool {kind} 512 rois 490ch 7x7", _RFCN_HEAD,
                     lambda lib, x, r: lib.ps_roi_pool(x, r, (7, 7), 0.5), grad)
                for kind, grad in (("fwd", None), ("fwd+bwd", [0, 1]))],
        "cuda": _cuda_fwd_and_bwd("ps_roi_pool", "4x490x64x64, 1000 rois", _CUDA_RFCN,
                                  lambda ops, x, r: ops.ps_roi_pool(x, r, 0.25, 7, 7)[0]),
    },
    "deform_conv2d": {
        "cpu": [*_deform_rows("b8 c64 56x56 mask", 8, 64, 56, 1, True),
                *_deform_rows("b1 c256 28x28 mask", 1, 256, 28, 1, True),
                *_deform_rows("b4 c128 28x28 og4", 4, 128, 28, 4, False),
                _deform_vs_conv("b8 c64 56x56", 8, 64, 56)],
        "cuda": _cuda_fwd_and_bwd("deform_conv2d", "8x64x56x56, 64x64x3x3",
                                  _cuda_deform_inputs,
                                  lambda ops, *t: ops.deform_conv2d(*t, 1, 1, 1, 1, 1, 1, 1, 1, True),
                                  grad=range(5)),
    },
}
