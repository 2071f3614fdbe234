"""Deformable convolution (v1 and v2): ``deform_conv2d`` and ``DeformConv2d``.

Same signatures, defaults, checks and exception types as ``torchvision.ops.deform_conv2d``;
scriptable and a torch.fx leaf (see _utils.py). The kernels are
``torch.ops.opforge.deform_conv2d`` and ``torch.ops.opforge._deform_conv2d_backward``; this
module also registers their fake (meta) kernels and the autograd formula. It must be imported
only after the compiled library has loaded.
"""

import math

import torch
import torch.fx
from torch import Tensor, nn
from torch.nn import init
from torch.nn.modules.utils import _pair
from torch.nn.parameter import Parameter

from ._checks import check_storage_holds, sizes
from ._checks import scalar_type_name as _scalar_type_name
from ._dispatch import (
    alert_cuda_atomics,
    forbid_double_backward,
    register_autocast,
    register_autograd,
)
from ._utils import fx_leaf_call

__all__ = ["deform_conv2d", "DeformConv2d"]


@torch.fx.wrap
def deform_conv2d(
    input: Tensor,
    offset: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: tuple[int, int] = (1, 1),
    padding: tuple[int, int] = (0, 0),
    dilation: tuple[int, int] = (1, 1),
    mask: Tensor | None = None,
) -> Tensor:
    r"""Deformable Convolution v2 (https://arxiv.org/abs/1811.11168) if ``mask``
    is given, Deformable Convolution (https://arxiv.org/abs/1703.06211) otherwise.

    Args:
        input (Tensor[batch_size, in_channels, in_height, in_width]): input tensor
        offset (Tensor[batch_size, 2 * offset_groups * kernel_height * kernel_width, out_height, out_width]):
            offsets to be applied for each position in the convolution kernel.
        weight (Tensor[out_channels, in_channels // groups, kernel_height, kernel_width]):
            convolution weights, split into groups of size (in_channels // groups)
        bias (Tensor[out_channels]): optional bias. Default: None
        stride (int or Tuple[int, int]): distance between convolution centers. Default: 1
        padding (int or Tuple[int, int]): zero padding around each image. Default: 0
        dilation (int or Tuple[int, int]): spacing between kernel elements. Default: 1
        mask (Tensor[batch_size, offset_groups * kernel_height * kernel_width, out_height, out_width]):
            masks to be applied for each position in the convolution kernel. Default: None

    Returns:
        Tensor[batch_sz, out_channels, out_h, out_w]: result of convolution
    """
    if not torch.jit.is_scripting():
        leaf = fx_leaf_call(deform_conv2d, (input, offset, weight, bias, stride, padding, dilation, mask))
        if leaf is not None:
            return leaf
    # The order and exception types of torchvision's checks (its Python indexes and unpacks
    # shapes; the kernel checks the rest), with messages that name the argument.
    if weight.dim() == 0:
        raise IndexError("deform_conv2d: weight must be a 4-D tensor (out_channels, "
                         "in_channels / groups, kernel_h, kernel_w), got a 0-D tensor")
    out_channels = weight.shape[0]
    use_mask = mask is not None
    if mask is None:
        if input.dim() == 0:
            raise IndexError("deform_conv2d: input must be a 4-D tensor (batch, channels, "
                             "height, width), got a 0-D tensor")
        mask = torch.zeros((input.shape[0], 1), device=input.device, dtype=input.dtype)
    if bias is None:
        bias = torch.zeros(out_channels, device=input.device, dtype=input.dtype)

    stride_h, stride_w = _pair(stride)
    pad_h, pad_w = _pair(padding)
    dil_h, dil_w = _pair(dilation)
    if weight.dim() < 2:
        raise ValueError(f"deform_conv2d: weight must be a 4-D tensor (out_channels, in_channels "
                         f"/ groups, kernel_h, kernel_w), got shape {weight.shape}")
    if input.dim() != 4:
        raise ValueError(f"deform_conv2d: input must be a 4-D tensor (batch, channels, height, "
                         f"width), got shape {input.shape}")
    weights_h, weights_w = weight.shape[-2], weight.shape[-1]
    n_in_channels = input.shape[1]
    if offset.dim() < 2:
        raise IndexError(f"deform_conv2d: offset must be a 4-D tensor (batch, 2 * offset_groups "
                         f"* kernel_h * kernel_w, out_h, out_w), got shape {offset.shape}")
    if weights_h * weights_w == 0:
        raise ZeroDivisionError(f"deform_conv2d: weight has an empty kernel, shape {weight.shape}")
    n_offset_grps = offset.shape[1] // (2 * weights_h * weights_w)
    if weight.shape[1] == 0:
        raise ZeroDivisionError(f"deform_conv2d: weight.shape[1] (in_channels / groups) is 0, "
                                f"shape {weight.shape}")
    n_weight_grps = n_in_channels // weight.shape[1]

    if n_offset_grps == 0:
        raise RuntimeError(
            "deform_conv2d: the shape of the offset tensor at dimension 1 is not valid. It should "
            "be a multiple of 2 * weight.size[2] * weight.size[3].\n"
            f"Got offset.shape[1]={offset.shape[1]}, while 2 * weight.size[2] * weight.size[3]="
            f"{2 * weights_h * weights_w}"
        )

    return torch.ops.opforge.deform_conv2d(
        input,
        weight,
        offset,
        mask,
        bias,
        stride_h,
        stride_w,
        pad_h,
        pad_w,
        dil_h,
        dil_w,
        n_weight_grps,
        n_offset_grps,
        use_mask,
    )


