"""How `opforge smoke` calls each op of torch.ops.opforge (matrix.yaml: extension.recipes).

Loaded by the smoke probe inside the environment under test, so it imports only the standard
library and torch. Inputs are built on the CPU; the probe moves tensors to every present
device and compares each device with the CPU. docs/adopt.md describes every field.
"""

import torch


def _boxes():
    dets = torch.tensor([[0.0, 0.0, 10.0, 10.0], [1.0, 1.0, 11.0, 11.0],
                         [50.0, 50.0, 60.0, 60.0], [0.0, 0.0, 9.0, 10.0],
                         [52.0, 50.0, 62.0, 61.0]])
    scores = torch.tensor([0.9, 0.8, 0.7, 0.95, 0.6])
    return dets, scores


def _rois():
    return torch.tensor([[0.0, 0.5, 0.5, 4.5, 3.5], [0.0, 1.0, 0.0, 3.0, 4.0],
                         [1.0, 0.0, 0.0, 5.0, 5.0]])


def _features(channels, dtype):
    g = torch.Generator().manual_seed(0)
    return torch.rand(2, channels, 6, 6, generator=g).to(dtype)


def nms_inputs(dtype):
    dets, scores = _boxes()
    return [dets.to(dtype), scores.to(dtype), 0.5]


# Output grids are 2 x 3, not square, so a kernel (or a fake kernel: extension/tests/
# test_fake_rules.py builds its valid calls from these recipes) that swaps height and width fails.
def roi_align_inputs(dtype):
    return [_features(3, dtype), _rois().to(dtype), 1.0, 2, 3, 2, True]


def roi_pool_inputs(dtype):
    return [_features(3, dtype), _rois().to(dtype), 1.0, 2, 3]


def ps_roi_align_inputs(dtype):
    # 2 output channels per bin of a 2x3 grid: 12 input channels
    return [_features(12, dtype), _rois().to(dtype), 1.0, 2, 3, 2]


def ps_roi_pool_inputs(dtype):
    return [_features(12, dtype), _rois().to(dtype), 1.0, 2, 3]


def deform_conv2d_inputs(dtype):
    g = torch.Generator().manual_seed(1)
    x = torch.rand(1, 2, 5, 5, generator=g)
    w = torch.rand(3, 2, 3, 3, generator=g)
    b = torch.rand(3, generator=g)
    # no padding: the 3x3 output is not the input's 5x5, so a wrong output shape shows
    offset = torch.rand(1, 18, 3, 3, generator=g) - 0.5
    mask = torch.rand(1, 9, 3, 3, generator=g)
    tensors = [t.to(dtype) for t in (x, w, offset, mask, b)]
    return [*tensors, 1, 1, 0, 0, 1, 1, 1, 1, True]


def constant_map_gives_the_constant(call, args, out):
    """roi_align / roi_pool of a map constant per channel give that constant in every bin."""
    channels = args[0].shape[1]
    x = torch.arange(1.0, 1.0 + channels).view(1, -1, 1, 1).expand_as(args[0]).contiguous()
    res = call(x, *args[1:])
    res = res[0] if isinstance(res, (tuple, list)) else res
    want = torch.arange(1.0, 1.0 + channels).view(1, -1, 1, 1).expand_as(res)
    if not torch.allclose(res, want, atol=1e-5):
        return "on a constant feature map it did not return the constant"
    return None


def each_bin_reads_its_own_channel(call, args, out):
    """ps_roi_align / ps_roi_pool of a map whose channel k is the constant k + 1: output channel
    c of bin (i, j) gives the constant of input channel (c * PH + i) * PW + j."""
    channels, pooled_height, pooled_width = args[0].shape[1], args[3], args[4]
    x = torch.arange(1.0, 1.0 + channels).view(1, -1, 1, 1).expand_as(args[0]).contiguous()
    res = call(x, *args[1:])[0]
    want = torch.arange(1.0, 1.0 + channels).view(1, -1, pooled_height, pooled_width).expand_as(res)
    if not torch.allclose(res, want, atol=1e-5):
        return "on a map constant per channel, a bin did not return its own channel's constant"
    return None


def zero_offsets_give_conv2d(call, args, out):
    """Zero offsets and a mask of ones make deformable convolution a plain convolution."""
    x, w, offset, mask, b = args[:5]
    got = call(x, w, torch.zeros_like(offset), torch.ones_like(mask), b, *args[5:])
    stride, padding, dilation, groups = args[5:7], args[7:9], args[9:11], args[11]
    want = torch.nn.functional.conv2d(x, w, b, stride=stride, padding=padding, dilation=dilation, groups=groups)
    if not torch.allclose(got, want, atol=1e-5, rtol=1e-4):
        return f"with zero offsets it differs from conv2d by {float((got - want).abs().max()):.3g}"
    return None


# ----------------------------------------------------------------------------- workloads
# `opforge bench` times each op on these shapes (forward, and backward where `grad` says) against
# torchvision's kernel; the smoke speed check times the first one (small) against the CPU.


