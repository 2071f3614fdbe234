"""The kernels' shape rules for the fake (meta) kernels: csrc/common.h, function by function.

Every check here is the Python twin of the C++ check of the same name in ``csrc/common.h``,
in the same order and with the same message (TORCH_CHECK's formatting of sizes, dtypes and
devices is reproduced), so torch.compile, export, FakeTensorMode and meta tensors refuse
exactly what the eager kernels refuse, with the same RuntimeError. tests/test_fake_rules.py
feeds a generated table of malformed calls to eager, meta and FakeTensorMode and requires the
same outcome. Checks that read tensor values (roi batch indices and coordinates, argmax and
channel_mapping entries) need data and run only in the eager kernels.
"""

import torch
from torch import Tensor

MAX_INT32 = 2**31 - 1
MAX_SAMPLES_PER_ROI = 1 << 24
_FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
_U64 = 2**64 - 1


_QUANTIZED_NAMES = {torch.quint8: "QUInt8", torch.qint8: "QInt8", torch.qint32: "QInt32"}


def scalar_type_name(dtype: torch.dtype) -> str:
    """c10's name of a dtype (Float, Double, Half, BFloat16, Long, QUInt8...), as TORCH_CHECK
    prints it."""
    if dtype in _QUANTIZED_NAMES:
        return _QUANTIZED_NAMES[dtype]
    return torch.empty(0, dtype=dtype).type().rsplit(".", 1)[-1].removesuffix("Tensor")


def sizes(shape) -> str:
    """An IntArrayRef as TORCH_CHECK prints it: [2, 3]."""
    return f"[{', '.join(str(s) for s in shape)}]"


def _concrete(*values) -> bool:
    return all(isinstance(v, int) for v in values)


def check_storage_holds(op: str, name: str, t: Tensor) -> None:
    """A tensor's sizes and strides must fit in its storage (a meta tensor carries its storage
    size, so a short one is refused there as on the CPU). Symbolic sizes are left to the
    eager kernel."""
    if t.numel() == 0:
        return
    shape, strides, offset = tuple(t.shape), tuple(t.stride()), t.storage_offset()
    try:
        held = t.untyped_storage().nbytes()
    except (RuntimeError, NotImplementedError):  # a wrapper subclass without a storage
        return
    if not _concrete(*shape, *strides, offset, held):
        return
    # uint64 arithmetic with overflow flags, as c10::mul_overflows / add_overflows
    last, overflow = offset & _U64, False
    for size, stride in zip(shape, strides):
        reach = (size - 1) * (stride & _U64)
        overflow |= reach > _U64
        last += reach & _U64
        overflow |= last > _U64
        last &= _U64
    needed = (last + 1) * t.itemsize
    overflow |= needed > _U64
    needed &= _U64
    torch._check(
        not overflow and needed <= held,
        lambda: f"{op}: {name} with sizes {sizes(shape)}, strides {sizes(strides)} and storage "
        f"offset {offset} needs {needed} bytes of storage, but its storage holds {held}",
    )


def check_same_device_and_dtype(op: str, name_a: str, a: Tensor, name_b: str, b: Tensor) -> None:
    torch._check(
        a.device == b.device,
        lambda: f"{op}: {name_a} and {name_b} must be on the same device, got {name_a} on "
        f"{a.device} and {name_b} on {b.device}",
    )
    torch._check(
        a.dtype == b.dtype,
        lambda: f"{op}: {name_a} and {name_b} must have the same dtype, got {name_a} "
        f"{scalar_type_name(a.dtype)} and {name_b} {scalar_type_name(b.dtype)}",
    )


def _check_float(op: str, name: str, t: Tensor) -> None:
    torch._check(
        t.dtype in _FLOATS,
        lambda: f"{op}: {name} must be a floating point tensor, got {scalar_type_name(t.dtype)}",
    )


def check_nms_inputs(dets: Tensor, scores: Tensor) -> None:
    check_nms_shapes(dets, scores)
    check_same_device_and_dtype("nms", "boxes (dets)", dets, "scores", scores)
    _check_float("nms", "boxes (dets)", dets)


def check_nms_shapes(dets: Tensor, scores: Tensor) -> None:
    check_storage_holds("nms", "boxes (dets)", dets)
    check_storage_holds("nms", "scores", scores)
    torch._check(
        dets.dim() == 2 and dets.size(1) == 4,
        lambda: f"nms: boxes (dets) must have shape [N, 4], got {sizes(dets.shape)}",
    )
    torch._check(
        scores.dim() == 1,
        lambda: f"nms: scores must be a 1-D tensor [N], got shape {sizes(scores.shape)}",
    )
    torch._check(
        dets.size(0) == scores.size(0),
        lambda: f"nms: boxes (dets) and scores must have the same length, got {dets.size(0)} "
        f"boxes and {scores.size(0)} scores",
    )


def check_plane_fits_int32(op: str, height: int, width: int) -> None:
    torch._check(
        height <= 0 or width <= 0 or (height <= MAX_INT32 and width <= MAX_INT32
                                      and height * width <= MAX_INT32),
        lambda: f"{op}: an input plane of height x width = {height} x {width} has 2^31 or more "
        "elements, more than the kernels' int32 offsets address",
    )


def check_sampling_ratio(op: str, sampling_ratio: int, pooled_height: int, pooled_width: int) -> None:
    torch._check(
        sampling_ratio <= 0
        or float(sampling_ratio) * float(sampling_ratio) * float(pooled_height) * float(pooled_width)
        <= float(MAX_SAMPLES_PER_ROI),
        lambda: f"{op}: sampling_ratio {sampling_ratio} with output_size ({pooled_height}, "
        f"{pooled_width}) needs more than {MAX_SAMPLES_PER_ROI} samples per roi; pass a smaller "
        "sampling_ratio (or <= 0 for adaptive sampling)",
    )


