"""The dispatch-key vocabulary, in one place: the names torch has (c10::DispatchKey, torch
2.13, for validating matrix.yaml), which of them are backends, which device each belongs to.

opforge never imports torch; the smoke probe checks each name again against the torch it runs
with (a key added after 2.13 is accepted by the matrix only once listed here). The probe cannot
import opforge: ``smoke/probe/common.py`` holds its own copy of the few names it needs, and
tests/matrix/test_dispatch_keys.py checks that the two agree.
"""

from __future__ import annotations

import re

from opforge import platforms

DISPATCH_KEYS = frozenset((
    'CompositeExplicitAutogradNonFunctional', 'CompositeExplicitAutograd',
    'CompositeImplicitAutogradNestedTensor', 'CompositeImplicitAutograd',
    'AutogradNestedTensor', 'AutogradOther', 'Autograd', 'Conjugate', 'ZeroTensor', 'Negative',
    'BackendSelect', 'ADInplaceOrView', 'PythonTLSSnapshot', 'Python',
    'FuncTorchDynamicLayerFrontMode', 'FuncTorchDynamicLayerBackMode',
    'FuncTorchBatchedDecomposition', 'FuncTorchBatched', 'FuncTorchVmapMode',
    'FuncTorchGradWrapper', 'PythonDispatcher', 'PreDispatch', 'Functionalize', 'AutocastCPU',
    'AutocastMPS', 'AutocastXPU', 'AutocastHPU', 'AutocastIPU', 'AutocastCUDA',
    'AutocastPrivateUse1', 'Dense', 'CPU', 'CUDA', 'HIP', 'XLA', 'MPS', 'IPU', 'XPU', 'HPU',
    'VE', 'Lazy', 'MTIA', 'MAIA', 'PrivateUse1', 'PrivateUse2', 'PrivateUse3', 'Meta',
    'Quantized', 'QuantizedCPU', 'QuantizedCUDA', 'QuantizedHIP', 'QuantizedXLA',
    'QuantizedMPS', 'QuantizedIPU', 'QuantizedXPU', 'QuantizedHPU', 'QuantizedVE',
    'QuantizedLazy', 'QuantizedMTIA', 'QuantizedMAIA', 'QuantizedPrivateUse1',
    'QuantizedPrivateUse2', 'QuantizedPrivateUse3', 'QuantizedMeta', 'Sparse', 'SparseCPU',
    'SparseCUDA', 'SparseHIP', 'SparseXLA', 'SparseMPS', 'SparseIPU', 'SparseXPU', 'SparseHPU',
    'SparseVE', 'SparseLazy', 'SparseMTIA', 'SparseMAIA', 'SparsePrivateUse1',
    'SparsePrivateUse2', 'SparsePrivateUse3', 'SparseMeta', 'SparseCsr', 'SparseCsrCPU',
    'SparseCsrCUDA', 'SparseCsrHIP', 'SparseCsrXLA', 'SparseCsrMPS', 'SparseCsrIPU',
    'SparseCsrXPU', 'SparseCsrHPU', 'SparseCsrVE', 'SparseCsrLazy', 'SparseCsrMTIA',
    'SparseCsrMAIA', 'SparseCsrPrivateUse1', 'SparseCsrPrivateUse2', 'SparseCsrPrivateUse3',
    'SparseCsrMeta', 'NestedTensor', 'NestedTensorCPU', 'NestedTensorCUDA', 'NestedTensorHIP',
    'NestedTensorXLA', 'NestedTensorMPS', 'NestedTensorIPU', 'NestedTensorXPU',
    'NestedTensorHPU', 'NestedTensorVE', 'NestedTensorLazy', 'NestedTensorMTIA',
    'NestedTensorMAIA', 'NestedTensorPrivateUse1', 'NestedTensorPrivateUse2',
    'NestedTensorPrivateUse3', 'NestedTensorMeta', 'AutogradFunctionality', 'AutogradCPU',
    'AutogradCUDA', 'AutogradHIP', 'AutogradXLA', 'AutogradMPS', 'AutogradIPU', 'AutogradXPU',
    'AutogradHPU', 'AutogradVE', 'AutogradLazy', 'AutogradMTIA', 'AutogradMAIA',
    'AutogradPrivateUse1', 'AutogradPrivateUse2', 'AutogradPrivateUse3', 'AutogradMeta'
))
# c10::DispatchKey names torch.library takes (torch._C._parse_dispatch_key) that
# torch._C.DispatchKey does not list, so the smoke census cannot ask about them
C10_ONLY_KEYS = frozenset((
    'FPGA', 'Vulkan', 'Metal', 'MkldnnCPU', 'CustomRNGKeyId', 'Fake', 'Tracer', 'AutocastXLA',
    'AutocastMTIA', 'AutocastMAIA', 'Batched', 'BatchedNestedTensor', 'VmapMode',
    'DeferredInit'))
