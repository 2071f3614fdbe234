"""The differential table: every public op of opforge_ops called exactly as on torchvision.ops.

A Case names the op, builds fresh inputs (seeded, so two builds are identical) and calls the op
through a namespace (``torchvision.ops`` or ``opforge_ops``). The suite runs each case on both
and compares values (and gradients), or exception types when torchvision rejects the input.

Each op's cases live beside its kernel tests: ``torchvision_cases()`` in its test module,
extension/tests/test_<op>.py (which yields the cases of the public functions built on the op
too). ``all_cases`` finds them from the ops the built extension
registers (ops_table.py), so adding an op adds nothing here; this module holds what the cases
share. A case's ``difference`` says why opforge deliberately raises where torchvision accepts
the input (extension/README.md explains each); its ``torchvision_crash`` marks an input
torchvision's own kernels crash the process on, where only opforge's answer is checked.
"""

import dataclasses
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from ops_table import FORWARD_OPS, module_of

Inputs = tuple[Any, ...]


@dataclass(frozen=True)
class Case:
    op: str  # the public name in both namespaces
    name: str
    make: Callable[[], Inputs]  # fresh inputs; called under a fixed seed
    call: Callable[[Any, Inputs], Any]  # (namespace, inputs) -> result
    grad: bool = False  # also compare the gradients of the floating-point input tensors
    difference: str = ""  # why opforge raises a RuntimeError where torchvision accepts the input
    torchvision_crash: str = ""  # torchvision crashes on it; opforge gives "zeros" or this exception

    @property
    def id(self) -> str:
        return f"{self.op}-{self.name}"


def all_cases() -> list[Case]:
    """Every op's cases: torchvision_cases() of each test_<op>.py, for every op the extension
    registers."""
    return [case for op in FORWARD_OPS for case in module_of(op).torchvision_cases()]


def crashing_torchvision(cases: Iterable[Case], expected: dict[str, str]) -> Iterator[Case]:
    """cases, those named in `expected` (name -> opforge's answer: "zeros" or the exception
    type) marked as inputs torchvision's own kernels crash the process on."""
    cases = list(cases)
    missing = set(expected) - {case.name for case in cases}
    assert not missing, f"no cases named {sorted(missing)}"
    for case in cases:
        yield dataclasses.replace(case, torchvision_crash=expected[case.name]) if case.name in expected else case


FLOAT_DTYPES = (torch.float32, torch.float64)
BOX_FORMS = ("tensor", "list", "tuple", "strided")  # how the boxes are given (roi_inputs, ps_inputs)
MEMORY_LAYOUTS = ("contiguous", "channels_last", "strided")  # layout(x, kind)


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


# --- what every op that pools rois shares ----------------------------------------------


def roi_inputs(dtype, form, memory, k=6, batch=2, channels=3, height=9, width=11):
    x = layout(torch.rand(batch, channels, height, width, dtype=dtype), memory)
    r = rois(k, batch, height, width, dtype)
    if form == "list":
        return x, [r[r[:, 0] == i, 1:] for i in range(batch)]
    if form == "tuple":
        return x, tuple(r[r[:, 0] == i, 1:] for i in range(batch))
    if form == "strided":
        return x, layout(r, "strided")
    return x, r


def roi_common_cases(op: str, call) -> Iterator[Case]:
    """Empty, degenerate and malformed inputs every op that pools rois shares; `call(ns, a,
    size)` calls the op with output size `size` (a default when left out)."""
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
        # documented differences and torchvision crashes (ROI_DIFFERENCES, ROI_TORCHVISION_CRASHES)
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
        yield Case(op, name, make, fn, difference=ROI_DIFFERENCES.get(name, ""),
                   torchvision_crash=ROI_TORCHVISION_CRASHES.get(name, ""))


# Inputs of every roi op that torchvision accepts (computing garbage or reading past a buffer)
# where opforge raises a RuntimeError naming the problem. Each is listed in extension/README.md.
ROI_DIFFERENCES: dict[str, str] = {
    "batch-index-out-of-range": "a roi's batch index past the batch reads outside the input",
    "batch-index-negative": "a negative batch index reads before the input",
    "nan-coordinate": "a non-finite coordinate makes the sampling grid undefined",
    "input-5d": "a 5-D input is read as if its planes were 4-D",
    "boxes-3d": "a [K, 5, 1] box tensor is read as [K, 5]",
}
# torchvision: rois that name an image of an input with none read outside it
ROI_TORCHVISION_CRASHES: dict[str, str] = {"zero-batch-with-rois": "RuntimeError"}


def ps_inputs(dtype, form, memory, bins, channels_out=2, interior=False, k=6, batch=2, height=9, width=11):
    """Inputs of a position-sensitive op: channels_out * bins channels. interior: boxes that
    stay off the last row and column (where the backward of torchvision's position-sensitive
    RoIPool is not the gradient of its forward)."""
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


def bin_count(size) -> int:
    return size * size if isinstance(size, int) else size[0] * size[1]


def ps_common_cases(op: str, call) -> Iterator[Case]:
    """The roi ops' empty, degenerate and malformed inputs (one bin, so any channel count is
    valid), and the channel count the bins do not divide."""
    yield from roi_common_cases(op, call)
    yield Case(op, "channels-not-a-multiple-of-bins", lambda: (torch.rand(2, 6, 8, 8), rois(3, 2, 8, 8)),
               lambda ns, a: call(ns, a, (2, 2)))


# --- quantized (QuantizedCPU kernels) ----------------------------------------------------

QUANTIZED_DTYPES = (torch.quint8, torch.qint8, torch.qint32)


def quantize(x: torch.Tensor, scale: float, zero_point: int, dtype) -> torch.Tensor:
    return torch.quantize_per_tensor(x, scale, 0 if dtype == torch.qint32 else zero_point, dtype)
