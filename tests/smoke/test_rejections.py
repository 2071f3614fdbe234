"""The probe's classifier of an op's error (smoke/probe/rejections.py), over the texts real
packages and torch print: the op refusing made-up inputs, against registration faults."""

from __future__ import annotations

import pytest

from opforge.smoke.probe.rejections import (
    DEVICE_FAULT,
    NO_KERNEL,
    REGISTRATION,
    REJECTED,
    UNKNOWN,
    classify,
    op_message,
)

# the op's own argument checks (torch-scatter / torch-sparse / torch-cluster 2.x on torch 2.13)
REFUSALS = [
    RuntimeError('idx <= next_idx INTERNAL ASSERT FAILED at "csrc/cpu/segment_coo_cpu.cpp":'
                 "70, please report a bug to PyTorch. "),
    RuntimeError("expected scalar type Long but found Float"),
    RuntimeError("The size of tensor a (7) must match the size of tensor b (8) at "
                 "non-singleton dimension 0"),
    IndexError("Dimension out of range (expected to be in range of [-1, 0], but got 1)"),
    RuntimeError("Expected rowptr.dim() == 1 to be true, but got false.  (Could this error "
                 "message be improved?  If so, please report an enhancement request to "
                 "PyTorch.)"),
    RuntimeError('src.dim() >= index.dim() INTERNAL ASSERT FAILED at "/tmp/pip-build/csrc/cpu/'
                 'segment_coo_cpu.cpp":17, please report a bug to PyTorch. Input mismatch'),
    RuntimeError('"segment_coo" not implemented for \'Bool\''),
    # AT_DISPATCH raises NotImplementedError for a dtype it has no case for: still the inputs
    NotImplementedError('"histogram_cpu" not implemented for \'Long\''),
    # a Python kernel's own argument check
    AssertionError("index must be 1-D"),
    ValueError("index must be non-negative"),
    TypeError("stubbed::gather() Expected a value of type 'Tensor' for argument 'index' but "
              "instead found type 'int'."),
    RuntimeError("gather(): Expected dtype int32/int64 for index"),
]

# what the dispatcher, the loader and torch's core say: never the stub's inputs
FAULTS = [
    NotImplementedError("Could not run 'torch_scatter::gather_coo' with arguments from the "
                        "'CPU' backend. This could be because the operator doesn't exist for "
                        "this backend"),
    RuntimeError("Could not run 'ns::op' with arguments from the 'Meta' backend."),
    RuntimeError("operator torch_scatter::gather_co does not exist"),
    RuntimeError("No such operator torch_scatter::gather_co"),
    AttributeError("'_OpNamespace' 'torch_scatter' object has no attribute 'gather_co'"),
    ModuleNotFoundError("No module named 'torch_scatter._scatter_cpu'"),
    OSError("libtorch_scatter.so: cannot open shared object file: No such file or directory"),
    RuntimeError("ns::op: attempted to run this operator with Meta tensors, but there was no "
                 "fake impl or Meta kernel registered."),
    RuntimeError('!schema_.has_value() INTERNAL ASSERT FAILED at "/pytorch/aten/src/ATen/core/'
                 'dispatch/OperatorEntry.cpp":84, please report a bug to PyTorch.'),
    RuntimeError("Cannot access data pointer of Tensor (e.g. FakeTensor, FunctionalTensor). "
                 "If you're using torch.compile/export/fx, it is likely that we are erroneously "
                 "tracing into a custom kernel."),
]


@pytest.mark.parametrize("exc", REFUSALS, ids=lambda e: str(e)[:40])
def test_the_ops_own_checks_are_refusals(exc):
    assert classify(exc) == (REJECTED, None)


@pytest.mark.parametrize("exc", FAULTS, ids=lambda e: str(e)[:40])
def test_registration_faults_are_never_refusals(exc):
    assert classify(exc)[0] == REGISTRATION


@pytest.mark.parametrize("text,device", [
    ("No CPU version supported", "cpu"),
    ("CPU version is not available for Chamfer Distance", "cpu"),
    ("knn: not implemented for CPU", "cpu"),
    ("This op only supports CUDA tensors", "cuda"),
])
def test_an_op_saying_it_has_no_kernel_for_a_device_names_the_device(text, device):
    assert classify(RuntimeError(text)) == (NO_KERNEL, device)


@pytest.mark.parametrize("text", [
    "Not compiled with CUDA support",
    "dbscan_torch was built without CUDA support.",
    "not built with MPS",
])
def test_a_build_without_the_devices_kernels_is_a_fault_not_a_design(text):
    assert classify(RuntimeError(text))[0] == REGISTRATION


def test_device_faults_and_other_exceptions_are_not_refusals():
    assert classify(RuntimeError("CUDA error: an illegal memory access was encountered"))[0] \
        == DEVICE_FAULT
    assert classify(KeyError("index"))[0] == UNKNOWN
    assert classify(ZeroDivisionError("division by zero"))[0] == UNKNOWN


def test_dynamo_wrapper_is_judged_by_its_cause_and_graph_breaks_are_faults():
    class TorchRuntimeError(RuntimeError):
        pass

    class Unsupported(RuntimeError):  # torch._dynamo.exc.Unsupported: a graph break
        pass

    wrapped = TorchRuntimeError("Dynamo failed to run FX node with fake tensors")
    wrapped.__cause__ = RuntimeError("expected scalar type Long but found Float")
    assert classify(wrapped)[0] == REJECTED
    assert classify(Unsupported("call_function ... not supported"))[0] == REGISTRATION


def test_the_ops_message_drops_torchs_boilerplate():
    said = op_message(REFUSALS[0])
    assert said == 'idx <= next_idx INTERNAL ASSERT FAILED at "csrc/cpu/segment_coo_cpu.cpp":70'
    assert op_message(RuntimeError("x" * 500)).endswith("...")
