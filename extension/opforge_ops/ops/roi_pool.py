"""roi_pool and RoIPool (torch.ops.opforge.roi_pool).

Scriptable, a torch.fx leaf, and checked in torchvision's order (see _utils.py).
"""


import torch
import torch.fx
from torch import Tensor, nn
from torch.jit.annotations import BroadcastingList2
from torch.nn.modules.utils import _pair

from ._checks import check_int32_like_grad, check_roi_backward_inputs, check_roi_inputs
from ._dispatch import (
    alert_cuda_atomics,
    below_python_autograd,
    forbid_double_backward,
    register_autocast,
    register_autograd,
)
from ._utils import fx_leaf_call, rois_from_boxes


@torch.fx.wrap
def roi_pool(
    input: Tensor,
    boxes: Tensor | list[Tensor],
    output_size: BroadcastingList2[int],
    spatial_scale: float = 1.0,
) -> Tensor:
    """Region of Interest Pool (Fast R-CNN): max over each quantized bin.

    input: Tensor[N, C, H, W]; boxes: Tensor[K, 5] (batch index, x1, y1, x2, y2) or a list of
    Tensor[L, 4], one per image. output_size: int or (height, width).
    Returns Tensor[K, C, output_size[0], output_size[1]].
    """
    if not torch.jit.is_scripting():
        leaf = fx_leaf_call(roi_pool, (input, boxes, output_size, spatial_scale))
        if leaf is not None:
            return leaf
    rois = rois_from_boxes(boxes)
    output_size = _pair(output_size)
    if not torch.jit.is_scripting():
        if below_python_autograd("roi_pool", input, rois):  # (the stable build)
            with torch._C._AutoDispatchBelowAutograd():
                return torch.ops.opforge.roi_pool(
                    input, rois, spatial_scale, output_size[0], output_size[1]
                )[0]
    output, _ = torch.ops.opforge.roi_pool(input, rois, spatial_scale, output_size[0], output_size[1])
    return output


class RoIPool(nn.Module):
    """See :func:`roi_pool`."""

    def __init__(self, output_size: BroadcastingList2[int], spatial_scale: float):
        super().__init__()
        self.output_size = output_size
        self.spatial_scale = spatial_scale

    def forward(self, input: Tensor, rois: Tensor | list[Tensor]) -> Tensor:
        return roi_pool(input, rois, self.output_size, self.spatial_scale)

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(output_size={self.output_size}, spatial_scale={self.spatial_scale})"


@torch.library.register_fake("opforge::roi_pool")
def _roi_pool_fake(input, rois, spatial_scale, pooled_height, pooled_width):
    check_roi_inputs("roi_pool", input, rois, pooled_height, pooled_width)
    shape = (rois.size(0), input.size(1), pooled_height, pooled_width)
    return input.new_empty(shape), input.new_empty(shape, dtype=torch.int32)


@torch.library.register_fake("opforge::_roi_pool_backward")
def _roi_pool_backward_fake(
    grad,
    rois,
    argmax,
    spatial_scale,
    pooled_height,
    pooled_width,
    batch_size,
    channels,
    height,
    width,
):
    op = "_roi_pool_backward"
    check_roi_backward_inputs(op, grad, rois, pooled_height, pooled_width, batch_size, channels,
                              height, width)
    check_int32_like_grad(op, "argmax", argmax, grad)
    return grad.new_empty((batch_size, channels, height, width))


def _roi_pool_setup_context(ctx, inputs, output):
    input, rois, spatial_scale, pooled_height, pooled_width = inputs
    _, argmax = output
    ctx.mark_non_differentiable(argmax)
    # no zero-filled gradient for argmax (an output-sized fill per backward)
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(rois, argmax)
    ctx.input_shape = input.shape
    ctx.args = (spatial_scale, pooled_height, pooled_width)


def _roi_pool_backward(ctx, grad_output, grad_argmax):
    if grad_output is None:  # grads are not materialized: nothing reached the output
        return None, None, None, None, None
    rois, argmax = ctx.saved_tensors
    spatial_scale, pooled_height, pooled_width = ctx.args
    batch_size, channels, height, width = ctx.input_shape
    alert_cuda_atomics("opforge::roi_pool_backward_cuda", grad_output,
                       grad_output.numel() > 0 and batch_size * channels * height * width > 0)
    grad_input = torch.ops.opforge._roi_pool_backward(
        grad_output,
        rois,
        argmax,
        spatial_scale,
        pooled_height,
        pooled_width,
        batch_size,
        channels,
        height,
        width,
    )
    return grad_input, None, None, None, None


register_autograd("roi_pool", _roi_pool_backward, _roi_pool_setup_context)
forbid_double_backward("_roi_pool_backward", "roi_pool")
register_autocast("roi_pool")
