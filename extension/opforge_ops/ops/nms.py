"""nms and batched_nms (torch.ops.opforge.nms)."""

import torch
from torch import Tensor

# Above this many box coordinates the per-class loop beats offsetting boxes (as in torchvision).
_VANILLA_THRESHOLD = {"cpu": 4000}
_VANILLA_THRESHOLD_OTHER = 20000


def nms(boxes: Tensor, scores: Tensor, iou_threshold: float) -> Tensor:
    """Greedy non-maximum suppression.

    boxes: Tensor[N, 4] as (x1, y1, x2, y2); scores: Tensor[N]. Returns the int64 indices of the
    kept boxes, by decreasing score (equal scores keep input order). A box is suppressed when its
    IoU with a kept, higher-scoring box is greater than iou_threshold.
    """
    return torch.ops.opforge.nms(boxes, scores, iou_threshold)


def batched_nms(boxes: Tensor, scores: Tensor, idxs: Tensor, iou_threshold: float) -> Tensor:
    """NMS per category: boxes with different idxs never suppress each other."""
    if idxs.dim() != 1 or idxs.size(0) != boxes.size(0):
        raise ValueError(
            f"idxs must be a 1-D tensor with one entry per box ({boxes.size(0)}), got {list(idxs.shape)}"
        )
    limit = _VANILLA_THRESHOLD.get(boxes.device.type, _VANILLA_THRESHOLD_OTHER)
    tracing = torch.jit.is_tracing() or torch.compiler.is_compiling()
    if boxes.numel() > limit and not tracing:
        return _batched_nms_per_class(boxes, scores, idxs, iou_threshold)
    return _batched_nms_coordinate_offset(boxes, scores, idxs, iou_threshold)


def _batched_nms_coordinate_offset(boxes, scores, idxs, iou_threshold):
    # Shift each category by more than the largest coordinate so categories never overlap.
    if boxes.numel() == 0:
        return torch.empty((0,), dtype=torch.int64, device=boxes.device)
    max_coordinate = boxes.max()
    offsets = idxs.to(boxes) * (max_coordinate + torch.tensor(1).to(boxes))
    return nms(boxes + offsets[:, None], scores, iou_threshold)


def _batched_nms_per_class(boxes, scores, idxs, iou_threshold):
    keep_mask = torch.zeros_like(scores, dtype=torch.bool)
    for category in torch.unique(idxs):
        members = torch.where(idxs == category)[0]
        kept = nms(boxes[members], scores[members], iou_threshold)
        keep_mask[members[kept]] = True
    keep = torch.where(keep_mask)[0]
    return keep[scores[keep].sort(descending=True, stable=True)[1]]


@torch.library.register_fake("opforge::nms")
def _nms_fake(dets, scores, iou_threshold):
    torch._check(
        dets.dim() == 2 and dets.size(1) == 4,
        lambda: f"nms: boxes (dets) must have shape [N, 4], got {list(dets.shape)}",
    )
    torch._check(
        scores.dim() == 1,
        lambda: f"nms: scores must be a 1-D tensor [N], got shape {list(scores.shape)}",
    )
    torch._check(
        dets.size(0) == scores.size(0),
        lambda: "nms: boxes (dets) and scores must have the same length",
    )
    torch._check(
        dets.dtype == scores.dtype, lambda: "nms: boxes (dets) and scores must have the same dtype"
    )
    kept = torch.library.get_ctx().new_dynamic_size()
    return dets.new_empty(kept, dtype=torch.int64)