class DeformConv2d(nn.Module):
    """See :func:`deform_conv2d`."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        stride: int = 1,
        padding: int = 0,
        dilation: int = 1,
        groups: int = 1,
        bias: bool = True,
    ):
        super().__init__()
        if in_channels % groups != 0:
            raise ValueError("in_channels must be divisible by groups")
        if out_channels % groups != 0:
            raise ValueError("out_channels must be divisible by groups")

        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = _pair(kernel_size)
        self.stride = _pair(stride)
        self.padding = _pair(padding)
        self.dilation = _pair(dilation)
        self.groups = groups

        self.weight = Parameter(
            torch.empty(out_channels, in_channels // groups, self.kernel_size[0], self.kernel_size[1])
        )
        if bias:
            self.bias = Parameter(torch.empty(out_channels))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in, _ = init._calculate_fan_in_and_fan_out(self.weight)
            bound = 1 / math.sqrt(fan_in)
            init.uniform_(self.bias, -bound, bound)

    def forward(self, input: Tensor, offset: Tensor, mask: Tensor | None = None) -> Tensor:
        return deform_conv2d(
            input,
            offset,
            self.weight,
            self.bias,
            stride=self.stride,
            padding=self.padding,
            dilation=self.dilation,
            mask=mask,
        )

    def __repr__(self) -> str:
        s = (
            f"{self.__class__.__name__}("
            f"{self.in_channels}"
            f", {self.out_channels}"
            f", kernel_size={self.kernel_size}"
            f", stride={self.stride}"
        )
        s += f", padding={self.padding}" if self.padding != (0, 0) else ""
        s += f", dilation={self.dilation}" if self.dilation != (1, 1) else ""
        s += f", groups={self.groups}" if self.groups != 1 else ""
        s += ", bias=False" if self.bias is None else ""
        s += ")"
        return s


# --- fake (meta) kernels -------------------------------------------------------


_MAX_PARAM = 2**31 - 1


def _sizes(t: Tensor) -> str:
    return sizes(t.shape)


def _check_shapes(input, weight, offset, mask, bias, stride_h, stride_w, pad_h, pad_w,
                  dilation_h, dilation_w, groups, offset_groups, use_mask):
    """check_deform_conv2d_args (csrc/common.h) for tracing: the same rules, in the same order,
    with the same messages, so torch.compile / export / FakeTensorMode refuse exactly what the
    eager kernels refuse (tests/test_fake_rules.py holds them equal).
    """
    device_name = _device_name(input)
    for name, t in (("input", input), ("weight", weight), ("offset", offset), ("mask", mask),
                    ("bias", bias)):
        check_storage_holds("deform_conv2d", name, t)
        torch._check(
            t.device == input.device,
            lambda name=name, t=t: f"deform_conv2d: {name} must be a {device_name} tensor on the "
            f"same device as input ({input.device}), got {t.device}",
        )
    torch._check(input.dim() == 4, lambda: "deform_conv2d: input must be 4-D (batch, channels, "
                 f"height, width), got {input.dim()}-D with shape {_sizes(input)}")
    torch._check(weight.dim() == 4, lambda: "deform_conv2d: weight must be 4-D (out_channels, "
                 "in_channels / groups, kernel_h, kernel_w), got "
                 f"{weight.dim()}-D with shape {_sizes(weight)}")
    torch._check(offset.dim() == 4, lambda: "deform_conv2d: offset must be 4-D (batch, 2 * "
                 "offset_groups * kernel_h * kernel_w, out_h, out_w), got "
                 f"{offset.dim()}-D with shape {_sizes(offset)}")
    torch._check(not use_mask or mask.dim() == 4, lambda: "deform_conv2d: mask must be 4-D "
                 "(batch, offset_groups * kernel_h * kernel_w, out_h, out_w) when use_mask is "
                 f"true, got {mask.dim()}-D with shape {_sizes(mask)}")
    torch._check(bias.dim() == 1 and bias.shape[0] == weight.shape[0],
                 lambda: "deform_conv2d: bias must have shape (out_channels,) = "
                 f"({weight.shape[0]},), got {_sizes(bias)}")
    for name, v in (("stride_h", stride_h), ("stride_w", stride_w), ("dilation_h", dilation_h),
                    ("dilation_w", dilation_w), ("groups", groups),
                    ("offset_groups", offset_groups)):
        torch._check(0 < v <= _MAX_PARAM, lambda name=name, v=v: f"deform_conv2d: {name} must "
                     f"be a positive integer below 2^31, got {v}")
    torch._check(0 <= pad_h <= _MAX_PARAM and 0 <= pad_w <= _MAX_PARAM,
                 lambda: "deform_conv2d: padding (pad_h, pad_w) must be non-negative and below "
                 f"2^31, got ({pad_h}, {pad_w})")
    channels, height, width = input.shape[1], input.shape[2], input.shape[3]
    out_channels, kernel_h, kernel_w = weight.shape[0], weight.shape[2], weight.shape[3]
    torch._check(kernel_h > 0 and kernel_w > 0, lambda: "deform_conv2d: weight kernel size "
                 f"must be positive, got kernel_h={kernel_h}, kernel_w={kernel_w}")
    torch._check(channels % groups == 0, lambda: f"deform_conv2d: groups ({groups}) must "
                 f"divide the input channels ({channels})")
    torch._check(weight.shape[1] == channels // groups,
                 lambda: "deform_conv2d: weight.shape[1] must be in_channels / groups = "
                 f"{channels} / {groups} = {channels // groups}, got {weight.shape[1]}")
    torch._check(out_channels % groups == 0, lambda: f"deform_conv2d: groups ({groups}) must "
                 f"divide the output channels weight.shape[0] ({out_channels})")
    torch._check(channels % offset_groups == 0, lambda: f"deform_conv2d: offset_groups "
                 f"({offset_groups}) must divide the input channels ({channels})")
    kk = kernel_h * kernel_w
    torch._check(offset.shape[1] % (2 * kk) == 0 and offset.shape[1] // (2 * kk) == offset_groups,
                 lambda: f"deform_conv2d: offset.shape[1] is not valid: got: {offset.shape[1]} "
                 f"expected: {2 * offset_groups * kk} (2 * offset_groups * kernel_h * kernel_w = "
                 f"2 * {offset_groups} * {kernel_h} * {kernel_w})")
    torch._check(not use_mask or (mask.shape[1] % kk == 0 and mask.shape[1] // kk == offset_groups),
                 lambda: f"deform_conv2d: mask.shape[1] is not valid: got: {mask.shape[1]} "
                 f"expected: {offset_groups * kk} (offset_groups * kernel_h * kernel_w = "
                 f"{offset_groups} * {kernel_h} * {kernel_w})")
    torch._check(offset.shape[0] == input.shape[0], lambda: "deform_conv2d: offset.shape[0] "
                 f"({offset.shape[0]}) must equal the batch size input.shape[0] ({input.shape[0]})")
    torch._check(not use_mask or mask.shape[0] == input.shape[0], lambda: "deform_conv2d: "
                 f"mask.shape[0] ({mask.shape[0]}) must equal the batch size input.shape[0] "
                 f"({input.shape[0]})")
    span_h = dilation_h * (kernel_h - 1) + 1
    span_w = dilation_w * (kernel_w - 1) + 1
    # C++ divides int64 toward zero; the sizes are only used once the next check passed
    out_h = (height + 2 * pad_h - span_h) // stride_h + 1
    out_w = (width + 2 * pad_w - span_w) // stride_w + 1
    torch._check(height + 2 * pad_h >= span_h and width + 2 * pad_w >= span_w,
                 lambda: f"deform_conv2d: the dilated kernel ({span_h} x {span_w}) is larger "
                 f"than the padded input ({height + 2 * pad_h} x {width + 2 * pad_w})")
    torch._check(offset.shape[2] == out_h and offset.shape[3] == out_w,
                 lambda: "deform_conv2d: offset spatial size must equal the output size "
                 f"({out_h}, {out_w}), got ({offset.shape[2]}, {offset.shape[3]})")
    torch._check(not use_mask or (mask.shape[2] == out_h and mask.shape[3] == out_w),
                 lambda: "deform_conv2d: mask spatial size must equal the output size "
                 f"({out_h}, {out_w}), got ({mask.shape[2]}, {mask.shape[3]})")
    # dtypes last, as in torchvision, whose shape errors come first whatever the dtypes
    torch._check(
        input.dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16),
        lambda: "deform_conv2d: input must be a floating point tensor (float16, bfloat16, "
        f"float32 or float64), got {_scalar_type_name(input.dtype)}",
    )
    for name, t in (("input", input), ("weight", weight), ("offset", offset), ("mask", mask),
                    ("bias", bias)):
        torch._check(
            t.dtype == input.dtype,
            lambda name=name, t=t: f"deform_conv2d: expected {name} to have the same dtype as "
            f"input ({_scalar_type_name(input.dtype)}), got {_scalar_type_name(t.dtype)}",
        )
    return out_h, out_w


def _device_name(t: Tensor) -> str:
    """c10::DeviceTypeName of a tensor's device type (CPU, CUDA, MPS, META)."""
    return t.device.type.upper() if t.device.type != "mps" else "MPS"


