"""The differential table: every public op of opforge_ops called exactly as on torchvision.ops.

A Case names the op, builds fresh inputs (seeded, so two builds are identical) and calls the op
through a namespace (``torchvision.ops`` or ``opforge_ops``). The suite runs each case on both
and compares values (and gradients), or exception types when torchvision rejects the input.

Adding an op is one entry in CASES: ``CASES["ps_roi_align"] = ps_roi_align_cases`` where the
function yields Case objects. ``DIFFERENCES`` lists the inputs where opforge deliberately
raises instead of reproducing torchvision's undefined behaviour (extension/README.md explains
each); ``TORCHVISION_CRASHES`` the inputs torchvision's own kernels crash the process on, where
only opforge's answer is checked.
"""

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

Inputs = tuple[Any, ...]


@dataclass(frozen=True)
class Case:
    op: str  # the public name in both namespaces
    name: str
    make: Callable[[], Inputs]  # fresh inputs; called under a fixed seed
    call: Callable[[Any, Inputs], Any]  # (namespace, inputs) -> result
    grad: bool = False  # also compare the gradients of the floating-point input tensors

    @property
    def id(self) -> str:
        return f"{self.op}-{self.name}"


FLOAT_DTYPES = (torch.float32, torch.float64)


def rois(k: int, batch: int, height: int, width: int, dtype=torch.float32) -> torch.Tensor:
    """[K, 5] rois with valid batch indices, some reaching past the image border."""
    x1 = torch.rand(k) * (width + 2) - 1
    y1 = torch.rand(k) * (height + 2) - 1
    w = torch.rand(k) * width * 0.8
    h = torch.rand(k) * height * 0.8
    index = torch.randint(0, max(batch, 1), (k,)).to(torch.float64)
    return torch.stack([index, x1, y1, x1 + w, y1 + h], dim=1).to(dtype)


def boxes(n: int, dtype=torch.float32, spread: float = 50.0) -> torch.Tensor:
    xy = torch.rand(n, 2) * spread
    wh = torch.rand(n, 2) * 20 + 0.1
    return torch.cat([xy, xy + wh], dim=1).to(dtype)


def layout(x: torch.Tensor, kind: str) -> torch.Tensor:
    """Same values, other memory layouts."""
    if kind == "contiguous":
        return x
    if kind == "channels_last":
        return x.contiguous(memory_format=torch.channels_last)
    if kind == "strided":  # a non-contiguous view holding the same values
        wide = torch.zeros(*x.shape[:-1], x.shape[-1] * 2, dtype=x.dtype)
        wide[..., ::2] = x
        return wide[..., ::2]
    raise ValueError(kind)


# --- nms / batched_nms ---------------------------------------------------------------


def _nms(ns, a):
    return ns.nms(*a)


def _batched_nms(ns, a):
    return ns.batched_nms(*a)


def nms_cases() -> Iterator[Case]:
    for dtype, n, threshold in itertools.product(FLOAT_DTYPES, (0, 1, 7, 60), (0.0, 0.3, 0.7, 1.0)):
        yield Case("nms", f"{dtype}-n{n}-iou{threshold}",
                   lambda dtype=dtype, n=n, t=threshold: (boxes(n, dtype), torch.rand(n, dtype=dtype), t), _nms)
    yield Case("nms", "ties-keep-input-order",
               lambda: (boxes(30).round(), torch.randint(0, 3, (30,)).float(), 0.5), _nms)
    yield Case("nms", "duplicate-boxes", lambda: (boxes(1).repeat(5, 1), torch.rand(5), 0.5), _nms)
    yield Case("nms", "zero-area-boxes", lambda: (torch.zeros(4, 4), torch.rand(4), 0.5), _nms)
    yield Case("nms", "non-contiguous",
               lambda: (boxes(20).t().contiguous().t(), torch.rand(40)[::2], 0.5), _nms)
    yield Case("nms", "large", lambda: (boxes(1500, spread=300), torch.rand(1500), 0.5), _nms)
    malformed = {
        "boxes-1d": lambda: (torch.rand(4), torch.rand(4), 0.5),
        "boxes-3-columns": lambda: (torch.rand(4, 3), torch.rand(4), 0.5),
        "boxes-3d": lambda: (torch.rand(4, 4, 1), torch.rand(4), 0.5),
        "scores-2d": lambda: (boxes(4), torch.rand(4, 1), 0.5),
        "length-mismatch": lambda: (boxes(4), torch.rand(3), 0.5),
        "dtype-mismatch": lambda: (boxes(4), torch.rand(4, dtype=torch.float64), 0.5),
        "integer-scores": lambda: (boxes(4), torch.arange(4), 0.5),
        "integer-boxes": lambda: (boxes(4).int(), torch.rand(4), 0.5),
        "empty-1d": lambda: (torch.zeros(0), torch.zeros(0), 0.5),
    }
    for name, make in malformed.items():
        yield Case("nms", name, make, _nms)


