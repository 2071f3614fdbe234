"""opforge_ops: detection operators in torch.ops.opforge, API-compatible with torchvision.ops."""

from ._loader import load_library as _load_library

# The compiled library must load before any fake/autograd registration below runs.
_load_library()

from ._build_info import build_info  # noqa: E402
from .ops.nms import batched_nms, nms  # noqa: E402

__all__ = ["build_info", "nms", "batched_nms"]
