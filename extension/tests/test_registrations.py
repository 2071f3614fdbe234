"""Dispatcher registrations, opcheck, fake tensors, torch.compile and torch.export."""

from pathlib import Path

import pytest
import torch
from ops_table import BACKWARD_OPS, FORWARD_OPS
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.library import opcheck

import opforge_ops
from ops_inputs import random_boxes, random_rois

FORWARD_KEYS = ("CPU", "Meta", "Autograd", "AutocastCPU")
BACKWARD_KEYS = ("CPU", "Meta")


def test_the_built_ops_are_the_ones_matrix_yaml_promises():
    """matrix.yaml (extension.ops / internal_ops) is the one list of ops a wheel must define;
    the build defines exactly those, so a new op is declared once and checked everywhere."""
    matrix = Path(__file__).resolve().parents[2] / "matrix.yaml"
    if not matrix.is_file():
        pytest.skip(f"no matrix.yaml at {matrix} (the extension was copied out of its repository)")
    yaml = pytest.importorskip("yaml", reason="reading matrix.yaml needs PyYAML")
    extension = yaml.safe_load(matrix.read_text())["extension"]

    def names(entries):
        return {entry if isinstance(entry, str) else next(iter(entry)) for entry in entries}

    forward = names(extension["ops"])
    backward = names(extension.get("internal_ops", []))
    backward |= {op for entry in extension["ops"] if isinstance(entry, dict)
                 for op, fields in entry.items() if (fields or {}).get("backward")}
    forward -= backward
    assert set(FORWARD_OPS) == forward
    assert set(BACKWARD_OPS) == backward
    assert {"nms", "roi_align", "roi_pool", "deform_conv2d"} <= forward  # the file is the real one


@pytest.mark.parametrize("op", FORWARD_OPS)
@pytest.mark.parametrize("key", FORWARD_KEYS)
def test_forward_op_registers_key(op, key):
    assert torch._C._dispatch_has_kernel_for_dispatch_key(f"opforge::{op}", key)


@pytest.mark.parametrize("op", BACKWARD_OPS)
@pytest.mark.parametrize("key", BACKWARD_KEYS)
def test_backward_op_registers_key(op, key):
    assert torch._C._dispatch_has_kernel_for_dispatch_key(f"opforge::{op}", key)


def test_schemas_match_torchvision():
    expected = {
        "nms": "opforge::nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
        "roi_align": "opforge::roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
        "SymInt pooled_width, int sampling_ratio, bool aligned) -> Tensor",
        "_roi_align_backward": "opforge::_roi_align_backward(Tensor grad, Tensor rois, float spatial_scale, "
        "SymInt pooled_height, SymInt pooled_width, SymInt batch_size, SymInt channels, SymInt height, "
        "SymInt width, int sampling_ratio, bool aligned) -> Tensor",
        "roi_pool": "opforge::roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
        "SymInt pooled_width) -> (Tensor, Tensor)",
        "_roi_pool_backward": "opforge::_roi_pool_backward(Tensor grad, Tensor rois, Tensor argmax, "
        "float spatial_scale, SymInt pooled_height, SymInt pooled_width, SymInt batch_size, SymInt channels, "
        "SymInt height, SymInt width) -> Tensor",
    }
    for name, schema in expected.items():
        assert str(getattr(torch.ops.opforge, name).default._schema) == schema


def _roi_align_samples():
    for aligned in (False, True):
        for sampling_ratio in (-1, 2):
            input = torch.randn(2, 3, 9, 8, dtype=torch.float64, requires_grad=True)
            yield (
                input,
                random_rois(5, 2, 9, 8, torch.float64),
                0.5,
                3,
                2,
                sampling_ratio,
                aligned,
            )


def _roi_pool_samples():
    input = torch.randn(2, 3, 9, 8, dtype=torch.float64, requires_grad=True)
    yield (input, random_rois(5, 2, 9, 8, torch.float64), 1.0, 3, 2)
    yield (torch.randn(1, 2, 6, 6, requires_grad=True), random_rois(3, 1, 6, 6), 0.5, 2, 2)


def _nms_samples():
    yield (random_boxes(40), torch.rand(40), 0.5)
    yield (random_boxes(0), torch.rand(0), 0.5)
    yield (random_boxes(10, torch.float64), torch.rand(10, dtype=torch.float64), 0.2)


