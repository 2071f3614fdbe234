"""ps_roi_align and PSRoIAlign (torch.ops.opforge.ps_roi_align): position-sensitive RoIAlign."""


import torch
import torch.fx
from torch import Tensor, nn
from torch.jit.annotations import BroadcastingList2
from torch.nn.modules.utils import _pair

from ._checks import check_ps_roi_backward_inputs, check_ps_roi_inputs, check_sampling_ratio
from ._dispatch import (
    alert_cuda_atomics,
    below_python_autograd,
    forbid_double_backward,
    register_autocast,
    register_autograd,
)
from ._utils import fx_leaf_call, rois_from_boxes


@torch.fx.wrap
def ps_roi_align(
    input: Tensor,
    boxes: Tensor | list[Tensor],
    output_size: BroadcastingList2[int],
    spatial_scale: float = 1.0,
    sampling_ratio: int = -1,
) -> Tensor:
    """Position-Sensitive Region of Interest Align (R-FCN).

    input: Tensor[N, C, H, W] with C a multiple of output_size[0] * output_size[1];
    boxes: Tensor[K, 5] (batch index, x1, y1, x2, y2) or a list of Tensor[L, 4], one per image.
    Output channel c of bin (i, j) averages bilinear samples of input channel
    (c * output_size[0] + i) * output_size[1] + j inside that bin (boxes shifted by -0.5 pixel).
    sampling_ratio: samples per bin side (<= 0: adaptive, ceil(roi size / output size); a box
    with no adaptive sample along a side averages to NaN, as in torchvision).
    Returns Tensor[K, C / (output_size[0] * output_size[1]), output_size[0], output_size[1]].
    """
    if not torch.jit.is_scripting():
        leaf = fx_leaf_call(ps_roi_align, (input, boxes, output_size, spatial_scale, sampling_ratio))
        if leaf is not None:
            return leaf
    rois = rois_from_boxes(boxes)
    output_size = _pair(output_size)
    if not torch.jit.is_scripting():
        if below_python_autograd("ps_roi_align", input, rois):  # (the stable build)
            with torch._C._AutoDispatchBelowAutograd():
                return torch.ops.opforge.ps_roi_align(
                    input, rois, spatial_scale, output_size[0], output_size[1], sampling_ratio
                )[0]
    output, _ = torch.ops.opforge.ps_roi_align(
        input, rois, spatial_scale, output_size[0], output_size[1], sampling_ratio
    )
    return output


class PSRoIAlign(nn.Module):
    """See :func:`ps_roi_align`."""

    def __init__(
        self, output_size: BroadcastingList2[int], spatial_scale: float, sampling_ratio: int
    ):
        super().__init__()
        self.output_size = output_size
        self.spatial_scale = spatial_scale
        self.sampling_ratio = sampling_ratio

    def forward(self, input: Tensor, rois: Tensor | list[Tensor]) -> Tensor:
        return ps_roi_align(input, rois, self.output_size, self.spatial_scale, self.sampling_ratio)

    def __repr__(self) -> str:
        return (
            f"{self.__class__.__name__}(output_size={self.output_size}, "
            f"spatial_scale={self.spatial_scale}, sampling_ratio={self.sampling_ratio})"
        )


def _ps_roi_outputs(input, rois, pooled_height, pooled_width):
    shape = (rois.size(0), input.size(1) // (pooled_height * pooled_width), pooled_height, pooled_width)
    return input.new_empty(shape), input.new_empty(shape, dtype=torch.int32)


@torch.library.register_fake("opforge::ps_roi_align")
def _ps_roi_align_fake(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio):
    check_ps_roi_inputs("ps_roi_align", input, rois, pooled_height, pooled_width)
    check_sampling_ratio("ps_roi_align", sampling_ratio, pooled_height, pooled_width)
    return _ps_roi_outputs(input, rois, pooled_height, pooled_width)


@torch.library.register_fake("opforge::_ps_roi_align_backward")
def _ps_roi_align_backward_fake(
    grad,
    rois,
    channel_mapping,
    spatial_scale,
    pooled_height,
    pooled_width,
    sampling_ratio,
    batch_size,
    channels,
    height,
    width,
):
    op = "_ps_roi_align_backward"
    check_ps_roi_backward_inputs(op, grad, rois, channel_mapping, pooled_height, pooled_width,
                                 batch_size, channels, height, width)
    check_sampling_ratio(op, sampling_ratio, pooled_height, pooled_width)
    return grad.new_empty((batch_size, channels, height, width))


def _ps_roi_align_setup_context(ctx, inputs, output):
    input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio = inputs
    _, channel_mapping = output
    ctx.mark_non_differentiable(channel_mapping)
    # no zero-filled gradient for channel_mapping (an output-sized fill per backward)
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(rois, channel_mapping)
    ctx.input_shape = input.shape
    ctx.args = (spatial_scale, pooled_height, pooled_width, sampling_ratio)


def _ps_roi_align_backward(ctx, grad_output, grad_channel_mapping):
    if grad_output is None:  # grads are not materialized: nothing reached the output
        return None, None, None, None, None, None
    rois, channel_mapping = ctx.saved_tensors
    spatial_scale, pooled_height, pooled_width, sampling_ratio = ctx.args
    batch_size, channels, height, width = ctx.input_shape
    alert_cuda_atomics("opforge::ps_roi_align_backward_cuda", grad_output,
                       grad_output.numel() > 0 and batch_size * channels * height * width > 0)
    grad_input = torch.ops.opforge._ps_roi_align_backward(
        grad_output,
        rois,
        channel_mapping,
        spatial_scale,
        pooled_height,
        pooled_width,
        sampling_ratio,
        batch_size,
        channels,
        height,
        width,
    )
    return grad_input, None, None, None, None, None


register_autograd("ps_roi_align", _ps_roi_align_backward, _ps_roi_align_setup_context)
forbid_double_backward("_ps_roi_align_backward", "ps_roi_align")
register_autocast("ps_roi_align")
