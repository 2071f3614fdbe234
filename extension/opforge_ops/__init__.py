"""opforge_ops: detection operators in torch.ops.opforge, API-compatible with torchvision.ops."""

from ._loader import load_library as _load_library

# The compiled library must load before any fake/autograd registration below runs.
_load_library()

from ._build_info import build_info  # noqa: E402
from .ops.nms import batched_nms, nms  # noqa: E402
from .ops.ps_roi_align import PSRoIAlign, ps_roi_align  # noqa: E402
from .ops.ps_roi_pool import PSRoIPool, ps_roi_pool  # noqa: E402
from .ops.roi_align import RoIAlign, roi_align  # noqa: E402
from .ops.roi_pool import RoIPool, roi_pool  # noqa: E402

__all__ = [
    "build_info",
    "nms",
    "batched_nms",
    "roi_align",
    "RoIAlign",
    "roi_pool",
    "RoIPool",
    "ps_roi_align",
    "PSRoIAlign",
    "ps_roi_pool",
    "PSRoIPool",
]

try:
    from .ops.deform_conv2d import DeformConv2d, deform_conv2d  # noqa: E402
except ModuleNotFoundError as exc:
    # deform_conv2d lives in its own module; only its absence is tolerated, not its errors.
    if exc.name != f"{__name__}.ops.deform_conv2d":
        raise
else:
    __all__ += ["deform_conv2d", "DeformConv2d"]
