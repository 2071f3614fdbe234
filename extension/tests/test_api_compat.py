"""The public API as detection code uses it: TorchScript, torch.fx, empty inputs, exception types.

These need no torchvision (tests/torchvision_compat/ compares against it where it imports).
"""

import pytest
import torch
import torch.fx
from torch import Tensor
from torch._subclasses.fake_tensor import FakeTensorMode

import opforge_ops
from opforge_ops import (
    DeformConv2d,
    RoIAlign,
    RoIPool,
    batched_nms,
    deform_conv2d,
    nms,
    roi_align,
    roi_pool,
)

# Every public function (opforge_ops.__all__ less its modules and build_info): a new op's
# function is checked here without an edit.
FUNCTIONS = [getattr(opforge_ops, name) for name in opforge_ops.__all__
             if name != "build_info" and not isinstance(getattr(opforge_ops, name), type)]


def test_the_function_list_is_the_public_api():
    assert {"nms", "batched_nms", "roi_align", "deform_conv2d"} <= {fn.__name__ for fn in FUNCTIONS}
    assert all(fn.__name__ == fn.__name__.lower() for fn in FUNCTIONS)


def boxes(n):
    xy = torch.rand(n, 2) * 20
    return torch.cat([xy, xy + torch.rand(n, 2) * 10 + 0.5], dim=1)


def rois(k, batch=2, size=8.0):
    xy = torch.rand(k, 2) * size
    return torch.cat([torch.randint(0, batch, (k, 1)).float(), xy, xy + torch.rand(k, 2) * size], dim=1)


class EveryOp(torch.nn.Module):
    """A model that uses every public function and module, the way detection heads do."""

    def __init__(self):
        super().__init__()
        self.align = RoIAlign((3, 3), 0.5, 2, aligned=True)
        self.pool = RoIPool(2, 0.5)
        self.deform = DeformConv2d(4, 4, 3, padding=1)

    def forward(self, x: Tensor, offset: Tensor, dets: Tensor, scores: Tensor, labels: Tensor,
                boxes_per_image: list[Tensor]):
        y = self.deform(x, offset) + deform_conv2d(x, offset, self.deform.weight, padding=(1, 1))
        keep = nms(dets, scores, 0.5)
        keep_per_class = batched_nms(dets, scores, labels, 0.5)
        a = self.align(y, boxes_per_image)
        p = self.pool(y, boxes_per_image)
        b = roi_align(y, boxes_per_image, 2) + roi_pool(y, boxes_per_image, [2, 2])
        return a.sum() + p.sum() + b.sum(), keep, keep_per_class


def model_inputs(n=12):
    return (torch.rand(2, 4, 8, 8), torch.randn(2, 18, 8, 8), boxes(n), torch.rand(n),
            torch.randint(0, 3, (n,)), [rois(3, 1)[:, 1:], rois(2, 1)[:, 1:]])


def assert_same_outputs(a, b):
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y)


# --- TorchScript -----------------------------------------------------------------------


@pytest.mark.parametrize("fn", FUNCTIONS, ids=lambda f: f.__name__)
def test_every_function_scripts_alone(fn):
    scripted = torch.jit.script(fn)
    assert isinstance(scripted, torch.jit.ScriptFunction)


def test_scripted_functions_compute_what_eager_computes():
    dets, scores, labels = boxes(20), torch.rand(20), torch.randint(0, 3, (20,))
    x, r = torch.rand(2, 3, 9, 9), rois(5)
    assert torch.equal(torch.jit.script(nms)(dets, scores, 0.4), nms(dets, scores, 0.4))
    assert torch.equal(torch.jit.script(batched_nms)(dets, scores, labels, 0.4),
                       batched_nms(dets, scores, labels, 0.4))
    torch.testing.assert_close(torch.jit.script(roi_align)(x, r, [2, 3], 0.5, 2, True),
                               roi_align(x, r, (2, 3), 0.5, 2, True))
    torch.testing.assert_close(torch.jit.script(roi_pool)(x, [r[:, 1:]], [2, 2]), roi_pool(x, [r[:, 1:]], 2))
    inp, off, w = torch.rand(1, 2, 6, 6), torch.randn(1, 18, 4, 4), torch.randn(3, 2, 3, 3)
    torch.testing.assert_close(torch.jit.script(deform_conv2d)(inp, off, w), deform_conv2d(inp, off, w))