def _torchvision(op):
    """torchvision's kernel of the same schema (torchvision is imported only when bench calls it)."""
    def reference(*args):
        import torchvision  # noqa: F401 - registers torch.ops.torchvision

        return getattr(torch.ops.torchvision, op)(*args)
    reference.__name__ = f"torchvision::{op}"
    return reference


def _random_boxes(n, size, g):
    xy = torch.rand(n, 2, generator=g) * size
    wh = torch.rand(n, 2, generator=g) * size / 4 + 1
    return torch.cat([xy, xy + wh], dim=1)


def _nms_load(n):
    def inputs(dtype):
        g = torch.Generator().manual_seed(n)
        return [_random_boxes(n, 512.0, g).to(dtype), torch.rand(n, generator=g).to(dtype), 0.5]
    return {"inputs": inputs}


def _roi_load(batch, channels, size, rois, extra, interior=False):
    """Features batch x channels x size x size, `rois` boxes spread over the batch. interior:
    boxes stay off the last row and column, where torchvision's ps_roi_pool backward spreads
    gradient its forward never read from (ours is the gradient of the forward: see README)."""
    def inputs(dtype):
        g = torch.Generator().manual_seed(channels * size + rois)
        x = torch.rand(batch, channels, size, size, generator=g)
        index = torch.randint(0, batch, (rois, 1), generator=g).float()
        boxes = _random_boxes(rois, size * 0.9, g)
        if interior:
            boxes = boxes.clamp(max=size - 2)
        return [x.to(dtype), torch.cat([index, boxes], dim=1).to(dtype), *extra]
    return {"inputs": inputs}


def _roi_workloads(pooled, extra_tail, channels_per_bin=None, interior=False):
    """small / medium / large for the four RoI ops; ps_ ops need channels = C * PH * PW."""
    def channels(c):
        return c if channels_per_bin is None else channels_per_bin * c * pooled * pooled // 16
    head = [1.0, pooled, pooled]
    return {"small": _roi_load(1, channels(16), 32, 32, [*head, *extra_tail], interior),
            "medium": _roi_load(2, channels(64), 64, 128, [*head, *extra_tail], interior),
            "large": _roi_load(2, channels(256), 64, 512, [*head, *extra_tail], interior)}


def _deform_load(batch, channels, size):
    def inputs(dtype):
        g = torch.Generator().manual_seed(channels * size)
        x = torch.rand(batch, channels, size, size, generator=g)
        w = torch.rand(channels, channels, 3, 3, generator=g) / channels
        offset = torch.rand(batch, 18, size, size, generator=g) * 2 - 1
        mask = torch.rand(batch, 9, size, size, generator=g)
        b = torch.rand(channels, generator=g)
        return [*(t.to(dtype) for t in (x, w, offset, mask, b)), 1, 1, 1, 1, 1, 1, 1, 1, True]
    return {"inputs": inputs}


RECIPES = {
    # boxes 3, 0, 1 overlap (IoU > 0.5): 3 wins; boxes 2 and 4 overlap: 2 wins
    "nms": {"inputs": nms_inputs, "expected": [3, 2], "autocast": [0],
            "reference": "torchvision.ops.nms",
            "workloads": {"small": _nms_load(200), "medium": _nms_load(2000),
                          "large": _nms_load(10000)}},
    "roi_align": {"inputs": roi_align_inputs, "check": constant_map_gives_the_constant,
                  "grad": [0], "autocast": [0], "reference": _torchvision("roi_align"),
                  "workloads": _roi_workloads(7, [2, False])},
    # argmax ties may legitimately resolve differently per device: compare the values only
    "roi_pool": {"inputs": roi_pool_inputs, "check": constant_map_gives_the_constant,
                 "grad": [0], "outputs": [0], "reference": _torchvision("roi_pool"),
                 "workloads": _roi_workloads(7, [])},
    "ps_roi_align": {"inputs": ps_roi_align_inputs, "check": each_bin_reads_its_own_channel,
                     "grad": [0], "autocast": [0], "reference": _torchvision("ps_roi_align"),
                     "workloads": _roi_workloads(4, [2], channels_per_bin=1)},
    "ps_roi_pool": {"inputs": ps_roi_pool_inputs, "check": each_bin_reads_its_own_channel,
                    "grad": [0], "autocast": [0], "reference": _torchvision("ps_roi_pool"),
                    "workloads": _roi_workloads(4, [], channels_per_bin=1, interior=True)},
    "deform_conv2d": {"inputs": deform_conv2d_inputs, "check": zero_offsets_give_conv2d,
                      "grad": [0, 1, 2, 3, 4], "reference": _torchvision("deform_conv2d"),
                      "workloads": {"small": _deform_load(1, 8, 16), "medium": _deform_load(2, 32, 32),
                                    "large": _deform_load(4, 64, 64)}},
}
