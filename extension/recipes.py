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


def roi_align_inputs(dtype):
    return [_features(3, dtype), _rois().to(dtype), 1.0, 2, 2, 2, True]


def roi_pool_inputs(dtype):
    return [_features(3, dtype), _rois().to(dtype), 1.0, 2, 2]


def ps_roi_align_inputs(dtype):
    # 2 output channels per bin of a 2x2 grid: 8 input channels
    return [_features(8, dtype), _rois().to(dtype), 1.0, 2, 2, 2]


def ps_roi_pool_inputs(dtype):
    return [_features(8, dtype), _rois().to(dtype), 1.0, 2, 2]


def deform_conv2d_inputs(dtype):
    g = torch.Generator().manual_seed(1)
    x = torch.rand(1, 2, 5, 5, generator=g)
    w = torch.rand(3, 2, 3, 3, generator=g)
    b = torch.rand(3, generator=g)
    offset = torch.rand(1, 18, 5, 5, generator=g) - 0.5
    mask = torch.rand(1, 9, 5, 5, generator=g)
    tensors = [t.to(dtype) for t in (x, w, offset, mask, b)]
    return [*tensors, 1, 1, 1, 1, 1, 1, 1, 1, True]


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
    want = torch.nn.functional.conv2d(x, w, b, stride=1, padding=1)
    if not torch.allclose(got, want, atol=1e-5, rtol=1e-4):
        return f"with zero offsets it differs from conv2d by {float((got - want).abs().max()):.3g}"
    return None


RECIPES = {
    # boxes 3, 0, 1 overlap (IoU > 0.5): 3 wins; boxes 2 and 4 overlap: 2 wins
    "nms": {"inputs": nms_inputs, "expected": [3, 2], "autocast": [0]},
    "roi_align": {"inputs": roi_align_inputs, "check": constant_map_gives_the_constant,
                  "grad": [0], "autocast": [0]},
    # argmax ties may legitimately resolve differently per device: compare the values only
    "roi_pool": {"inputs": roi_pool_inputs, "check": constant_map_gives_the_constant,
                 "grad": [0], "outputs": [0]},
    "ps_roi_align": {"inputs": ps_roi_align_inputs, "check": each_bin_reads_its_own_channel,
                     "grad": [0], "autocast": [0]},
    "ps_roi_pool": {"inputs": ps_roi_pool_inputs, "check": each_bin_reads_its_own_channel,
                    "grad": [0], "autocast": [0]},
    "deform_conv2d": {"inputs": deform_conv2d_inputs, "check": zero_offsets_give_conv2d,
                      "grad": [0, 1, 2, 3, 4]},
}