@pytest.mark.parametrize("module", [RoIAlign(2, 1.0, -1), RoIAlign((2, 3), 0.25, 2, True),
                                    RoIPool(2, 1.0), RoIPool((3, 1), 0.5),
                                    DeformConv2d(2, 4, 3), DeformConv2d(4, 4, (3, 1), groups=2, bias=False)],
                         ids=repr)
def test_every_module_scripts_alone(module):
    scripted = torch.jit.script(module)
    assert scripted.code  # compiled, not a Python fallback


def test_a_model_using_every_op_scripts_and_matches_eager():
    torch.manual_seed(0)
    model = EveryOp()
    inputs = model_inputs()
    assert_same_outputs(torch.jit.script(model)(*inputs), model(*inputs))


def test_scripted_checks_still_reject_malformed_boxes():
    scripted = torch.jit.script(roi_align)
    with pytest.raises(torch.jit.Error, match=r"Tensor\[K, 5\]"):
        scripted(torch.rand(1, 1, 4, 4), torch.rand(3, 4), [2, 2])


def test_jit_trace_keeps_batched_nms_dynamic_in_the_number_of_boxes():
    traced = torch.jit.trace(batched_nms, (boxes(10), torch.rand(10), torch.randint(0, 2, (10,)), torch.tensor(0.5)))
    empty = traced(torch.zeros(0, 4), torch.zeros(0), torch.zeros(0, dtype=torch.int64), torch.tensor(0.5))
    assert empty.shape == (0,) and empty.dtype == torch.int64
    dets, scores, labels = boxes(30), torch.rand(30), torch.randint(0, 4, (30,))
    assert torch.equal(traced(dets, scores, labels, torch.tensor(0.5)), batched_nms(dets, scores, labels, 0.5))


def test_scripted_roi_align_autocasts_like_eager():
    x, r = torch.rand(1, 3, 8, 8), rois(4, 1)
    scripted = torch.jit.script(roi_align)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        eager = roi_align(x.bfloat16(), r, 2)
        script = scripted(x.bfloat16(), r, [2, 2])
    assert script.dtype == eager.dtype
    torch.testing.assert_close(script, eager)


# --- torch.fx --------------------------------------------------------------------------


class ThroughPackage(torch.nn.Module):
    """Calls the ops through the package attribute and a by-name import: neither is the binding
    torch.fx.wrap patches, so the functions themselves must stay leaves."""

    def forward(self, x, dets, scores, labels, r):
        keep = opforge_ops.batched_nms(dets, scores, labels, 0.5)
        first = nms(dets[keep], scores[keep], 0.3)
        pooled = opforge_ops.roi_align(x, r, (2, 2), 0.5, 2, False) + roi_pool(x, [r[:, 1:]], 2)
        return pooled * first.numel()


def test_symbolic_trace_records_each_op_as_one_leaf_node():
    graph_module = torch.fx.symbolic_trace(ThroughPackage())
    targets = [n.target for n in graph_module.graph.nodes if n.op == "call_function"]
    for fn in (batched_nms, nms, roi_align, roi_pool):
        assert fn in targets, f"{fn.__name__} was traced through instead of kept as a leaf"
    x, dets, scores, labels = torch.rand(1, 2, 8, 8), boxes(10), torch.rand(10), torch.randint(0, 2, (10,))
    r = rois(3, 1)
    torch.testing.assert_close(graph_module(x, dets, scores, labels, r),
                               ThroughPackage()(x, dets, scores, labels, r))


