"""Box format helpers shared by the RoI operators."""

import torch
from torch import Tensor


def convert_boxes_to_roi_format(boxes: list[Tensor]) -> Tensor:
    """[Tensor[L_i, 4]] -> Tensor[K, 5] whose first column is the index i of the image."""
    concat = torch.cat(list(boxes), dim=0)
    index = torch.cat(
        [
            torch.full((b.shape[0], 1), i, dtype=concat.dtype, device=concat.device)
            for i, b in enumerate(boxes)
        ],
        dim=0,
    )
    return torch.cat([index, concat], dim=1)


def check_roi_boxes_shape(boxes) -> None:
    if isinstance(boxes, (list, tuple)):
        if len(boxes) == 0:
            raise ValueError("boxes: an empty list has no images; pass a Tensor[0, 5] for no boxes")
        for i, b in enumerate(boxes):
            if not isinstance(b, Tensor):
                raise ValueError(f"boxes[{i}] must be a Tensor[L, 4], got {type(b).__name__}")
            if b.dim() != 2 or b.size(1) != 4:
                raise ValueError(f"boxes[{i}] must have shape [L, 4], got {list(b.shape)}")
    elif isinstance(boxes, Tensor):
        if boxes.dim() != 2 or boxes.size(1) != 5:
            raise ValueError(
                f"boxes must have shape [K, 5] (batch index, x1, y1, x2, y2), got {list(boxes.shape)}"
            )
    else:
        raise ValueError(
            f"boxes must be a Tensor[K, 5] or a list of Tensor[L, 4], got {type(boxes).__name__}"
        )


def rois_from_boxes(boxes) -> Tensor:
    check_roi_boxes_shape(boxes)
    return boxes if isinstance(boxes, Tensor) else convert_boxes_to_roi_format(boxes)


def pair(value, name: str) -> tuple[int, int]:
    if isinstance(value, int):
        return value, value
    if (
        isinstance(value, (list, tuple))
        and len(value) == 2
        and all(isinstance(v, int) for v in value)
    ):
        return int(value[0]), int(value[1])
    if isinstance(value, (list, tuple)) and len(value) == 1 and isinstance(value[0], int):
        return int(value[0]), int(value[0])
    raise ValueError(f"{name} must be an int or a pair of ints, got {value!r}")
