"""The tester both position-sensitive RoI ops share: every backend against the op's slow
reference (`reference` in its test_<op>.py, see ops_reference.py), then what only the CPU build
exercises (gradcheck, opcheck, torch.compile, torch.export, autocast, TorchScript, the Python
API). A test file per op subclasses it as Test<Op> and says how to call the op."""

from __future__ import annotations

import pytest
import torch
import torch.fx
from backends import ALL_FLOATS, BACKENDS
from backends import backend_tolerance as tolerance
from torch.library import opcheck

import opforge_ops
import ops_reference
from ops_inputs import random_rois

# spatial_scale, (pooled_height, pooled_width), sampling_ratio (ps_roi_align only), input H x W
CASES = [
    (1.0, (3, 3), 2, (13, 11)),
    (0.5, (2, 3), -1, (9, 12)),
    (0.25, (1, 1), 0, (6, 7)),
    (2.0, (4, 2), 1, (8, 8)),
]


def case_inputs(case, dtype, rois=24, batch=2, channels_out=2, seed=0):
    scale, (ph, pw), ratio, (height, width) = case
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, channels_out * ph * pw, height, width, generator=g).to(dtype)
    boxes = random_rois(rois, batch, height, width, scale=scale, generator=g)
    return x, boxes.to(dtype), scale, ph, pw, ratio