def test_symbolic_trace_of_a_model_using_every_op():
    torch.manual_seed(0)
    model = EveryOp()
    graph_module = torch.fx.symbolic_trace(model)
    inputs = model_inputs()
    assert_same_outputs(graph_module(*inputs), model(*inputs))
    code = graph_module.code
    assert "deform_conv2d" in code and "batched_nms" in code


class OpforgeLeaves(torch.fx.Tracer):
    def is_leaf_module(self, m, qualname):
        return isinstance(m, (RoIAlign, RoIPool, DeformConv2d)) or super().is_leaf_module(m, qualname)


def test_modules_can_be_leaf_modules():
    torch.manual_seed(0)
    model = EveryOp()
    graph = OpforgeLeaves().trace(model)
    called = {n.target for n in graph.nodes if n.op == "call_module"}
    assert called == {"align", "pool", "deform"}
    graph_module = torch.fx.GraphModule(model, graph)
    inputs = model_inputs()
    assert_same_outputs(graph_module(*inputs), model(*inputs))


def test_traced_graph_runs_under_fake_tensors():
    graph_module = torch.fx.symbolic_trace(ThroughPackage())
    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        x = mode.from_tensor(torch.rand(1, 2, 8, 8))
        r = mode.from_tensor(rois(3, 1))
        out = opforge_ops.roi_align(x, r, 2)
        assert out.shape == (3, 2, 2, 2)
    assert graph_module.graph is not None


def test_traced_graph_compiles():
    graph_module = torch.fx.symbolic_trace(EveryOp())
    inputs = model_inputs()
    compiled = torch.compile(graph_module, backend="aot_eager")
    assert_same_outputs(compiled(*inputs), graph_module(*inputs))


# --- empty and degenerate inputs ------------------------------------------------------


@pytest.mark.parametrize("fn_name", ["nms", "batched_nms"])
@pytest.mark.parametrize("n_boxes_past_threshold", [False, True])
def test_nms_of_no_boxes_is_empty(fn_name, n_boxes_past_threshold):
    dets, scores, labels = torch.zeros(0, 4), torch.zeros(0), torch.zeros(0, dtype=torch.int64)
    args = (dets, scores, 0.5) if fn_name == "nms" else (dets, scores, labels, 0.5)
    out = getattr(opforge_ops, fn_name)(*args)
    assert out.shape == (0,) and out.dtype == torch.int64


def test_batched_nms_both_strategies_agree_and_handle_empty():
    from opforge_ops.ops.nms import _batched_nms_coordinate_trick, _batched_nms_vanilla

    empty = (torch.zeros(0, 4), torch.zeros(0), torch.zeros(0, dtype=torch.int64), 0.5)
    for strategy in (_batched_nms_coordinate_trick, _batched_nms_vanilla):
        assert strategy(*empty).shape == (0,)
    dets, scores, labels = boxes(1200) * 5, torch.rand(1200), torch.randint(0, 7, (1200,))
    assert torch.equal(_batched_nms_vanilla(dets, scores, labels, 0.5),
                       _batched_nms_coordinate_trick(dets, scores, labels, 0.5))


@pytest.mark.parametrize("fn", [roi_align, roi_pool], ids=lambda f: f.__name__)
@pytest.mark.parametrize("input_shape, boxes_arg, size, expected", [
    ((2, 3, 8, 8), torch.zeros(0, 5), 2, (0, 3, 2, 2)),
    ((2, 0, 8, 8), torch.tensor([[0, 1.0, 1, 4, 4]]), 2, (1, 0, 2, 2)),
    ((0, 3, 8, 8), torch.zeros(0, 5), 2, (0, 3, 2, 2)),
    ((2, 3, 8, 8), [torch.zeros(0, 4), torch.zeros(0, 4)], 2, (0, 3, 2, 2)),
    ((2, 3, 8, 8), torch.tensor([[0, 1.0, 1, 4, 4]]), 0, (1, 3, 0, 0)),
    ((2, 3, 8, 8), torch.tensor([[0, 1.0, 1, 4, 4]]), (0, 3), (1, 3, 0, 3)),
])
def test_roi_ops_on_empty_inputs_return_empty_outputs(fn, input_shape, boxes_arg, size, expected):
    x = torch.rand(input_shape, requires_grad=True)
    out = fn(x, boxes_arg, size)
    assert out.shape == expected
    out.sum().backward()
    assert x.grad.shape == x.shape and not x.grad.any()