def batched_nms_cases() -> Iterator[Case]:
    # 4000 box coordinates is where torchvision (and opforge) switch to one nms per category.
    for dtype, n, categories in itertools.product(FLOAT_DTYPES, (0, 1, 9, 200, 1001), (1, 3, 50)):
        yield Case("batched_nms", f"{dtype}-n{n}-c{categories}",
                   lambda dtype=dtype, n=n, c=categories: (
                       boxes(n, dtype, spread=200), torch.rand(n, dtype=dtype),
                       torch.randint(0, c, (n,)), 0.5), _batched_nms)
    yield Case("batched_nms", "empty-over-threshold-strategy",
               lambda: (torch.zeros(0, 4), torch.zeros(0), torch.zeros(0, dtype=torch.int64), 0.5), _batched_nms)
    yield Case("batched_nms", "float-idxs",
               lambda: (boxes(30), torch.rand(30), torch.randint(0, 3, (30,)).float(), 0.5), _batched_nms)
    yield Case("batched_nms", "one-idx-for-all",
               lambda: (boxes(30), torch.rand(30), torch.zeros(1, dtype=torch.int64), 0.5), _batched_nms)
    yield Case("batched_nms", "negative-categories",
               lambda: (boxes(40), torch.rand(40), torch.randint(-3, 3, (40,)), 0.5), _batched_nms)
    malformed = {
        "idxs-length": lambda: (boxes(5), torch.rand(5), torch.zeros(3, dtype=torch.int64), 0.5),
        "idxs-0d": lambda: (boxes(5), torch.rand(5), torch.tensor(1), 0.5),
        "idxs-2d": lambda: (boxes(5), torch.rand(5), torch.zeros(5, 1, dtype=torch.int64), 0.5),
        "boxes-3-columns": lambda: (torch.rand(5, 3), torch.rand(5), torch.zeros(5, dtype=torch.int64), 0.5),
        "scores-length": lambda: (boxes(5), torch.rand(4), torch.zeros(5, dtype=torch.int64), 0.5),
    }
    for name, make in malformed.items():
        yield Case("batched_nms", name, make, _batched_nms)


# --- roi_align / roi_pool and their modules ---------------------------------------------


def _roi_inputs(dtype, form, memory, k=6, batch=2, channels=3, height=9, width=11):
    x = layout(torch.rand(batch, channels, height, width, dtype=dtype), memory)
    r = rois(k, batch, height, width, dtype)
    if form == "list":
        return x, [r[r[:, 0] == i, 1:] for i in range(batch)]
    if form == "tuple":
        return x, tuple(r[r[:, 0] == i, 1:] for i in range(batch))
    if form == "strided":
        return x, layout(r, "strided")
    return x, r


