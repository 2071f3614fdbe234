"""Run an unchanged torchvision model on opforge's kernels.

    import opforge_ops.torchvision as otv

    with otv.patched():              # torchvision's ops are opforge's inside the block
        model = torchvision.models.detection.maskrcnn_resnet50_fpn(weights=None)
        out = model(images)

    otv.patch()                      # or for the rest of the process ...
    otv.unpatch()                    # ... until this restores torchvision exactly

Every binding of a replaced op in a loaded ``torchvision.*`` module is swapped: the
``torchvision.ops`` package and every submodule that imported the op by name
(``torchvision.ops.boxes.nms``, ``torchvision.ops.poolers.roi_align``,
``torchvision.models.detection.roi_heads.roi_align``, ...). Modules imported while patched
bind opforge's objects and are restored by ``unpatch()`` too. TorchScript's compilation
caches are reset on both transitions, so a model scripted afterwards calls the ops that are
bound at that time.
"""

import contextlib
import sys
import threading
from collections.abc import Iterator

import torch

import opforge_ops

# The torchvision.ops names opforge_ops can stand in for: its public functions and modules,
# each named as in torchvision.ops; a name torchvision.ops does not define is left alone.
OP_NAMES = tuple(name for name in opforge_ops.__all__ if name != "build_info")

_lock = threading.RLock()
_originals: dict[str, object] = {}  # name -> torchvision's object, while patched


def replacements() -> dict[str, tuple[object, object]]:
    """name -> (torchvision's object, opforge_ops's object) for every op both define."""
    import torchvision.ops

    pairs = {}
    for name in OP_NAMES:
        ours = getattr(opforge_ops, name, None)
        theirs = _originals.get(name, getattr(torchvision.ops, name, None))
        if ours is not None and theirs is not None:
            pairs[name] = (theirs, ours)
    return pairs


def _torchvision_modules() -> list[object]:
    return [
        module
        for name, module in list(sys.modules.items())
        if module is not None and (name == "torchvision" or name.startswith("torchvision."))
    ]


def _rebind(swap: dict[int, object]) -> int:
    """Replace, in every loaded torchvision module, each attribute whose object's id is in swap."""
    count = 0
    for module in _torchvision_modules():
        namespace = getattr(module, "__dict__", None)
        if namespace is None:
            continue
        for attr, value in list(namespace.items()):
            replacement = swap.get(id(value))
            if replacement is not None and replacement is not value:
                namespace[attr] = replacement
                count += 1
    return count


def _reset_torchscript_caches() -> None:
    # Functions and module types TorchScript compiled earlier hold the ops bound when they were
    # compiled: forget them, so the next torch.jit.script sees the current bindings. The
    # overload cache stays: torch's overloaded functions (F.interpolate) resolve through it.
    torch.jit._state._jit_caching_layer.clear()
    store = torch.jit._recursive.concrete_type_store
    store.type_store.clear()
    store.methods_compiled.clear()


def is_patched() -> bool:
    return bool(_originals)


def patch() -> dict[str, object]:
    """Route torchvision's ops to opforge_ops; returns name -> opforge object replaced.
    Patching twice is a no-op; ``unpatch()`` undoes it."""
    with _lock:
        pairs = replacements()
        if not _originals:
            _originals.update({name: theirs for name, (theirs, _) in pairs.items()})
        _rebind({id(theirs): ours for theirs, ours in pairs.values()})
        _reset_torchscript_caches()
        return {name: ours for name, (_, ours) in pairs.items()}


def unpatch() -> None:
    """Restore torchvision's own ops everywhere ``patch()`` (or an import since) bound ours."""
    with _lock:
        if not _originals:
            return
        pairs = replacements()
        _rebind({id(ours): theirs for theirs, ours in pairs.values()})
        _originals.clear()
        _reset_torchscript_caches()


@contextlib.contextmanager
def patched() -> Iterator[dict[str, object]]:
    """``with patched():`` torchvision's ops are opforge's inside the block (nesting is fine:
    only the outermost block restores)."""
    with _lock:
        outermost = not is_patched()
        replaced = patch()
    try:
        yield replaced
    finally:
        if outermost:
            unpatch()