@pytest.mark.parametrize("shapes, expected", [
    (dict(batch=0), (0, 4, 4, 4)),
    (dict(out_c=0), (2, 0, 4, 4)),
])
def test_deform_conv2d_on_empty_inputs(shapes, expected):
    batch, out_c = shapes.get("batch", 2), shapes.get("out_c", 4)
    out = deform_conv2d(torch.rand(batch, 2, 6, 6), torch.rand(batch, 18, 4, 4), torch.rand(out_c, 2, 3, 3))
    assert out.shape == expected


# --- exception types torchvision users catch -------------------------------------------


X = torch.rand(2, 3, 8, 8)


@pytest.mark.parametrize("boxes_arg, error, message", [
    (torch.rand(3, 4), AssertionError, r"Tensor\[K, 5\]"),
    (torch.rand(5), IndexError, r"Tensor\[K, 5\]"),
    ([torch.rand(3, 5)], AssertionError, r"boxes\[0\] must be a Tensor\[L, 4\]"),
    ([torch.rand(4)], IndexError, r"boxes\[0\]"),
    ("boxes", AssertionError, "Tensor"),
    ([], ValueError, "empty list"),
])
@pytest.mark.parametrize("fn", [roi_align, roi_pool], ids=lambda f: f.__name__)
def test_malformed_boxes_raise_torchvisions_exception_types(fn, boxes_arg, error, message):
    with pytest.raises(error, match=message):
        fn(X, boxes_arg, 2)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(weight=torch.tensor(1.0)), IndexError, "weight must be a 4-D"),
    (dict(weight=torch.rand(4)), ValueError, "weight must be a 4-D"),
    (dict(input=torch.rand(2, 6, 6)), ValueError, "input must be a 4-D"),
    (dict(offset=torch.rand(18)), IndexError, "offset must be a 4-D"),
    (dict(weight=torch.rand(4, 2, 0, 3)), ZeroDivisionError, "empty kernel"),
    (dict(weight=torch.rand(4, 0, 3, 3)), ZeroDivisionError, "in_channels / groups"),
    (dict(offset=torch.rand(2, 4, 4, 4)), RuntimeError, "multiple of 2"),
    (dict(weight=torch.rand(4, 2, 3, 3, dtype=torch.float64)), RuntimeError, "dtype"),
])
def test_deform_conv2d_raises_torchvisions_exception_types(kwargs, error, message):
    args = dict(input=torch.rand(2, 2, 6, 6), offset=torch.rand(2, 18, 4, 4), weight=torch.rand(4, 2, 3, 3))
    args.update(kwargs)
    with pytest.raises(error, match=message):
        deform_conv2d(**args)


@pytest.mark.parametrize("idxs, error", [
    (torch.zeros(3, dtype=torch.int64), RuntimeError),
    (torch.tensor(0), IndexError),
    (torch.zeros(5, 1, dtype=torch.int64), RuntimeError),
])
def test_batched_nms_bad_idxs(idxs, error):
    with pytest.raises(error, match="idxs"):
        batched_nms(boxes(5), torch.rand(5), idxs, 0.5)


def test_batched_nms_one_category_for_every_box_broadcasts():
    dets, scores = boxes(9), torch.rand(9)
    assert torch.equal(batched_nms(dets, scores, torch.tensor([4]), 0.5), nms(dets, scores, 0.5))