def roi_align_cases() -> Iterator[Case]:
    forms = ("tensor", "list", "tuple", "strided")
    memories = ("contiguous", "channels_last", "strided")
    for dtype, form, memory in itertools.product(FLOAT_DTYPES + (torch.float16,), forms, memories):
        for size, scale, ratio, aligned in ((2, 1.0, -1, False), ((3, 2), 0.5, 2, True), ([4, 1], 2.0, 0, False)):
            yield Case(
                "roi_align", f"{dtype}-{form}-{memory}-{size}-{scale}-{ratio}-{aligned}",
                lambda dtype=dtype, form=form, memory=memory: _roi_inputs(dtype, form, memory),
                lambda ns, a, size=size, scale=scale, ratio=ratio, aligned=aligned: ns.roi_align(
                    a[0], a[1], size, scale, ratio, aligned),
                grad=dtype == torch.float64,
            )
    yield from _roi_common_cases("roi_align", lambda ns, a, size=2: ns.roi_align(a[0], a[1], size, 1.0, -1, False))
    yield Case("roi_align", "keyword-arguments", lambda: _roi_inputs(torch.float32, "tensor", "contiguous"),
               lambda ns, a: ns.roi_align(input=a[0], boxes=a[1], output_size=(2, 2), spatial_scale=0.5,
                                          sampling_ratio=3, aligned=True))
    yield Case("roi_align", "defaults", lambda: _roi_inputs(torch.float32, "tensor", "contiguous"),
               lambda ns, a: ns.roi_align(a[0], a[1], 3))
    yield Case("roi_align", "module", lambda: _roi_inputs(torch.float64, "list", "contiguous"),
               lambda ns, a: ns.RoIAlign((2, 3), 0.5, 2, aligned=True)(a[0], a[1]), grad=True)
    yield Case("roi_align", "module-repr", lambda: (),
               lambda ns, a: repr(ns.RoIAlign((2, 3), 0.5, 2, aligned=True)))


def roi_pool_cases() -> Iterator[Case]:
    forms = ("tensor", "list", "tuple", "strided")
    memories = ("contiguous", "channels_last", "strided")
    for dtype, form, memory in itertools.product(FLOAT_DTYPES, forms, memories):
        for size, scale in ((2, 1.0), ((3, 2), 0.5), ([1, 4], 2.0)):
            yield Case(
                "roi_pool", f"{dtype}-{form}-{memory}-{size}-{scale}",
                lambda dtype=dtype, form=form, memory=memory: _roi_inputs(dtype, form, memory),
                lambda ns, a, size=size, scale=scale: ns.roi_pool(a[0], a[1], size, scale),
                grad=dtype == torch.float64,
            )
    yield from _roi_common_cases("roi_pool", lambda ns, a, size=2: ns.roi_pool(a[0], a[1], size, 1.0))
    yield Case("roi_pool", "module", lambda: _roi_inputs(torch.float64, "list", "contiguous"),
               lambda ns, a: ns.RoIPool((2, 3), 0.5)(a[0], a[1]), grad=True)
    yield Case("roi_pool", "module-repr", lambda: (), lambda ns, a: repr(ns.RoIPool((2, 3), 0.5)))