def _check_grad(grad, input, out_shape):
    """check_deform_conv2d_grad (csrc/common.h)."""
    check_storage_holds("deform_conv2d backward", "grad", grad)
    torch._check(
        grad.device == input.device,
        lambda: f"deform_conv2d backward: grad must be a {_device_name(input)} tensor on the same "
        f"device as input ({input.device}), got {grad.device}",
    )
    torch._check(
        grad.dtype == input.dtype,
        lambda: "deform_conv2d backward: expected grad to have the same dtype as input "
        f"({_scalar_type_name(input.dtype)}), got {_scalar_type_name(grad.dtype)}",
    )
    torch._check(
        grad.dim() == 4 and tuple(grad.shape) == tuple(out_shape),
        lambda: "deform_conv2d backward: grad must have the output shape "
        f"({', '.join(str(s) for s in out_shape)}), got {_sizes(grad)}",
    )


@torch.library.register_fake("opforge::deform_conv2d")
def _deform_conv2d_fake(input, weight, offset, mask, bias, stride_h, stride_w, pad_h, pad_w,
                        dilation_h, dilation_w, groups, offset_groups, use_mask):
    out_h, out_w = _check_shapes(input, weight, offset, mask, bias, stride_h, stride_w, pad_h,
                                 pad_w, dilation_h, dilation_w, groups, offset_groups, use_mask)
    return input.new_empty((input.shape[0], weight.shape[0], out_h, out_w))


