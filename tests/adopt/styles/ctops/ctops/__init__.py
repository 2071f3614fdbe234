"""Ops over a ctypes library (bitsandbytes style): torch.ops.ctops.*"""

from . import _ops  # noqa: F401  registers torch.ops.ctops
from ._ops import clamp_, saxpy

__version__ = "0.9.0"
__all__ = ["clamp_", "saxpy"]