def _roi_common_cases(op: str, call) -> Iterator[Case]:
    """Empty, degenerate and malformed inputs shared by roi_align and roi_pool."""
    x = lambda *shape: torch.rand(*shape)  # noqa: E731
    r = lambda k=3, batch=2: rois(k, batch, 8, 8)  # noqa: E731
    sized = lambda size: (lambda ns, a: call(ns, a, size))  # noqa: E731
    cases: dict[str, tuple[Callable[[], Inputs], Any]] = {
        "zero-rois": (lambda: (x(2, 3, 8, 8), torch.zeros(0, 5)), call),
        "zero-channels": (lambda: (x(2, 0, 8, 8), r()), call),
        "zero-batch-zero-rois": (lambda: (x(0, 3, 8, 8), torch.zeros(0, 5)), call),
        "list-of-empty-boxes": (lambda: (x(2, 3, 8, 8), [torch.zeros(0, 4), torch.zeros(0, 4)]), call),
        "list-one-image": (lambda: (x(1, 3, 8, 8), [r(4, 1)[:, 1:]]), call),
        "output-size-0": (lambda: (x(2, 3, 8, 8), r()), sized(0)),
        "output-size-0-by-2": (lambda: (x(2, 3, 8, 8), r()), sized((0, 2))),
        "output-size-three-values": (lambda: (x(2, 3, 8, 8), r()), sized((2, 3, 4))),
        "degenerate-boxes": (lambda: (x(2, 3, 8, 8), torch.tensor([[0, 3.0, 3, 3, 3], [1, 5, 5, 2, 2]])), call),
        "boxes-outside": (lambda: (x(2, 3, 8, 8), torch.tensor([[0, -20.0, -20, -10, -10], [1, 30, 30, 40, 40]])), call),
        # malformed
        "boxes-K-by-4": (lambda: (x(2, 3, 8, 8), r()[:, 1:]), call),
        "boxes-1d": (lambda: (x(2, 3, 8, 8), torch.rand(5)), call),
        "boxes-list-K-by-5": (lambda: (x(2, 3, 8, 8), [r()]), call),
        "boxes-list-1d": (lambda: (x(2, 3, 8, 8), [torch.rand(4)]), call),
        "boxes-empty-list": (lambda: (x(2, 3, 8, 8), []), call),
        "boxes-string": (lambda: (x(2, 3, 8, 8), "boxes"), call),
        "boxes-list-of-lists": (lambda: (x(2, 3, 8, 8), [[1.0, 2.0, 3.0, 4.0]]), call),
        "input-3d": (lambda: (x(3, 8, 8), r()), call),
        "input-list": (lambda: ([x(2, 3, 8, 8)], r()), call),
        "dtype-mismatch": (lambda: (x(2, 3, 8, 8), r().double()), call),
        "integer-input": (lambda: (x(2, 3, 8, 8).int(), r().int()), call),
        "output-size-negative": (lambda: (x(2, 3, 8, 8), r()), sized(-1)),
        "output-size-one-value": (lambda: (x(2, 3, 8, 8), r()), sized((2,))),
        "output-size-float": (lambda: (x(2, 3, 8, 8), r()), sized(2.0)),
        # documented differences and torchvision crashes (see DIFFERENCES, TORCHVISION_CRASHES)
        "batch-index-out-of-range": (lambda: (x(2, 3, 8, 8), torch.tensor([[2.0, 1, 1, 5, 5]])), call),
        "batch-index-negative": (lambda: (x(2, 3, 8, 8), torch.tensor([[-1.0, 1, 1, 5, 5]])), call),
        "nan-coordinate": (lambda: (x(2, 3, 8, 8), torch.tensor([[0.0, float("nan"), 1, 5, 5]])), call),
        "input-5d": (lambda: (x(1, 2, 3, 8, 8), r(3, 1)), call),
        "boxes-3d": (lambda: (x(2, 3, 8, 8), r()[:, :, None]), call),
        "input-zero-height": (lambda: (x(2, 3, 0, 8), r()), call),
        "input-zero-width": (lambda: (x(2, 3, 8, 0), r()), call),
        "zero-batch-with-rois": (lambda: (x(0, 3, 8, 8), r(3, 1)), call),
    }
    for name, (make, fn) in cases.items():
        yield Case(op, name, make, fn)


# --- ps_roi_align / ps_roi_pool and their modules -----------------------------------------


def _ps_inputs(dtype, form, memory, bins, channels_out=2, interior=False, k=6, batch=2, height=9, width=11):
    """Inputs with channels_out * bins channels. interior: boxes that stay off the last row and
    column (where torchvision's ps_roi_pool backward is not the gradient of its forward)."""
    x = layout(torch.rand(batch, channels_out * bins, height, width, dtype=dtype), memory)
    if interior:
        xy = torch.rand(k, 2) * torch.tensor([width / 2, height / 2])
        wh = torch.rand(k, 2) * torch.tensor([width / 3, height / 3])
        index = torch.randint(0, batch, (k, 1)).to(torch.float64)
        r = torch.cat([index, xy, xy + wh], dim=1).to(dtype)
    else:
        r = rois(k, batch, height, width, dtype)
    if form == "list":
        return x, [r[r[:, 0] == i, 1:] for i in range(batch)]
    if form == "tuple":
        return x, tuple(r[r[:, 0] == i, 1:] for i in range(batch))
    if form == "strided":
        return x, layout(r, "strided")
    return x, r


def _bins(size) -> int:
    return size * size if isinstance(size, int) else size[0] * size[1]


