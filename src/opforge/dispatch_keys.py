"""The dispatch-key vocabulary, in one place: the names torch has (c10::DispatchKey, torch
2.13, for validating matrix.yaml), which of them are backends, which device each belongs to.

opforge never imports torch; the smoke probe checks each name again against the torch it runs
with (a key added after 2.13 is accepted by the matrix only once listed here). The probe cannot
import opforge: ``smoke/probe/common.py`` holds its own copy of the few names it needs, and
tests/matrix/test_dispatch_keys.py checks that the two agree.
"""

from __future__ import annotations

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
# the backend keys: what a kernel for a device registers (a backward-only op's defaults, with Meta)
BACKEND_KEYS = ("CPU", "CUDA", "MPS", "XPU", "HIP", "PrivateUse1")
# a device (torch's device type) -> its backend key, and its autocast key
DEVICE_KEY = {"cpu": "CPU", "cuda": "CUDA", "mps": "MPS", "xpu": "XPU"}
AUTOCAST_KEY = {device: f"Autocast{key}" for device, key in DEVICE_KEY.items()}
# the devices an op may declare it has no kernel for in matrix.yaml (those the smoke runs on)
NO_KERNEL_DEVICES = {d: DEVICE_KEY[d] for d in ("cpu", "cuda", "mps")}
# the keys a census always shows, expected or not (and the order `opforge init` writes keys in)
OBSERVED_KEYS = ("CPU", "CUDA", "MPS", "Meta", "Autograd", "AutocastCPU", "AutocastCUDA",
                 "AutocastMPS")
# keys of one device: in a variant that does not build that device, an op cannot have them
DEVICE_WORDS = {"cuda": "CUDA", "mps": "MPS"}


def backward_keys(keys) -> tuple[str, ...]:
    """The keys a backward-only op must have by default: ``keys``' backend keys and Meta."""
    return tuple(k for k in keys if k in BACKEND_KEYS or k == "Meta")


def device_of(key: str) -> str | None:
    """'cuda' for CUDA, AutocastCUDA, AutogradCUDA, SparseCUDA...; 'mps' likewise; else None."""
    for device, word in DEVICE_WORDS.items():
        if key.endswith(word):
            return device
    return None