# the backend keys: what a kernel for a device registers (a backward-only op's defaults, with Meta)
BACKEND_KEYS = ("CPU", "CUDA", "MPS", "XPU", "HIP", "PrivateUse1")
# every torch device type -> the dispatch key its kernels register under, as torch maps them
# (torch._C._dispatch_key_for_device, torch 2.13; tests/matrix/test_dispatch_keys.py asks it).
# FPGA and Vulkan are c10 keys that torch's Python API (torch._C.DispatchKey) does not list.
DEVICE_TYPE_KEY = {
    "cpu": "CPU", "cuda": "CUDA", "hip": "HIP", "xla": "XLA", "mps": "MPS", "ipu": "IPU",
    "xpu": "XPU", "hpu": "HPU", "ve": "VE", "lazy": "Lazy", "mtia": "MTIA", "maia": "MAIA",
    "meta": "Meta", "privateuseone": "PrivateUse1", "fpga": "FPGA", "vulkan": "Vulkan",
}
# caffe2's device types: torch still parses them, but they have no dispatch key (it asserts)
RETIRED_DEVICE_TYPES = ("mkldnn", "opengl", "opencl", "ideep")
# the devices opforge's backends run on -> its backend key, and its autocast key
DEVICE_KEY = {d: DEVICE_TYPE_KEY[d] for d in ("cpu", "cuda", "mps", "xpu")}
AUTOCAST_KEY = {device: f"Autocast{key}" for device, key in DEVICE_KEY.items()}
# the devices an op may declare it has no kernel for in matrix.yaml (those the smoke runs on)
NO_KERNEL_DEVICES = {d: DEVICE_KEY[d] for d in ("cpu", "cuda", "mps", "xpu")}
# the keys a census always shows, expected or not (and the order `opforge init` writes keys in)
OBSERVED_KEYS = ("CPU", "CUDA", "MPS", "Meta", "Autograd", "AutocastCPU", "AutocastCUDA",
                 "AutocastMPS")


def device_words() -> dict[str, tuple[str, ...]]:
    """Keys of one device: each platform backend's ``dispatch_words`` by its device (cuda:
    CUDA, HIP; mps: MPS; xpu: XPU), read from the registry (a backend registered later
    counts). In a variant that does not build that device, an op cannot have them."""
    words: dict[str, tuple[str, ...]] = {}
    for backend in platforms.backends():
        if backend.device and backend.dispatch_words:
            known = words.get(backend.device, ())
            words[backend.device] = known + tuple(w for w in backend.dispatch_words
                                                  if w not in known)
    return words


def backward_keys(keys) -> tuple[str, ...]:
    """The keys a backward-only op must have by default: ``keys``' backend keys and Meta."""
    return tuple(k for k in keys if k in BACKEND_KEYS or k == "Meta")


def device_of(key: str) -> str | None:
    """'cuda' for CUDA, AutocastCUDA, AutogradCUDA, SparseCUDA, HIP...; 'mps', 'xpu' likewise
    (``device_words``); else None."""
    for device, words in device_words().items():
        if any(key.endswith(word) for word in words):
            return device
    return None


