"""nms and batched_nms (torch.ops.opforge.nms).

Scriptable and torch.fx leaves (see _utils.py). batched_nms picks its strategy as torchvision
does: offset the boxes of each category apart (one nms call), or above a size threshold and
outside tracing, one nms call per category.
"""

import torch
import torch.fx
from torch import Tensor

from ._checks import check_nms_inputs, check_nms_shapes, scalar_type_name
from ._dispatch import register_autocast, register_not_differentiable, register_quantized_cpu
from ._utils import fx_leaf_call


@torch.fx.wrap
def nms(boxes: Tensor, scores: Tensor, iou_threshold: float) -> Tensor:
    """Greedy non-maximum suppression.

    boxes: Tensor[N, 4] as (x1, y1, x2, y2); scores: Tensor[N]. Returns the int64 indices of the
    kept boxes, by decreasing score (equal scores keep input order). A box is suppressed when its
    IoU with a kept, higher-scoring box is greater than iou_threshold. Quantized boxes and
    scores (quint8, qint8, qint32) run the QuantizedCPU kernel.
    """
    if not torch.jit.is_scripting():
        leaf = fx_leaf_call(nms, (boxes, scores, iou_threshold))
        if leaf is not None:
            return leaf
    return torch.ops.opforge.nms(boxes, scores, iou_threshold)


@torch.fx.wrap
def batched_nms(boxes: Tensor, scores: Tensor, idxs: Tensor, iou_threshold: float) -> Tensor:
    """NMS per category: boxes with different idxs never suppress each other.

    idxs: Tensor[N] of category indices. Returns the int64 indices of the kept boxes by
    decreasing score.
    """
    if not torch.jit.is_scripting():
        leaf = fx_leaf_call(batched_nms, (boxes, scores, idxs, iou_threshold))
        if leaf is not None:
            return leaf
    # no boxes: nothing to keep, whatever scores and idxs are (torchvision looks at neither)
    if boxes.numel() == 0:
        return torch.empty((0,), dtype=torch.int64, device=boxes.device)
    # torchvision's coordinate trick broadcasts idxs against the boxes: a 0-D idxs is an
    # IndexError there, one category for every box ([1]) is accepted, any other length fails.
    if idxs.dim() == 0:
        raise IndexError("batched_nms: idxs must be a 1-D tensor [N] of categories, got a 0-D tensor")
    if boxes.dim() > 0 and idxs.size(0) == 1 and boxes.size(0) != 1:
        idxs = idxs.expand(boxes.size(0))
    if idxs.dim() != 1 or boxes.dim() == 0 or idxs.size(0) != boxes.size(0):
        raise RuntimeError(
            f"batched_nms: idxs must be a 1-D tensor with one category per box, got idxs of "
            f"shape {idxs.shape} for boxes of shape {boxes.shape}"
        )
    # The thresholds torchvision measured: above them one nms per category is faster.
    limit = 4000 if boxes.device.type == "cpu" else 100_000
    if boxes.numel() > limit and not torch.jit.is_tracing():
        return _batched_nms_vanilla(boxes, scores, idxs, iou_threshold)
    return _batched_nms_coordinate_trick(boxes, scores, idxs, iou_threshold)


@torch.jit._script_if_tracing
def _batched_nms_coordinate_trick(
    boxes: Tensor, scores: Tensor, idxs: Tensor, iou_threshold: float
) -> Tensor:
    # Shift each category by more than the largest coordinate so categories never overlap.
    if boxes.numel() == 0:
        return torch.empty((0,), dtype=torch.int64, device=boxes.device)
    # (callers are past the torch.fx leaf check: the op itself, without nms()'s wrapper)
    offsets = idxs.to(boxes) * (boxes.max() + 1)
    return torch.ops.opforge.nms(boxes + offsets[:, None], scores, iou_threshold)


@torch.jit._script_if_tracing
def _batched_nms_vanilla(
    boxes: Tensor, scores: Tensor, idxs: Tensor, iou_threshold: float
) -> Tensor:
    # Group the boxes by category once (a stable sort keeps each category's boxes in input
    # order, as torch.where would), then one nms per contiguous slice.
    # Every gather is index_select, which stays on the calling thread at these sizes: advanced
    # indexing (x[order]) starts torch's OpenMP team, and on a busy machine each of its
    # parallel regions can wait a scheduler time slice for the second thread.
    order = torch.sort(idxs, stable=True)[1]
    counts: list[int] = torch.unique_consecutive(
        idxs.index_select(0, order), return_counts=True)[1].tolist()
    grouped_boxes = boxes.index_select(0, order).split(counts)
    grouped_scores = scores.index_select(0, order).split(counts)
    # positions in the sorted order (one gather back through order at the end: a small
    # gather per category is slower)
    kept: list[Tensor] = [order[:0]]  # no categories (no boxes): nothing kept
    start = 0
    for i in range(len(counts)):
        k = torch.ops.opforge.nms(grouped_boxes[i], grouped_scores[i], iou_threshold)
        kept.append(k + start)
        start += counts[i]
    keep = order.index_select(0, torch.cat(kept)).sort()[0]
    by_score = scores.index_select(0, keep).sort(descending=True, stable=True)[1]
    return keep.index_select(0, by_score)


@torch.library.register_fake("opforge::nms")
def _nms_fake(dets, scores, iou_threshold):
    check_nms_inputs(dets, scores)
    kept = torch.library.get_ctx().new_dynamic_size()
    return dets.new_empty(kept, dtype=torch.int64)


def _quantized_nms(dets: Tensor, scores: Tensor, iou_threshold: float) -> Tensor:
    """nms of quantized boxes and scores where the library has no QuantizedCPU kernel (a
    stable-ABI build), with csrc/quantized/cpu/nms_kernel.cpp's checks and decisions: the IoU
    does not change under the boxes' common scale and zero point, and integer scores order like
    the values they quantize, so the float kernel runs on the integer representations in
    float32, as the C++ kernel and torchvision's compute them: for qint32 values float32 cannot
    hold exactly, float64 would decide near-threshold pairs differently from torchvision."""
    check_nms_shapes(dets, scores)
    torch._check(
        dets.is_quantized and scores.is_quantized and dets.dtype == scores.dtype,
        lambda: "nms: quantized boxes (dets) need scores quantized to the same dtype, got "
        f"{scalar_type_name(dets.dtype)} and {scalar_type_name(scores.dtype)}",
    )
    torch._check(
        dets.qscheme() == torch.per_tensor_affine and scores.qscheme() == torch.per_tensor_affine,
        lambda: "nms: quantized boxes and scores must be quantized per tensor (affine)",
    )
    return torch.ops.opforge.nms(dets.int_repr().to(torch.float32),
                                 scores.int_repr().to(torch.float32), iou_threshold)


register_autocast("nms")
register_not_differentiable("nms")
register_quantized_cpu("nms", _quantized_nms)