def _roi_align_backward_samples():
    rois = random_rois(4, 2, 7, 6, torch.float64)
    yield (torch.randn(4, 3, 2, 2, dtype=torch.float64), rois, 1.0, 2, 2, 2, 3, 7, 6, -1, True)


def _roi_pool_backward_samples():
    input = torch.randn(2, 3, 7, 6)
    rois = random_rois(4, 2, 7, 6)
    _, argmax = torch.ops.opforge.roi_pool(input, rois, 1.0, 2, 2)
    yield (torch.randn(4, 3, 2, 2), rois, argmax, 1.0, 2, 2, 2, 3, 7, 6)


SAMPLES = {
    "nms": _nms_samples,
    "roi_align": _roi_align_samples,
    "roi_pool": _roi_pool_samples,
    "_roi_align_backward": _roi_align_backward_samples,
    "_roi_pool_backward": _roi_pool_backward_samples,
}


@pytest.mark.parametrize("op", list(SAMPLES))
def test_opcheck(op):
    for args in SAMPLES[op]():
        opcheck(
            getattr(torch.ops.opforge, op).default,
            args,
            test_utils=(
                "test_schema",
                "test_autograd_registration",
                "test_faketensor",
                "test_aot_dispatch_dynamic",
            ),
        )


def test_fake_tensors_propagate_shapes_without_running_kernels():
    with FakeTensorMode():
        input = torch.empty(2, 3, 10, 10)
        rois = torch.empty(7, 5)
        assert opforge_ops.roi_align(input, rois, (4, 3)).shape == (7, 3, 4, 3)
        output, argmax = torch.ops.opforge.roi_pool(input, rois, 1.0, 2, 5)
        assert output.shape == (7, 3, 2, 5) and argmax.dtype == torch.int32


def test_fake_kernel_rejects_bad_input_like_the_cpu_kernel():
    with FakeTensorMode():
        with pytest.raises(RuntimeError, match=r"rois \(boxes\) must have shape \[K, 5\]"):
            torch.ops.opforge.roi_align(
                torch.empty(1, 3, 4, 4), torch.empty(2, 4), 1.0, 2, 2, -1, False
            )


def test_meta_tensors_give_output_shapes():
    input = torch.empty(2, 3, 10, 10, device="meta")
    rois = torch.empty(7, 5, device="meta")
    assert torch.ops.opforge.roi_align(input, rois, 1.0, 4, 3, -1, False).shape == (7, 3, 4, 3)
    grad = torch.ops.opforge._roi_align_backward(
        torch.empty(7, 3, 4, 3, device="meta"), rois, 1.0, 4, 3, 2, 3, 10, 10, -1, False
    )
    assert grad.shape == (2, 3, 10, 10)


def _assert_compiles(fn, *args, backend="aot_eager", dynamic=None):
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend=backend, dynamic=dynamic)
    expected = fn(*args)
    got = compiled(*args)
    torch.testing.assert_close(got, expected)
    return compiled


def test_nms_compiles_with_fullgraph():
    boxes, scores = random_boxes(50), torch.rand(50)
    _assert_compiles(lambda b, s: opforge_ops.nms(b, s, 0.5), boxes, scores)


def test_batched_nms_compiles_with_fullgraph():
    boxes, scores, idxs = random_boxes(50), torch.rand(50), torch.randint(0, 3, (50,))
    _assert_compiles(lambda b, s, i: opforge_ops.batched_nms(b, s, i, 0.5), boxes, scores, idxs)


@pytest.mark.parametrize("dynamic", [False, True])
def test_roi_align_forward_and_backward_compile_with_fullgraph(dynamic):
    def loss(x, rois):
        out = opforge_ops.roi_align(x, rois, (3, 3), 0.5, 2, True)
        return torch.autograd.grad(out.pow(2).sum(), x)[0]

    input = torch.randn(2, 3, 12, 12, requires_grad=True)
    rois = random_rois(6, 2, 12, 12, scale=0.5)
    torch._dynamo.reset()
    compiled = torch.compile(
        lambda x, r: opforge_ops.roi_align(x, r, (3, 3), 0.5, 2, True),
        fullgraph=True,
        backend="aot_eager",
        dynamic=dynamic,
    )
    out = compiled(input, rois)
    (grad,) = torch.autograd.grad(out.pow(2).sum(), input)
    torch.testing.assert_close(out, opforge_ops.roi_align(input, rois, (3, 3), 0.5, 2, True))
    torch.testing.assert_close(grad, loss(input, rois))
    if dynamic:  # a new number of rois reuses the graph instead of recompiling
        compiled(input, random_rois(9, 2, 12, 12, scale=0.5))


