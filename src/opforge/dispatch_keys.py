"""Dispatch key names torch has (c10::DispatchKey, torch 2.13), for validating matrix.yaml.

opforge never imports torch; the smoke probe checks each name again against the torch it runs
with (a key added after 2.13 is accepted by the matrix only once listed here).
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
# keys of one device: in a variant that does not build that device, an op cannot have them
DEVICE_WORDS = {"cuda": "CUDA", "mps": "MPS"}


def device_of(key: str) -> str | None:
    """'cuda' for CUDA, AutocastCUDA, AutogradCUDA, SparseCUDA...; 'mps' likewise; else None."""
    for device, word in DEVICE_WORDS.items():
        if key.endswith(word):
            return device
    return None
