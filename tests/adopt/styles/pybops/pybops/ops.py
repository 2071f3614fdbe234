"""A device registry, as mmcv's: the implementation is chosen by the input's device."""

import pybops

_IMPLS = {"cpu": pybops._ext_cpu.pairwise_iou}
if pybops._ext_cuda is not None:
    _IMPLS["cuda"] = pybops._ext_cuda.pairwise_iou


def pairwise_iou(boxes1, boxes2):
    impl = _IMPLS.get(boxes1.device.type)
    if impl is None:
        raise RuntimeError(f"pairwise_iou: implementation for device {boxes1.device} not found")
    return impl(boxes1, boxes2)


def count_above(scores, threshold=0.5):
    return pybops._ext_cpu.count_above(scores.cpu(), threshold)
