"""Helpers every public op shares, written so that TorchScript compiles them and torch.fx
never runs them on a Proxy.

The wrapper pattern for a public function (see roi_align.py):

    @torch.fx.wrap                      # a leaf when traced through this module's binding
    def op(input: Tensor, ...) -> Tensor:
        if not torch.jit.is_scripting():  # TorchScript skips this branch entirely
            leaf = fx_leaf_call(op, (input, ...))
            if leaf is not None:          # a leaf through any other binding too
                return leaf
        ...argument checks in torchvision's order, with torchvision's exception types...
        return torch.ops.opforge.op(...)

Exception types follow torchvision.ops: box-shape problems it asserts on raise
AssertionError, shape slips its Python would hit raise the IndexError / ValueError /
ZeroDivisionError it would hit (with a message that names the argument), and everything the
kernels check raises RuntimeError.
"""

from typing import Any

import torch
import torch.fx
from torch import Tensor

# The types most arguments have: passed over without an isinstance check, since the search
# runs on every eager call (a tensor subclass, e.g. a Parameter, takes the slower checks).
_PLAIN_TYPES = (Tensor, int, float, bool)


def _find_proxy(value: Any) -> torch.fx.Proxy | None:
    if type(value) in _PLAIN_TYPES:
        return None
    if isinstance(value, torch.fx.Proxy):
        return value
    if isinstance(value, (list, tuple)):
        for item in value:
            found = _find_proxy(item)
            if found is not None:
                return found
    return None


def fx_leaf_call(fn: Any, args: tuple[Any, ...]) -> torch.fx.Proxy | None:
    """Under torch.fx symbolic tracing, record ``fn(*args)`` as one call_function node.

    torch.fx.wrap only patches the binding in the defining module; a model that calls the
    function through another name (``opforge_ops.roi_align``, ``from opforge_ops import
    nms``) would otherwise run its checks on Proxies. Returns None outside tracing.
    """
    proxy = _find_proxy(args)
    if proxy is None:
        return None
    # While tracing, the module global may be torch.fx's patch wrapper: record the function.
    fn = getattr(fn, "__wrapped__", fn)
    return proxy.tracer.create_proxy("call_function", fn, args, {})


def _check_box_tensor(boxes: Tensor, columns: int, name: str, form: str) -> None:
    # torchvision reads boxes.size(1): fewer than 2 dimensions is its IndexError
    if boxes.dim() < 2:
        raise IndexError(f"{name} must be a {form}, got shape {boxes.shape}")
    if boxes.size(1) != columns:
        raise AssertionError(f"{name} must be a {form}, got shape {boxes.shape}")


def check_roi_boxes_shape(boxes: Tensor | list[Tensor]) -> None:
    """Tensor[K, 5] or a list/tuple of Tensor[L, 4], checked as torchvision does: a box
    tensor with fewer than 2 dimensions is an IndexError, a wrong last size an
    AssertionError; more dimensions are left to the kernel (RuntimeError)."""
    if isinstance(boxes, (list, tuple)):
        for i, b in enumerate(boxes):
            _check_box_tensor(b, 4, f"boxes[{i}]", "Tensor[L, 4] (x1, y1, x2, y2)")
    elif isinstance(boxes, torch.Tensor):
        _check_box_tensor(boxes, 5, "boxes", "Tensor[K, 5] (batch index, x1, y1, x2, y2)")
    else:
        raise AssertionError("boxes must be a Tensor[K, 5] or a list of Tensor[L, 4]")


# The library's one-call conversion of list boxes (csrc/ops/boxes_to_rois.cpp): a composite
# kernel in the legacy build, a CPU kernel (with the fake kernel below) in the stable one. A
# library without it (built before it existed) converts below, as TorchScript does.
_BOXES_TO_ROIS = (torch.ops.opforge._boxes_to_rois.default
                  if hasattr(torch.ops.opforge, "_boxes_to_rois") else None)
if _BOXES_TO_ROIS is not None and not torch._C._dispatch_has_kernel_for_dispatch_key(
        "opforge::_boxes_to_rois", "CompositeImplicitAutograd"):
    @torch.library.register_fake("opforge::_boxes_to_rois")
    def _boxes_to_rois_fake(boxes):
        return torch.cat([b.new_empty((b.size(0), 5)) for b in boxes])


