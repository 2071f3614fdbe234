"""ps_roi_align on every backend (see ps_roi_tester.py), and what is particular to it."""

import pytest
import torch
from backends import BACKENDS
from ps_roi_tester import PsRoiOpTester

import opforge_ops
import ops_reference


class TestPsRoiAlign(PsRoiOpTester):
    op = "ps_roi_align"
    backward = "_ps_roi_align_backward"

    def reference(self, x, rois, scale, ph, pw, ratio):
        return ops_reference.ps_roi_align(x, rois, scale, ph, pw, ratio)

    def forward_args(self, x, rois, scale, ph, pw, ratio):
        return (x, rois, scale, ph, pw, ratio)

    def backward_args(self, grad, rois, mapping, scale, ph, pw, ratio, shape):
        return (grad, rois, mapping, scale, ph, pw, ratio, *shape)

    def api_call(self, x, boxes, output_size, scale, ratio):
        return opforge_ops.ps_roi_align(x, boxes, output_size, scale, ratio)

    def make_module(self, output_size, scale, ratio):
        return opforge_ops.PSRoIAlign(output_size, scale, ratio)

    def test_schema_matches_torchvision(self):
        assert str(torch.ops.opforge.ps_roi_align.default._schema) == (
            "opforge::ps_roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
            "SymInt pooled_width, int sampling_ratio) -> (Tensor, Tensor)"
        )
        assert str(torch.ops.opforge._ps_roi_align_backward.default._schema) == (
            "opforge::_ps_roi_align_backward(Tensor grad, Tensor rois, Tensor channel_mapping, float spatial_scale, "
            "SymInt pooled_height, SymInt pooled_width, int sampling_ratio, SymInt batch_size, SymInt channels, "
            "SymInt height, SymInt width) -> Tensor"
        )

    @pytest.mark.parametrize("backend", BACKENDS, ids=str)
    def test_a_roi_without_adaptive_samples_averages_to_nan_like_torchvision(self, backend):
        backend.skip_unless_runs(torch.float32)
        x = torch.randn(1, 4, 6, 6)
        rois = torch.tensor([[0.0, 2, 2, 2, 5], [0.0, 1, 1, 4, 4]])  # the first has zero width
        out, _ = backend.call("ps_roi_align", x, rois, 1.0, 2, 2, 0)
        assert out[0].isnan().all() and not out[1].isnan().any()
        grad = backend.call("_ps_roi_align_backward", torch.ones_like(out), rois,
                            torch.arange(4, dtype=torch.int32).reshape(1, 1, 2, 2).expand(2, 1, 2, 2).contiguous(),
                            1.0, 2, 2, 0, 1, 4, 6, 6)
        assert not grad.isnan().any()