def ps_roi_align_cases() -> Iterator[Case]:
    forms = ("tensor", "list", "tuple", "strided")
    memories = ("contiguous", "channels_last", "strided")
    for dtype, form, memory in itertools.product(FLOAT_DTYPES + (torch.float16,), forms, memories):
        for size, scale, ratio in ((2, 1.0, -1), ((3, 2), 0.5, 2), ([1, 4], 2.0, 0)):
            yield Case(
                "ps_roi_align", f"{dtype}-{form}-{memory}-{size}-{scale}-{ratio}",
                lambda dtype=dtype, form=form, memory=memory, size=size: _ps_inputs(
                    dtype, form, memory, _bins(size)),
                lambda ns, a, size=size, scale=scale, ratio=ratio: ns.ps_roi_align(a[0], a[1], size, scale, ratio),
                grad=dtype == torch.float64,
            )
    yield from _ps_common_cases("ps_roi_align", lambda ns, a, size=1: ns.ps_roi_align(a[0], a[1], size, 1.0, -1))
    yield Case("ps_roi_align", "keyword-arguments", lambda: _ps_inputs(torch.float32, "tensor", "contiguous", 4),
               lambda ns, a: ns.ps_roi_align(input=a[0], boxes=a[1], output_size=(2, 2), spatial_scale=0.5,
                                             sampling_ratio=3))
    yield Case("ps_roi_align", "defaults", lambda: _ps_inputs(torch.float32, "tensor", "contiguous", 9),
               lambda ns, a: ns.ps_roi_align(a[0], a[1], 3))
    yield Case("ps_roi_align", "module", lambda: _ps_inputs(torch.float64, "list", "contiguous", 6),
               lambda ns, a: ns.PSRoIAlign((2, 3), 0.5, 2)(a[0], a[1]), grad=True)
    yield Case("ps_roi_align", "module-repr", lambda: (), lambda ns, a: repr(ns.PSRoIAlign((2, 3), 0.5, 2)))


def ps_roi_pool_cases() -> Iterator[Case]:
    forms = ("tensor", "list", "tuple", "strided")
    memories = ("contiguous", "channels_last", "strided")
    for dtype, form, memory in itertools.product(FLOAT_DTYPES, forms, memories):
        for size, scale in ((2, 1.0), ((3, 2), 0.5), ([1, 4], 2.0)):
            yield Case(
                "ps_roi_pool", f"{dtype}-{form}-{memory}-{size}-{scale}",
                lambda dtype=dtype, form=form, memory=memory, size=size: _ps_inputs(
                    dtype, form, memory, _bins(size)),
                lambda ns, a, size=size, scale=scale: ns.ps_roi_pool(a[0], a[1], size, scale),
            )
            if scale <= 1.0:  # the gradient, on boxes off the last row and column
                yield Case(
                    "ps_roi_pool", f"{dtype}-{form}-{memory}-{size}-{scale}-interior",
                    lambda dtype=dtype, form=form, memory=memory, size=size: _ps_inputs(
                        dtype, form, memory, _bins(size), interior=True),
                    lambda ns, a, size=size, scale=scale: ns.ps_roi_pool(a[0], a[1], size, scale),
                    grad=dtype == torch.float64,
                )
    yield from _ps_common_cases("ps_roi_pool", lambda ns, a, size=1: ns.ps_roi_pool(a[0], a[1], size, 1.0))
    yield Case("ps_roi_pool", "module", lambda: _ps_inputs(torch.float64, "list", "contiguous", 6, interior=True),
               lambda ns, a: ns.PSRoIPool((2, 3), 0.5)(a[0], a[1]), grad=True)
    yield Case("ps_roi_pool", "module-repr", lambda: (), lambda ns, a: repr(ns.PSRoIPool((2, 3), 0.5)))


def _ps_common_cases(op: str, call) -> Iterator[Case]:
    """The roi ops' empty, degenerate and malformed inputs (one bin, so any channel count is
    valid), and the channel count the bins do not divide."""
    yield from _roi_common_cases(op, call)
    yield Case(op, "channels-not-a-multiple-of-bins", lambda: (torch.rand(2, 6, 8, 8), rois(3, 2, 8, 8)),
               lambda ns, a: call(ns, a, (2, 2)))