def convert_boxes_to_roi_format(boxes: list[Tensor]) -> Tensor:
    """[Tensor[L_i, 4]] -> Tensor[K, 5] whose first column is the image index i."""
    if len(boxes) == 0:
        raise ValueError(
            "boxes is an empty list: pass one Tensor[L, 4] per image (L may be 0), "
            "or a Tensor[0, 5] for no boxes"
        )
    if not torch.jit.is_scripting():
        # eager only: a traced, exported or compiled graph keeps the ATen ops below, so it
        # loads beside a library without _boxes_to_rois. Plain CPU tensors that need no graph:
        # the stable build's kernel is a CPU one, below autograd.
        if _BOXES_TO_ROIS is not None and not torch.jit.is_tracing() \
                and not torch.compiler.is_compiling():
            grad = torch.is_grad_enabled()
            plain = True
            for b in boxes:
                if type(b) is not Tensor or b.dim() != 2 or b.is_quantized \
                        or b.device.type != "cpu" or (grad and b.requires_grad):
                    plain = False
                    break
            if plain:
                return _BOXES_TO_ROIS(boxes)
    if len(boxes) == 1 and not boxes[0].is_quantized:  # (zero_ has no QuantizedCPU kernel)
        return torch.cat([torch.zeros_like(boxes[0][:, :1]), boxes[0]], dim=1)
    # Fast path (a constant number of ATen calls, not two per image): plain 2-D boxes. The
    # index column takes the promoted dtype of the concatenated boxes, as a per-image
    # torch.full_like column would after torch.cat.
    # Row r belongs to the image whose first row is the last start <= r (bucketize, which
    # unlike repeat_interleave does not go multi-threaded on a few rows).
    plain = True
    ends: list[int] = []
    total = 0
    for b in boxes:
        if b.dim() != 2 or b.is_quantized:
            plain = False
        total += b.size(0)
        ends.append(total)
    if plain and len(boxes) <= 3:
        # a few images: each one's boxes padded with its index column, then one torch.cat
        # (per image one op; below four images fewer than the general path's four). aten's
        # constant_pad_nd, not F.pad, whose Python dispatch costs as much as the op.
        return torch.cat([torch.constant_pad_nd(b, [1, 0], float(i)) for i, b in enumerate(boxes)],
                         dim=0)
    if plain:
        stacked = torch.cat(boxes, dim=0)
        if total <= 256:
            # a few rows (a detector's proposals for a small batch): the column made from a
            # Python list is one tensor creation, a few microseconds under bucketize's four ops
            index: list[float] = []
            for i in range(len(boxes)):
                index.extend([float(i)] * boxes[i].size(0))
            ids = torch.tensor(index, dtype=stacked.dtype, device=stacked.device)
        else:
            rows = torch.arange(total)
            ids = torch.bucketize(rows, torch.tensor(ends[:-1]), right=True)
            ids = ids.to(dtype=stacked.dtype, device=stacked.device)
        return torch.cat([ids.unsqueeze(1), stacked], dim=1)
    # Other ranks or quantized boxes: the column per image, so that the kernel (or torch.cat)
    # reports the problem exactly as before.
    columns: list[Tensor] = []
    for i, b in enumerate(boxes):
        columns.append(torch.full_like(b[:, :1], i))
    if len(boxes) == 1:
        return torch.cat([columns[0], boxes[0]], dim=1)
    return torch.cat([torch.cat(columns, dim=0), torch.cat(boxes, dim=0)], dim=1)


def rois_from_boxes(boxes: Tensor | list[Tensor]) -> Tensor:
    """Checked Tensor[K, 5] rois from either box form."""
    check_roi_boxes_shape(boxes)
    if isinstance(boxes, torch.Tensor):
        return boxes
    return convert_boxes_to_roi_format(boxes)


def check_quantized_rois(input: Tensor, rois: Tensor) -> None:
    """A quantized input needs quantized rois (ValueError, as torchvision)."""
    if input.is_quantized and not rois.is_quantized:
        raise ValueError("roi ops: input is quantized, so rois (boxes) must be quantized too")