def check_roi_shapes(op: str, input: Tensor, rois: Tensor) -> None:
    check_storage_holds(op, "input", input)
    check_storage_holds(op, "rois", rois)
    torch._check(
        input.dim() == 4,
        lambda: f"{op}: input must be a 4-D tensor [N, C, H, W], got shape {sizes(input.shape)}",
    )
    torch._check(
        rois.dim() == 2 and rois.size(1) == 5,
        lambda: f"{op}: rois (boxes) must have shape [K, 5] (batch index, x1, y1, x2, y2), got "
        f"shape {sizes(rois.shape)}",
    )


def check_roi_output_size(op: str, input: Tensor, pooled_height: int, pooled_width: int) -> None:
    torch._check(
        0 <= pooled_height <= MAX_INT32 and 0 <= pooled_width <= MAX_INT32,
        lambda: f"{op}: output_size (pooled_height, pooled_width) must not be negative and must "
        f"be below 2^31, got ({pooled_height}, {pooled_width})",
    )
    check_plane_fits_int32(op, input.size(2), input.size(3))


def check_roi_inputs(op: str, input: Tensor, rois: Tensor, pooled_height: int, pooled_width: int) -> None:
    check_roi_shapes(op, input, rois)
    check_same_device_and_dtype(op, "input", input, "rois", rois)
    _check_float(op, "input", input)
    check_roi_output_size(op, input, pooled_height, pooled_width)
    torch._check(
        input.size(0) > 0 or rois.size(0) == 0,
        lambda: f"{op}: input has no images (batch size 0), but rois hold {rois.size(0)} boxes "
        "that each name one",
    )


def check_roi_backward_inputs(op: str, grad: Tensor, rois: Tensor, pooled_height: int,
                              pooled_width: int, batch_size: int, channels: int, height: int,
                              width: int) -> None:
    check_storage_holds(op, "grad", grad)
    check_storage_holds(op, "rois", rois)
    torch._check(
        rois.dim() == 2 and rois.size(1) == 5,
        lambda: f"{op}: rois must have shape [K, 5], got shape {sizes(rois.shape)}",
    )
    torch._check(
        grad.dim() == 4 and grad.size(0) == rois.size(0) and grad.size(1) == channels
        and grad.size(2) == pooled_height and grad.size(3) == pooled_width,
        lambda: f"{op}: grad must have shape [K, C, pooled_height, pooled_width] = "
        f"[{rois.size(0)}, {channels}, {pooled_height}, {pooled_width}], got {sizes(grad.shape)}",
    )
    check_same_device_and_dtype(op, "grad", grad, "rois", rois)
    torch._check(
        batch_size >= 0 and channels >= 0 and height >= 0 and width >= 0,
        lambda: f"{op}: batch_size, channels, height and width must be non-negative, got "
        f"{batch_size}, {channels}, {height}, {width}",
    )
    _check_float(op, "grad", grad)
    check_plane_fits_int32(op, height, width)


def check_int32_like_grad(op: str, name: str, index: Tensor, grad: Tensor) -> None:
    check_storage_holds(op, name, index)
    torch._check(
        index.dtype == torch.int32 and index.shape == grad.shape and index.device == grad.device,
        lambda: f"{op}: {name} must be an int32 tensor shaped like grad {sizes(grad.shape)} on "
        f"{grad.device}, got {scalar_type_name(index.dtype)} {sizes(index.shape)} on "
        f"{index.device}",
    )


def check_ps_roi_inputs(op: str, input: Tensor, rois: Tensor, pooled_height: int,
                        pooled_width: int) -> None:
    check_roi_inputs(op, input, rois, pooled_height, pooled_width)
    torch._check(
        pooled_height > 0 and pooled_width > 0,
        lambda: f"{op}: output_size (pooled_height, pooled_width) must be positive, got "
        f"({pooled_height}, {pooled_width})",
    )
    bins = pooled_height * pooled_width
    torch._check(
        input.size(1) % bins == 0,
        lambda: f"{op}: input channels ({input.size(1)}) must be a multiple of pooled_height * "
        f"pooled_width ({bins})",
    )


def check_ps_roi_backward_inputs(op: str, grad: Tensor, rois: Tensor, channel_mapping: Tensor,
                                 pooled_height: int, pooled_width: int, batch_size: int,
                                 channels: int, height: int, width: int) -> None:
    torch._check(
        0 < pooled_height <= MAX_INT32 and 0 < pooled_width <= MAX_INT32,
        lambda: f"{op}: pooled_height and pooled_width must be positive and below 2^31, got "
        f"({pooled_height}, {pooled_width})",
    )
    bins = pooled_height * pooled_width
    torch._check(
        channels >= 0 and channels % bins == 0,
        lambda: f"{op}: channels ({channels}) must be a non-negative multiple of pooled_height * "
        f"pooled_width ({bins})",
    )
    torch._check(
        grad.dim() == 4,
        lambda: f"{op}: grad must be a 4-D tensor [K, channels / (PH * PW), PH, PW], got shape "
        f"{sizes(grad.shape)}",
    )
    check_roi_backward_inputs(op, grad, rois, pooled_height, pooled_width, batch_size,
                              grad.size(1), height, width)
    torch._check(
        grad.size(1) * bins == channels,
        lambda: f"{op}: grad has {grad.size(1)} channels, so the input had {grad.size(1) * bins}, "
        f"but channels is {channels}",
    )
    check_int32_like_grad(op, "channel_mapping", channel_mapping, grad)