def test_roi_align_compiles_with_inductor():
    input = torch.randn(2, 3, 12, 12)
    rois = random_rois(6, 2, 12, 12)
    _assert_compiles(
        lambda x, r: opforge_ops.roi_align(x, r, 2, 1.0, -1, False) * 2,
        input,
        rois,
        backend="inductor",
    )


def test_roi_pool_forward_and_backward_compile_with_fullgraph():
    input = torch.randn(2, 3, 12, 12, requires_grad=True)
    rois = random_rois(6, 2, 12, 12)
    torch._dynamo.reset()
    compiled = torch.compile(
        lambda x, r: opforge_ops.roi_pool(x, r, (2, 3), 1.0), fullgraph=True, backend="aot_eager"
    )
    out = compiled(input, rois)
    (grad,) = torch.autograd.grad(out.sum(), input)
    expected = opforge_ops.roi_pool(input, rois, (2, 3), 1.0)
    (expected_grad,) = torch.autograd.grad(expected.sum(), input)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(grad, expected_grad)


class _Detector(torch.nn.Module):
    def forward(self, features, rois, boxes, scores):
        aligned = opforge_ops.roi_align(features, rois, (2, 2), 1.0, 2, True)
        pooled = opforge_ops.roi_pool(features, rois, (2, 2), 1.0)
        keep = opforge_ops.nms(boxes, scores, 0.5)
        return aligned, pooled, keep


def test_torch_export_of_every_op():
    args = (torch.randn(2, 3, 10, 10), random_rois(4, 2, 10, 10), random_boxes(30), torch.rand(30))
    exported = torch.export.export(_Detector(), args)
    targets = {str(node.target) for node in exported.graph.nodes if node.op == "call_function"}
    assert {
        "opforge.roi_align.default",
        "opforge.roi_pool.default",
        "opforge.nms.default",
    } <= targets
    for got, expected in zip(exported.module()(*args), _Detector()(*args)):
        torch.testing.assert_close(got, expected)


# The stable build's Autograd kernels are Python (torch.library.register_autograd); its
# wrappers call an op below autograd when the call needs no graph, which the Python kernel
# would do itself after a round trip. Here the rule is exercised on roi_align whichever build
# this is, by declaring its Autograd kernel Python.
def test_wrappers_skip_a_python_autograd_kernel_only_when_no_graph_is_needed(monkeypatch):
    from opforge_ops.ops import _dispatch

    monkeypatch.setattr(_dispatch, "PYTHON_AUTOGRAD", {"roi_align"})
    skip = _dispatch.below_python_autograd
    x = torch.rand(2, 3, 10, 10, dtype=torch.float64)
    rois = random_rois(4, 2, 10, 10, torch.float64)
    assert skip("roi_align", x, rois) and not skip("roi_pool", x, rois)
    leaf = x.clone().requires_grad_()
    assert not skip("roi_align", leaf, rois)
    with torch.no_grad():
        assert skip("roi_align", leaf, rois)
    seen = []
    torch.func.vmap(lambda t: seen.append(skip("roi_align", t, rois)) or t)(x)
    torch.jit.trace(lambda t: seen.append(skip("roi_align", t, rois)) or t * 1, (x,), check_trace=False)
    assert seen == [False, False]

    # results and gradients as through the Autograd kernel
    plain = opforge_ops.roi_align(x, rois, 3, 0.5, 2, True)
    monkeypatch.setattr(_dispatch, "PYTHON_AUTOGRAD", set())
    assert torch.equal(plain, opforge_ops.roi_align(x, rois, 3, 0.5, 2, True))
    monkeypatch.setattr(_dispatch, "PYTHON_AUTOGRAD", {"roi_align"})
    out = opforge_ops.roi_align(leaf, rois, 3, 0.5, 2, True)
    assert out.grad_fn is not None
    out.sum().backward()
    monkeypatch.setattr(_dispatch, "PYTHON_AUTOGRAD", set())
    again = x.clone().requires_grad_()
    opforge_ops.roi_align(again, rois, 3, 0.5, 2, True).sum().backward()
    assert torch.equal(leaf.grad, again.grad)