# a name torch.utils.rename_privateuse1_backend can give the PrivateUse1 backend ("npu")
_RENAMED_BACKEND = re.compile(r"[a-z_]+\Z")
# the device type whose tensors reach each backend key (PrivateUse2/3 have none: their own)
_DEVICE_TYPE_OF_KEY = {**{k: d for d, k in DEVICE_TYPE_KEY.items() if k != "Meta"},
                       "PrivateUse2": "privateuse2", "PrivateUse3": "privateuse3"}
_PER_BACKEND = ("", "Autocast", "Autograd", "Sparse", "SparseCsr", "Quantized", "NestedTensor")


def kernel_key(name: str) -> tuple[str | None, str]:
    """Where torch.library puts a kernel registered for ``name`` (``impl(op, name)``,
    ``register_kernel(op, name)``, ``custom_op(device_types=name)``, ``lib.impl(op, fn,
    name)``), read the way torch reads it, and how it was read:

    a dispatch key name is itself (``"CPU"`` -> ``("CPU", "key")``); a device type is its key
    (``"hpu"`` -> ``("HPU", "device")``); ``"default"`` is CompositeExplicitAutograd; any
    other device-like name is the PrivateUse1 backend renamed to it (``"npu"`` ->
    ``("PrivateUse1", "renamed")``; ``"AutogradNPU"`` -> ``("AutogradPrivateUse1", "renamed
    key")``, its key spelled with the name in capitals: torch accepts
    them once ``torch.utils.rename_privateuse1_backend("npu")`` ran, as a device's own package
    does on import).
    ``(None, why)`` for a name torch refuses.
    """
    if name in DISPATCH_KEYS or name in C10_ONLY_KEYS:
        return name, "key"
    if name in DEVICE_TYPE_KEY:
        return DEVICE_TYPE_KEY[name], "device"
    if name == "default":
        return "CompositeExplicitAutograd", "default"
    if name in RETIRED_DEVICE_TYPES:
        return None, f"{name!r} is a retired caffe2 device type with no dispatch key"
    bare = name.split(":", 1)[0].strip()
    near = next((d for d in DEVICE_TYPE_KEY if d == bare.lower()), None) or \
        next((k for k in DISPATCH_KEYS if k.lower() == bare.lower()), None)
    if near is not None:
        return None, f"{name!r} is neither a dispatch key nor a device type (did you mean {near!r}?)"
    if _RENAMED_BACKEND.match(name):
        return "PrivateUse1", "renamed"
    # a renamed backend's keys are spelled with its name in capitals too: NPU, AutogradNPU
    for prefix in _PER_BACKEND:
        rest = name[len(prefix):]
        if name.startswith(prefix) and rest == rest.upper() and \
                _RENAMED_BACKEND.match(rest.lower()) and \
                rest.lower() not in (*DEVICE_TYPE_KEY, *RETIRED_DEVICE_TYPES):
            return f"{prefix}PrivateUse1", "renamed key"
    return None, f"{name!r} is neither a dispatch key nor a device type"


def renamed_backend(name: str) -> str:
    """The device type a renamed PrivateUse1 backend's name stands for: 'npu' for npu, NPU
    and AutogradNPU (``kernel_key`` read them as "renamed", "renamed key")."""
    for prefix in sorted(_PER_BACKEND, key=len, reverse=True):
        if prefix and name.startswith(prefix) and name[len(prefix):].isupper():
            return name[len(prefix):].lower()
    return name.lower()


def device_type_of(key: str) -> str | None:
    """The device type whose tensors reach ``key``: 'hpu' for HPU, AutocastHPU, AutogradHPU,
    SparseHPU...; 'privateuseone' for PrivateUse1's; None for a key of every device (Meta,
    Autograd, a composite alias). Unlike ``device_of``, every backend counts: a variant that
    builds none of a key's device has nothing to check it on."""
    for prefix in _PER_BACKEND:
        if key.startswith(prefix) and key[len(prefix):] in _DEVICE_TYPE_OF_KEY:
            return _DEVICE_TYPE_OF_KEY[key[len(prefix):]]
    return None
