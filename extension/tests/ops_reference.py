"""What the slow references share, and where each op's reference is found.

Each op's reference is the function `reference` of its test module, test_<op>.py, written
from the operator's definition: the one reference every backend (backends.py) is compared
with. `of(op)` finds it by the op's name (ops_table.py), so adding an op adds nothing here.

The references loop in Python over boxes, bins and sample points and use differentiable tensor
indexing, so autograd through them gives the reference gradient too. Roi geometry (bin edges,
sample positions) is computed in the precision the kernels use for it (`acc`: the float32 mode
for float32 / half / bfloat16 rois, which the emulated Metal and CUDA kernels are compared in,
double for float64), so a float32 kernel and the reference agree on which pixels a bin covers;
values are summed in the input's dtype (pass a float64 input for an exact reference).
"""

import math

import numpy as np
import torch
from ops_table import module_of


def of(op):
    """The slow reference of `op`, called with the op's schema arguments in their order."""
    return module_of(op).reference


def acc(rois):
    """The scalar type the kernels compute roi geometry in: double for float64, float
    (np.float32) for float32 / half / bfloat16. Mimicking it makes bin edges and sample
    positions land exactly where the kernels put them."""
    return np.float64 if rois.dtype == torch.float64 else np.float32


def round_half_away(value):
    return int(math.floor(value + 0.5)) if value >= 0 else -int(math.floor(-value + 0.5))


def bilinear(plane, y, x):
    """plane: [C, H, W]; sample at (y, x) with the torchvision/Detectron border rule."""
    height, width = plane.shape[-2:]
    if y < -1.0 or y > height or x < -1.0 or x > width or height == 0 or width == 0:
        return plane.new_zeros(plane.shape[0])
    y, x = max(y, 0.0), max(x, 0.0)
    y_low, x_low = int(y), int(x)
    if y_low >= height - 1:
        y_low = y_high = height - 1
        y = float(y_low)
    else:
        y_high = y_low + 1
    if x_low >= width - 1:
        x_low = x_high = width - 1
        x = float(x_low)
    else:
        x_high = x_low + 1
    ly, lx = y - y_low, x - x_low
    hy, hx = 1.0 - ly, 1.0 - lx
    return (
        hy * hx * plane[:, y_low, x_low]
        + hy * lx * plane[:, y_low, x_high]
        + ly * hx * plane[:, y_high, x_low]
        + ly * lx * plane[:, y_high, x_high]
    )