# --- deform_conv2d and DeformConv2d ------------------------------------------------------


def _deform_inputs(dtype, batch=2, in_c=4, out_c=6, groups=1, offset_groups=1, kernel=(3, 3),
                   stride=(1, 1), padding=(0, 0), dilation=(1, 1), size=(7, 8), mask=False, bias=True,
                   memory="contiguous"):
    kh, kw = kernel
    out_h = (size[0] + 2 * padding[0] - (dilation[0] * (kh - 1) + 1)) // stride[0] + 1
    out_w = (size[1] + 2 * padding[1] - (dilation[1] * (kw - 1) + 1)) // stride[1] + 1
    x = layout(torch.rand(batch, in_c, *size, dtype=dtype), memory)
    offset = layout(torch.randn(batch, 2 * offset_groups * kh * kw, out_h, out_w, dtype=dtype), memory)
    weight = torch.randn(out_c, in_c // max(groups, 1), kh, kw, dtype=dtype)
    b = torch.randn(out_c, dtype=dtype) if bias else None
    m = torch.rand(batch, offset_groups * kh * kw, out_h, out_w, dtype=dtype) if mask else None
    return x, offset, weight, b, m


def _deform(stride=(1, 1), padding=(0, 0), dilation=(1, 1)):
    def call(ns, a):
        x, offset, weight, bias, mask = a
        return ns.deform_conv2d(x, offset, weight, bias, stride=stride, padding=padding,
                                dilation=dilation, mask=mask)
    return call


def deform_conv2d_cases() -> Iterator[Case]:
    geometries = {
        "plain": {},
        "stride-pad-dilation": dict(stride=(2, 1), padding=(1, 2), dilation=(1, 2)),
        "groups": dict(in_c=4, out_c=6, groups=2),
        "offset-groups": dict(in_c=4, offset_groups=2),
        "kernel-1x2": dict(kernel=(1, 2)),
    }
    for (gname, geo), dtype, mask, bias in itertools.product(
            geometries.items(), FLOAT_DTYPES, (False, True), (False, True)):
        conv = {k: geo[k] for k in ("stride", "padding", "dilation") if k in geo}
        yield Case(
            "deform_conv2d", f"{gname}-{dtype}-mask{mask}-bias{bias}",
            lambda geo=geo, dtype=dtype, mask=mask, bias=bias: _deform_inputs(dtype, mask=mask, bias=bias, **geo),
            _deform(**conv), grad=dtype == torch.float64 and gname in ("plain", "groups", "offset-groups"),
        )
    for memory in ("channels_last", "strided"):
        yield Case("deform_conv2d", f"layout-{memory}",
                   lambda memory=memory: _deform_inputs(torch.float32, mask=True, memory=memory), _deform())
    yield Case("deform_conv2d", "int-stride-padding",
               lambda: _deform_inputs(torch.float32, stride=(2, 2), padding=(1, 1)), _deform(2, 1, 1))
    yield Case("deform_conv2d", "float16", lambda: _deform_inputs(torch.float16, mask=True), _deform())
    degenerate = {
        "zero-batch": dict(batch=0),
        "zero-out-channels": dict(out_c=0),
    }
    for name, geo in degenerate.items():
        yield Case("deform_conv2d", name, lambda geo=geo: _deform_inputs(torch.float32, **geo), _deform())

    def bad(**changes):
        def make():
            x, offset, weight, b, m = _deform_inputs(torch.float32, mask=True)
            values = dict(x=x, offset=offset, weight=weight, b=b, m=m)
            values.update({k: v() for k, v in changes.items()})
            return values["x"], values["offset"], values["weight"], values["b"], values["m"]
        return make

    malformed = {
        "weight-0d": bad(weight=lambda: torch.tensor(1.0)),
        "weight-1d": bad(weight=lambda: torch.rand(6)),
        "weight-3d": bad(weight=lambda: torch.rand(6, 4, 3)),
        "input-3d": bad(x=lambda: torch.rand(4, 7, 8)),
        "offset-1d": bad(offset=lambda: torch.rand(18)),
        "offset-3d": bad(offset=lambda: torch.rand(18, 5, 6)),
        "offset-too-few-channels": bad(offset=lambda: torch.rand(2, 5, 5, 6)),
        "offset-channels-not-multiple": bad(offset=lambda: torch.rand(2, 19, 5, 6)),
        "offset-batch": bad(offset=lambda: torch.rand(1, 18, 5, 6)),
        "offset-spatial": bad(offset=lambda: torch.rand(2, 18, 4, 6)),
        "kernel-empty": bad(weight=lambda: torch.rand(6, 4, 0, 3)),
        "weight-zero-in-channels": bad(weight=lambda: torch.rand(6, 0, 3, 3)),
        "groups-not-dividing": bad(weight=lambda: torch.rand(6, 3, 3, 3)),
        "out-channels-not-divisible": bad(weight=lambda: torch.rand(5, 2, 3, 3), b=lambda: torch.rand(5)),
        "mask-channels": bad(m=lambda: torch.rand(2, 8, 5, 6)),
        "mask-3d": bad(m=lambda: torch.rand(9, 5, 6)),
        "bias-length": bad(b=lambda: torch.rand(3)),
        "weight-dtype": bad(weight=lambda: torch.rand(6, 4, 3, 3, dtype=torch.float64)),
        "integer-tensors": lambda: tuple(t.int() if t is not None else None
                                         for t in _deform_inputs(torch.float32, mask=True)),
        "kernel-larger-than-input": bad(x=lambda: torch.rand(2, 4, 2, 2)),
    }
    for name, make in malformed.items():
        yield Case("deform_conv2d", name, make, _deform())
    for name, conv in {"stride-negative": dict(stride=-1), "padding-negative": dict(padding=-1),
                       "dilation-zero": dict(dilation=0), "stride-three-values": dict(stride=(1, 1, 1)),
                       "stride-zero": dict(stride=0)}.items():
        yield Case("deform_conv2d", name, lambda: _deform_inputs(torch.float32), _deform(**conv))
    yield Case("deform_conv2d", "module", lambda: _deform_inputs(torch.float64, in_c=4, mask=True)[:2] + (
        torch.rand(2, 9, 5, 6, dtype=torch.float64),), _module_deform, grad=True)
    yield Case("deform_conv2d", "module-repr", lambda: (),
               lambda ns, a: repr(ns.DeformConv2d(4, 6, 3, stride=2, padding=1, dilation=2, groups=2, bias=False)))
    for name, kwargs in {"module-groups-in": dict(in_channels=3, out_channels=4, kernel_size=3, groups=2),
                         "module-groups-out": dict(in_channels=4, out_channels=3, kernel_size=3, groups=2),
                         "module-groups-zero": dict(in_channels=4, out_channels=4, kernel_size=3, groups=0)}.items():
        yield Case("deform_conv2d", name, lambda: (), lambda ns, a, kwargs=kwargs: ns.DeformConv2d(**kwargs))


def _module_deform(ns, a):
    torch.manual_seed(7)  # the same initial parameters in both namespaces
    module = ns.DeformConv2d(4, 6, 3).double()
    return module(*a)


# --- quantized (QuantizedCPU kernels of nms and roi_align) ---------------------------------

QUANTIZED_DTYPES = (torch.quint8, torch.qint8, torch.qint32)


def quantize(x: torch.Tensor, scale: float, zero_point: int, dtype) -> torch.Tensor:
    return torch.quantize_per_tensor(x, scale, 0 if dtype == torch.qint32 else zero_point, dtype)


def quantized_cases() -> Iterator[Case]:
    for dtype, n in itertools.product(QUANTIZED_DTYPES, (0, 1, 12, 80)):
        yield Case("nms", f"quantized-{dtype}-n{n}", lambda dtype=dtype, n=n: (
            quantize(boxes(n, spread=40).clamp(max=60), 0.5, 2, dtype), quantize(torch.rand(n), 0.01, 0, dtype), 0.4),
            _nms)
    for dtype, (size, scale, ratio, aligned) in itertools.product(
            QUANTIZED_DTYPES, ((2, 1.0, -1, False), ((3, 2), 0.5, 2, True), (4, 1.0, 0, True))):
        yield Case(
            "roi_align", f"quantized-{dtype}-{size}-{scale}-{ratio}-{aligned}",
            lambda dtype=dtype: (quantize(torch.rand(1, 3, 9, 11) * 4, 0.05, 3, dtype),
                                 quantize(rois(7, 1, 9, 11).clamp(min=0), 0.125, 0, dtype)),
            lambda ns, a, size=size, scale=scale, ratio=ratio, aligned=aligned: ns.roi_align(
                a[0], a[1], size, scale, ratio, aligned))
    yield Case("roi_align", "quantized-list-boxes",
               lambda: (quantize(torch.rand(1, 2, 8, 8), 0.02, 10, torch.quint8),
                        [quantize(rois(3, 1, 8, 8)[:, 1:].clamp(min=0), 0.25, 0, torch.quint8)]),
               lambda ns, a: ns.roi_align(a[0], a[1], 2))
    yield Case("roi_align", "quantized-zero-rois",
               lambda: (quantize(torch.rand(1, 2, 8, 8), 0.02, 10, torch.quint8),
                        quantize(torch.zeros(0, 5), 0.25, 0, torch.quint8)),
               lambda ns, a: ns.roi_align(a[0], a[1], 2))
    yield Case("roi_align", "quantized-input-float-rois",
               lambda: (quantize(torch.rand(1, 2, 8, 8), 0.02, 10, torch.quint8), rois(3, 1, 8, 8)),
               lambda ns, a: ns.roi_align(a[0], a[1], 2))


# op -> its cases; one entry per public op.
CASES: dict[str, Callable[[], Iterator[Case]]] = {
    "nms": nms_cases,
    "batched_nms": batched_nms_cases,
    "roi_align": roi_align_cases,
    "roi_pool": roi_pool_cases,
    "ps_roi_align": ps_roi_align_cases,
    "ps_roi_pool": ps_roi_pool_cases,
    "deform_conv2d": deform_conv2d_cases,
    "quantized": quantized_cases,
}

# Inputs torchvision accepts (computing garbage or reading past a buffer) where opforge raises a
# RuntimeError naming the problem. Each is listed in extension/README.md.
DIFFERENCES: dict[str, str] = {
    f"{op}-{name}": reason
    for op in ("roi_align", "roi_pool", "ps_roi_align", "ps_roi_pool")
    for name, reason in {
        "batch-index-out-of-range": "a roi's batch index past the batch reads outside the input",
        "batch-index-negative": "a negative batch index reads before the input",
        "nan-coordinate": "a non-finite coordinate makes the sampling grid undefined",
        "input-5d": "a 5-D input is read as if its planes were 4-D",
        "boxes-3d": "a [K, 5, 1] box tensor is read as [K, 5]",
    }.items()
}

# Inputs on which torchvision's own kernels crash the interpreter (segfault, SIGFPE); the suite
# checks only opforge's answer (`expect`: "zeros" or the exception type).
TORCHVISION_CRASHES: dict[str, str] = {
    "roi_align-input-zero-height": "zeros",  # torchvision: segmentation fault
    "roi_align-input-zero-width": "zeros",
    "ps_roi_align-input-zero-height": "zeros",  # torchvision: reads before the input
    "ps_roi_align-input-zero-width": "zeros",
    "ps_roi_align-output-size-0": "RuntimeError",  # torchvision: SIGFPE (channels % 0)
    "ps_roi_align-output-size-0-by-2": "RuntimeError",
    "ps_roi_pool-output-size-0": "RuntimeError",
    "ps_roi_pool-output-size-0-by-2": "RuntimeError",
    "deform_conv2d-stride-zero": "RuntimeError",  # torchvision: SIGFPE (division by zero)
    # torchvision: rois that name an image of an input with none read outside it
    **{f"{op}-zero-batch-with-rois": "RuntimeError"
       for op in ("roi_align", "roi_pool", "ps_roi_align", "ps_roi_pool")},
}


def all_cases() -> list[Case]:
    return [case for make in CASES.values() for case in make()]