class PsRoiOpTester:
    op: str  # torch.ops.opforge name
    backward: str

    def reference(self, x, rois, scale, ph, pw, ratio):
        """(output, channel_mapping) of the op's slow reference."""
        return ops_reference.of(self.op)(*self.forward_args(x, rois, scale, ph, pw, ratio))

    # --------------------------------------------------------- per-op hooks
    def forward_args(self, x, rois, scale, ph, pw, ratio):
        raise NotImplementedError

    def backward_args(self, grad, rois, mapping, scale, ph, pw, ratio, shape):
        raise NotImplementedError

    def api_call(self, x, boxes, output_size, scale, ratio):
        raise NotImplementedError

    def make_module(self, output_size, scale, ratio):
        raise NotImplementedError

    # ------------------------------------------------------ every backend
    @pytest.mark.parametrize("backend", BACKENDS, ids=str)
    @pytest.mark.parametrize("dtype", ALL_FLOATS, ids=str)
    @pytest.mark.parametrize("case", CASES, ids=lambda c: f"scale{c[0]}-{c[1][0]}x{c[1][1]}-ratio{c[2]}")
    def test_forward_matches_reference(self, backend, dtype, case):
        backend.skip_unless_runs(dtype)
        x, rois, scale, ph, pw, ratio = case_inputs(case, dtype)
        out, mapping = backend.call(self.op, *self.forward_args(x, rois, scale, ph, pw, ratio))
        expected, expected_mapping = self.reference(x, rois, scale, ph, pw, ratio)
        assert out.dtype == dtype and mapping.dtype == torch.int32
        torch.testing.assert_close(mapping, expected_mapping, rtol=0, atol=0)
        torch.testing.assert_close(out.double(), expected.double(), equal_nan=True, **tolerance(dtype))

    @pytest.mark.parametrize("backend", BACKENDS, ids=str)
    @pytest.mark.parametrize("dtype", ALL_FLOATS, ids=str)
    @pytest.mark.parametrize("case", CASES[:2], ids=lambda c: f"scale{c[0]}-{c[1][0]}x{c[1][1]}")
    def test_backward_is_the_gradient_of_the_reference(self, backend, dtype, case):
        backend.skip_unless_runs(dtype)
        x, rois, scale, ph, pw, ratio = case_inputs(case, dtype, seed=1)
        x64 = x.double().requires_grad_()
        expected_out, mapping = self.reference(x64, rois, scale, ph, pw, ratio)
        grad = torch.randn(expected_out.shape, generator=torch.Generator().manual_seed(2)).to(dtype)
        (expected,) = torch.autograd.grad(expected_out, x64, grad.double())
        got = backend.call(self.backward, *self.backward_args(grad, rois, mapping, scale, ph, pw, ratio, x.shape))
        assert got.dtype == dtype and got.shape == x.shape
        torch.testing.assert_close(got.double(), expected, **tolerance(dtype))

    @pytest.mark.parametrize("backend", BACKENDS, ids=str)
    def test_no_rois_and_no_grad(self, backend):
        backend.skip_unless_runs(torch.float32)
        x = torch.randn(1, 8, 5, 5)
        no_rois = torch.empty(0, 5)
        out, mapping = backend.call(self.op, *self.forward_args(x, no_rois, 1.0, 2, 2, 2))
        assert out.shape == mapping.shape == (0, 2, 2, 2)
        grad = torch.empty(0, 2, 2, 2)
        got = backend.call(self.backward, *self.backward_args(grad, no_rois, mapping, 1.0, 2, 2, 2, x.shape))
        assert got.shape == x.shape and not got.any()

    @pytest.mark.parametrize("backend", BACKENDS, ids=str)
    def test_channels_must_be_a_multiple_of_the_bins(self, backend):
        backend.skip_unless_runs(torch.float32)
        x = torch.randn(1, 6, 5, 5)
        rois = torch.tensor([[0.0, 0, 0, 3, 3]])
        message = rf"{self.op}: input channels \(6\) must be a multiple of pooled_height \* pooled_width \(4\)"
        with pytest.raises(RuntimeError, match=message):
            backend.call(self.op, *self.forward_args(x, rois, 1.0, 2, 2, 2))

    @pytest.mark.parametrize("backend", BACKENDS, ids=str)
    def test_backward_refuses_a_channel_mapping_of_the_wrong_shape(self, backend):
        backend.skip_unless_runs(torch.float32)
        grad, rois = torch.ones(1, 2, 2, 2), torch.tensor([[0.0, 0, 0, 3, 3]])
        mapping = torch.zeros(1, 2, 2, 1, dtype=torch.int32)
        with pytest.raises(RuntimeError, match=f"{self.backward}: channel_mapping must be an int32 tensor shaped like grad"):
            backend.call(self.backward, *self.backward_args(grad, rois, mapping, 1.0, 2, 2, 2, (1, 8, 5, 5)))

    # -------------------------------------------------- the CPU build only
    @pytest.mark.parametrize("case", CASES[:2], ids=["fixed", "adaptive"])
    def test_many_rois_match_one_roi_at_a_time_on_any_thread_count(self, case):
        # A call walks all its rois (ps_roi_pool's forward plane by plane, over threads when
        # it is large enough); one roi at a time is the same arithmetic per bin: the same bits.
        x, rois, scale, ph, pw, ratio = case_inputs(case, torch.float32, rois=800, channels_out=48)
        op = getattr(torch.ops.opforge, self.op)
        backward = getattr(torch.ops.opforge, self.backward)
        one_by_one = [op(*self.forward_args(x, rois[i : i + 1], scale, ph, pw, ratio)) for i in range(len(rois))]
        expected_out = torch.cat([o for o, _ in one_by_one])
        expected_mapping = torch.cat([m for _, m in one_by_one])
        grad = torch.randn(expected_out.shape)
        # A mapping other than the forward's: the backward must follow the one it is given.
        mapping = expected_mapping.flip(1).contiguous()
        threads = torch.get_num_threads()
        results = []
        try:
            for n in (1, 2):
                torch.set_num_threads(n)
                out, got_mapping = op(*self.forward_args(x, rois, scale, ph, pw, ratio))
                torch.testing.assert_close(out, expected_out, rtol=0, atol=0)
                assert torch.equal(got_mapping, expected_mapping)
                results.append(backward(*self.backward_args(grad, rois, mapping, scale, ph, pw, ratio, x.shape)))
        finally:
            torch.set_num_threads(threads)
        torch.testing.assert_close(results[1], results[0], rtol=0, atol=0)
        by_roi = sum(
            backward(*self.backward_args(grad[i : i + 1], rois[i : i + 1], mapping[i : i + 1], scale, ph, pw, ratio, x.shape))
            for i in range(len(rois))
        )
        torch.testing.assert_close(results[0], by_roi, rtol=1e-5, atol=1e-5)

    def test_gradcheck(self):
        x, rois, scale, ph, pw, ratio = case_inputs(CASES[0], torch.float64, rois=5, channels_out=1)
        x = x[:, :, :7, :6].contiguous().requires_grad_()
        rois = random_rois(5, 2, 7, 6, torch.float64, scale=scale)
        assert torch.autograd.gradcheck(lambda t: self.api_call(t, rois, (ph, pw), scale, ratio), (x,))

    def test_opcheck(self):
        x, rois, scale, ph, pw, ratio = case_inputs(CASES[1], torch.float32, rois=6)
        args = self.forward_args(x.requires_grad_(), rois, scale, ph, pw, ratio)
        opcheck(getattr(torch.ops.opforge, self.op), args)
        out, mapping = getattr(torch.ops.opforge, self.op)(*args)
        backward_args = self.backward_args(torch.randn(out.shape), rois, mapping, scale, ph, pw, ratio, x.shape)
        opcheck(getattr(torch.ops.opforge, self.backward), backward_args)

    def test_torch_compile_fullgraph_matches_eager(self):
        x, rois, scale, ph, pw, ratio = case_inputs(CASES[0], torch.float32, rois=8)
        fn = lambda t, r: self.api_call(t, r, (ph, pw), scale, ratio)  # noqa: E731
        compiled = torch.compile(fn, fullgraph=True, backend="eager")
        torch.testing.assert_close(compiled(x, rois), fn(x, rois))

    def test_torch_export_matches_eager(self):
        x, rois, scale, ph, pw, ratio = case_inputs(CASES[0], torch.float32, rois=8)
        module = self.make_module((ph, pw), scale, ratio)
        exported = torch.export.export(module, (x, rois))
        torch.testing.assert_close(exported.module()(x, rois), module(x, rois))

    @pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
    def test_autocast_cpu_computes_in_float32_and_returns_the_input_dtype(self, dtype):
        x, rois, scale, ph, pw, ratio = case_inputs(CASES[0], dtype, rois=8)
        with torch.autocast("cpu", dtype=dtype):
            out, mapping = getattr(torch.ops.opforge, self.op)(*self.forward_args(x, rois, scale, ph, pw, ratio))
        expected, _ = getattr(torch.ops.opforge, self.op)(*self.forward_args(x.float(), rois.float(), scale, ph, pw, ratio))
        assert out.dtype == dtype and mapping.dtype == torch.int32
        torch.testing.assert_close(out, expected.to(dtype), rtol=0, atol=0)

    def test_boxes_list_and_int_output_size_give_the_same_result(self):
        x = torch.randn(2, 8, 9, 9)
        boxes = [torch.tensor([[1.0, 1, 6, 7]]), torch.tensor([[0.0, 2, 8, 5], [2.0, 2, 3, 3]])]
        rois = torch.tensor([[0.0, 1, 1, 6, 7], [1.0, 0, 2, 8, 5], [1.0, 2, 2, 3, 3]])
        torch.testing.assert_close(self.api_call(x, boxes, 2, 0.5, 2), self.api_call(x, rois, (2, 2), 0.5, 2))
        module = self.make_module(2, 0.5, 2)
        torch.testing.assert_close(module(x, boxes), self.api_call(x, rois, (2, 2), 0.5, 2))
        assert repr(module).startswith(type(module).__name__ + "(output_size=2, spatial_scale=0.5")

    def test_scripted_function_and_module_compute_what_eager_computes(self):
        x, rois, scale, ph, pw, ratio = case_inputs(CASES[0], torch.float32, rois=8)
        boxes = [rois[rois[:, 0] == i, 1:] for i in range(2)]
        eager = self.api_call(x, boxes, (ph, pw), scale, ratio)
        module = self.make_module((ph, pw), scale, ratio)
        torch.testing.assert_close(torch.jit.script(module)(x, boxes), eager)
        torch.testing.assert_close(torch.jit.script(module)(x, rois), module(x, rois))

    def test_symbolic_trace_keeps_the_function_as_one_leaf(self):
        x, rois, scale, ph, pw, ratio = case_inputs(CASES[0], torch.float32, rois=8)
        tester = self

        class Head(torch.nn.Module):
            def forward(self, features, r):
                return tester.api_call(features.relu(), r, (ph, pw), scale, ratio) * 2

        graph_module = torch.fx.symbolic_trace(Head())
        targets = [n.target for n in graph_module.graph.nodes if n.op == "call_function"]
        assert getattr(opforge_ops, self.op) in targets
        torch.testing.assert_close(graph_module(x, rois), Head()(x, rois))

    def test_double_backward_is_a_clear_error(self):
        x = torch.randn(1, 4, 6, 6, dtype=torch.float64, requires_grad=True)
        rois = torch.tensor([[0.0, 0, 0, 4, 4]], dtype=torch.float64)
        out = self.api_call(x, rois, 2, 1.0, 2)
        (g,) = torch.autograd.grad(out.pow(2).sum(), x, create_graph=True)
        with pytest.raises(RuntimeError, match="first-order gradients only"):
            g.sum().backward()

    def test_registers_every_dispatch_key_of_the_build(self):
        for key in ("CPU", "Meta", "Autograd", "AutocastCPU"):
            assert torch._C._dispatch_has_kernel_for_dispatch_key(f"opforge::{self.op}", key), key
        for key in ("CPU", "Meta"):
            assert torch._C._dispatch_has_kernel_for_dispatch_key(f"opforge::{self.backward}", key), key
        for device in [b for b in opforge_ops.build_info()["backends"] if b != "cpu"]:
            key = device.upper()
            for op in (self.op, self.backward):
                assert torch._C._dispatch_has_kernel_for_dispatch_key(f"opforge::{op}", key), (op, key)
            assert torch._C._dispatch_has_kernel_for_dispatch_key(f"opforge::{self.op}", "Autocast" + key)