@torch.library.register_fake("opforge::_deform_conv2d_backward")
def _deform_conv2d_backward_fake(grad, input, weight, offset, mask, bias, stride_h, stride_w,
                                 pad_h, pad_w, dilation_h, dilation_w, groups, offset_groups,
                                 use_mask):
    out_h, out_w = _check_shapes(input, weight, offset, mask, bias, stride_h, stride_w, pad_h,
                                 pad_w, dilation_h, dilation_w, groups, offset_groups, use_mask)
    _check_grad(grad, input, (input.shape[0], weight.shape[0], out_h, out_w))
    return (
        input.new_empty(input.shape),
        weight.new_empty(weight.shape),
        offset.new_empty(offset.shape),
        mask.new_empty(mask.shape),
        bias.new_empty(bias.shape),
    )


# --- autograd ------------------------------------------------------------------

_PARAMS = ("stride_h", "stride_w", "pad_h", "pad_w", "dilation_h", "dilation_w",
           "groups", "offset_groups", "use_mask")


def _setup_context(ctx, inputs, output):
    input, weight, offset, mask, bias, *params = inputs
    ctx.save_for_backward(input, weight, offset, mask, bias)
    ctx.params = params


def _backward(ctx, grad):
    input, weight, offset, mask, bias = ctx.saved_tensors
    alert_cuda_atomics("opforge::deform_conv2d_backward_cuda", grad,
                       grad.numel() > 0 and input.numel() > 0)
    grad_input, grad_weight, grad_offset, grad_mask, grad_bias = torch.ops.opforge._deform_conv2d_backward(
        grad, input, weight, offset, mask, bias, *ctx.params
    )
    return (grad_input, grad_weight, grad_offset, grad_mask, grad_bias) + (None,) * len(_PARAMS)


register_autograd("deform_conv2d", _backward, _setup_context)
forbid_double_backward("_deform_conv2d_backward", "deform_conv2d")
register_autocast("deform_conv2d")
