"""Box ops over pybind11 modules, mmcv style: the CUDA module is optional at import time."""

from . import _ext_cpu  # noqa: F401  ops.py reaches it as pybops._ext_cpu

try:  # a CPU-only install has no CUDA module; the GPU path then fails when called
    from . import _ext_cuda
except ImportError:
    _ext_cuda = None

from .ops import count_above, pairwise_iou

__version__ = "0.4.1"
__all__ = ["count_above", "pairwise_iou"]
