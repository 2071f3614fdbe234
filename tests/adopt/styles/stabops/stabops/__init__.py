"""axpby and row_sum on the LibTorch stable ABI."""

import torch

from . import _C  # noqa: F401  loads torch.ops.stabops

__version__ = "2.0.0"


@torch.library.register_fake("stabops::axpby")
def _(x, y, a, b):
    return torch.empty_like(x)


@torch.library.register_fake("stabops::row_sum")
def _(x):
    return x.new_empty(x.shape[0])


def axpby(x, y, a=1.0, b=1.0):
    return torch.ops.stabops.axpby(x, y, a, b)


def row_sum(x):
    return torch.ops.stabops.row_sum(x)
