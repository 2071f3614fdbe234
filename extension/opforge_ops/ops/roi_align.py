"""roi_align and RoIAlign (torch.ops.opforge.roi_align).

Scriptable, a torch.fx leaf, and checked in torchvision's order (see _utils.py).
"""


import torch
import torch.fx
from torch import Tensor, nn
from torch.jit.annotations import BroadcastingList2
from torch.nn.modules.utils import _pair

from ._checks import (
    check_roi_backward_inputs,
    check_roi_inputs,
    check_roi_shapes,
    check_sampling_ratio,
    scalar_type_name,
)
from ._dispatch import (
    alert_cuda_atomics,
    below_python_autograd,
    forbid_double_backward,
    register_autocast,
    register_autograd,
    register_quantized_cpu,
)
from ._utils import check_quantized_rois, fx_leaf_call, rois_from_boxes


@torch.fx.wrap
def roi_align(
    input: Tensor,
    boxes: Tensor | list[Tensor],
    output_size: BroadcastingList2[int],
    spatial_scale: float = 1.0,
    sampling_ratio: int = -1,
    aligned: bool = False,
) -> Tensor:
    """Region of Interest Align (Mask R-CNN).

    input: Tensor[N, C, H, W] (quantized: N == 1, boxes quantized too); boxes: Tensor[K, 5]
    (batch index, x1, y1, x2, y2) or a list of Tensor[L, 4], one per image. output_size: int or
    (height, width). spatial_scale maps box coordinates onto input coordinates. sampling_ratio:
    bilinear samples per bin side (<= 0: adaptive, ceil(roi size / output size)). aligned: shift
    boxes by -0.5 pixel for exact alignment. Returns Tensor[K, C, output_size[0], output_size[1]].
    """
    if not torch.jit.is_scripting():
        leaf = fx_leaf_call(roi_align, (input, boxes, output_size, spatial_scale, sampling_ratio, aligned))
        if leaf is not None:
            return leaf
    rois = rois_from_boxes(boxes)
    output_size = _pair(output_size)
    if not torch.jit.is_scripting():
        check_quantized_rois(input, rois)
        if below_python_autograd("roi_align", input, rois):  # (the stable build)
            with torch._C._AutoDispatchBelowAutograd():
                return torch.ops.opforge.roi_align(
                    input, rois, spatial_scale, output_size[0], output_size[1], sampling_ratio,
                    aligned
                )
    return torch.ops.opforge.roi_align(
        input, rois, spatial_scale, output_size[0], output_size[1], sampling_ratio, aligned
    )


class RoIAlign(nn.Module):
    """See :func:`roi_align`."""

    def __init__(
        self,
        output_size: BroadcastingList2[int],
        spatial_scale: float,
        sampling_ratio: int,
        aligned: bool = False,
    ):
        super().__init__()
        self.output_size = output_size
        self.spatial_scale = spatial_scale
        self.sampling_ratio = sampling_ratio
        self.aligned = aligned

    def forward(self, input: Tensor, rois: Tensor | list[Tensor]) -> Tensor:
        return roi_align(
            input, rois, self.output_size, self.spatial_scale, self.sampling_ratio, self.aligned
        )

    def __repr__(self) -> str:
        return (
            f"{self.__class__.__name__}(output_size={self.output_size}, "
            f"spatial_scale={self.spatial_scale}, sampling_ratio={self.sampling_ratio}, "
            f"aligned={self.aligned})"
        )


@torch.library.register_fake("opforge::roi_align")
def _roi_align_fake(
    input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned
):
    check_roi_inputs("roi_align", input, rois, pooled_height, pooled_width)
    check_sampling_ratio("roi_align", sampling_ratio, pooled_height, pooled_width)
    return input.new_empty((rois.size(0), input.size(1), pooled_height, pooled_width))


@torch.library.register_fake("opforge::_roi_align_backward")
def _roi_align_backward_fake(
    grad,
    rois,
    spatial_scale,
    pooled_height,
    pooled_width,
    batch_size,
    channels,
    height,
    width,
    sampling_ratio,
    aligned,
):
    check_roi_backward_inputs("_roi_align_backward", grad, rois, pooled_height, pooled_width,
                              batch_size, channels, height, width)
    check_sampling_ratio("_roi_align_backward", sampling_ratio, pooled_height, pooled_width)
    return grad.new_empty((batch_size, channels, height, width))


def _roi_align_setup_context(ctx, inputs, output):
    input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned = inputs
    ctx.save_for_backward(rois)
    ctx.input_shape = input.shape
    ctx.args = (spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned)


def _roi_align_backward(ctx, grad_output):
    (rois,) = ctx.saved_tensors
    spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned = ctx.args
    batch_size, channels, height, width = ctx.input_shape
    alert_cuda_atomics("opforge::roi_align_backward_cuda", grad_output,
                       grad_output.numel() > 0 and batch_size * channels * height * width > 0)
    grad_input = torch.ops.opforge._roi_align_backward(
        grad_output,
        rois,
        spatial_scale,
        pooled_height,
        pooled_width,
        batch_size,
        channels,
        height,
        width,
        sampling_ratio,
        aligned,
    )
    return grad_input, None, None, None, None, None, None


register_autograd("roi_align", _roi_align_backward, _roi_align_setup_context)
forbid_double_backward("_roi_align_backward", "roi_align")
register_autocast("roi_align")


def _quantized_roi_align(input: Tensor, rois: Tensor, spatial_scale: float, pooled_height: int,
                         pooled_width: int, sampling_ratio: int, aligned: bool) -> Tensor:
    """roi_align of a quantized input where the library has no QuantizedCPU kernel (a stable-ABI
    build), with csrc/quantized/cpu/roi_align_kernel.cpp's checks: the float kernel on the
    dequantized input and rois, requantized with the input's scale and zero point (what
    torchvision's own test compares its quantized kernel with; the C++ kernel sums the integer
    values instead and can differ from it by one quantum)."""
    check_roi_shapes("roi_align", input, rois)
    torch._check(
        input.is_quantized and rois.is_quantized and input.qscheme() == torch.per_tensor_affine
        and rois.qscheme() == torch.per_tensor_affine,
        lambda: "roi_align: a quantized input needs rois quantized too, both per tensor (affine)",
    )
    torch._check(
        input.dtype == rois.dtype,
        lambda: "roi_align: input and rois must have the same dtype, got "
        f"{scalar_type_name(input.dtype)} and {scalar_type_name(rois.dtype)}",
    )
    torch._check(
        input.size(0) == 1,
        lambda: "roi_align: Only one image per batch is allowed when the input is quantized (as in "
        f"torchvision), got batch size {input.size(0)}",
    )
    out = torch.ops.opforge.roi_align(input.dequantize(), rois.dequantize(), spatial_scale,
                                      pooled_height, pooled_width, sampling_ratio, aligned)
    return torch.quantize_per_tensor(out, input.q_scale(), input.q_zero_point(), input.dtype)


register_quantized_cpu("roi_align", _quantized_roi_align)
