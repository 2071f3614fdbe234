"""opforge_ops against torchvision.ops on every case of tv_cases (each op's cases live in its
test_<op>.py): same values, same gradients, and where torchvision rejects an input, the same
exception type."""

import pytest
import torch
from tv_cases import all_cases
from tv_support import require_torchvision

import opforge_ops

tv = require_torchvision()

CASES = all_cases()
# A stable-ABI build has no QuantizedCPU kernels: opforge_ops computes a quantized roi_align
# from the float kernel on dequantized values, requantized once, where torchvision sums the
# integers; the two round differently and may differ by one quantum (ops/roi_align.py).
QUANTUM_SLACK = 1 if opforge_ops.build_info().get("abi") == "stable" else 0
# case id -> why opforge raises where torchvision accepts the input (extension/README.md)
DIFFERENCES = {case.id: case.difference for case in CASES if case.difference}
# case id -> opforge's answer ("zeros" or an exception type) where torchvision's kernels crash
TORCHVISION_CRASHES = {case.id: case.torchvision_crash for case in CASES if case.torchvision_crash}
TOLERANCE = {
    torch.float16: dict(rtol=1e-2, atol=2e-3),
    torch.bfloat16: dict(rtol=2e-2, atol=1e-2),
    torch.float32: dict(rtol=1e-4, atol=1e-5),
    torch.float64: dict(rtol=1e-9, atol=1e-11),
}


def _leaves(value):
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _leaves(item)]
    return []


def run(case, namespace):
    """(result or None, exception or None, tensors whose gradient is compared)."""
    torch.manual_seed(0)
    inputs = case.make()
    wanted = []
    if case.grad:
        wanted = [t for t in _leaves(inputs) if t.is_floating_point()]
        for t in wanted:
            t.requires_grad_(True)
    try:
        return case.call(namespace, inputs), None, wanted
    except Exception as exc:  # the exception is what is compared
        return None, exc, wanted


def assert_same_value(ours, theirs):
    if isinstance(theirs, torch.Tensor) and theirs.is_quantized:
        assert ours.is_quantized and ours.dtype == theirs.dtype and ours.shape == theirs.shape
        assert (ours.q_scale(), ours.q_zero_point()) == (theirs.q_scale(), theirs.q_zero_point())
        diff = (ours.int_repr().long() - theirs.int_repr().long()).abs()
        assert diff.numel() == 0 or diff.max() <= QUANTUM_SLACK, (ours.int_repr(), theirs.int_repr())
    elif isinstance(theirs, torch.Tensor):
        assert isinstance(ours, torch.Tensor)
        assert ours.shape == theirs.shape and ours.dtype == theirs.dtype, (ours.shape, theirs.shape)
        if theirs.dtype in (torch.float16, torch.bfloat16) and theirs.numel():
            # the kernels round at different points: agree within 2 ulps of the largest value
            scale = theirs.detach().abs().max().float().item()
            atol = 2 * torch.finfo(theirs.dtype).eps * max(scale, 1.0)
            torch.testing.assert_close(ours.detach(), theirs.detach(), rtol=0, atol=atol)
        elif theirs.dtype.is_floating_point:
            # NaN where torchvision gives NaN (ps_roi_align averages an empty grid to 0 / 0)
            torch.testing.assert_close(ours.detach(), theirs.detach(), equal_nan=True, **TOLERANCE[theirs.dtype])
        else:
            assert torch.equal(ours, theirs), (ours, theirs)
    elif isinstance(theirs, torch.nn.Module):
        assert type(ours).__name__ == type(theirs).__name__ and repr(ours) == repr(theirs)
    else:
        assert ours == theirs


def assert_same_gradients(case, ours, ours_inputs, theirs, theirs_inputs):
    torch.manual_seed(1)
    grad_output = torch.randn_like(theirs)
    ours_grads = torch.autograd.grad(ours, ours_inputs, grad_output, allow_unused=True)
    theirs_grads = torch.autograd.grad(theirs, theirs_inputs, grad_output, allow_unused=True)
    for i, (o, t) in enumerate(zip(ours_grads, theirs_grads)):
        assert (o is None) == (t is None), f"input {i}: gradient only on one side"
        if t is not None:
            torch.testing.assert_close(o, t, **TOLERANCE[t.dtype], msg=lambda m, i=i: f"grad of input {i}: {m}")


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_matches_torchvision(case):
    ours, ours_error, ours_inputs = run(case, opforge_ops)
    if case.id in TORCHVISION_CRASHES:
        expected = TORCHVISION_CRASHES[case.id]
        if expected == "zeros":
            assert ours_error is None and not ours.any(), ours_error
        else:
            assert type(ours_error).__name__ == expected, ours_error
        return
    theirs, theirs_error, theirs_inputs = run(case, tv.ops)
    if case.id in DIFFERENCES:
        assert theirs_error is None, f"torchvision now rejects it too ({theirs_error!r}): drop the entry"
        assert isinstance(ours_error, RuntimeError), f"expected a RuntimeError, got {ours_error!r}"
        return
    if theirs_error is not None:
        unsupported = isinstance(theirs_error, RuntimeError) and "not implemented for" in str(theirs_error)
        if unsupported and ours_error is None:
            return  # a dtype torchvision's CPU kernels lack and opforge's have (float16 nms, ...)
        assert ours_error is not None, f"torchvision raised {theirs_error!r}; opforge returned"
        assert isinstance(ours_error, type(theirs_error)), (
            f"torchvision raised {type(theirs_error).__name__}: {theirs_error}\n"
            f"opforge raised {type(ours_error).__name__}: {ours_error}"
        )
        return
    assert ours_error is None, f"torchvision returned; opforge raised {ours_error!r}"
    assert_same_value(ours, theirs)
    if case.grad:
        assert_same_gradients(case, ours, ours_inputs, theirs, theirs_inputs)


def test_every_public_op_has_cases():
    ops = {case.op for case in CASES}
    public = {name for name in opforge_ops.__all__ if name[0].islower() and name != "build_info"}
    assert public <= ops, f"ops without differential cases: {sorted(public - ops)}"


def test_documented_exceptions_name_existing_cases():
    ids = [case.id for case in CASES]
    assert len(set(ids)) == len(ids), "two cases share an id"
    assert set(DIFFERENCES) <= set(ids) and set(TORCHVISION_CRASHES) <= set(ids)
    assert all(expected == "zeros" or expected.endswith("Error") for expected in TORCHVISION_CRASHES.values())
