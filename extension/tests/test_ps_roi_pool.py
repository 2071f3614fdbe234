"""ps_roi_pool on every backend (see ps_roi_tester.py), and what is particular to it."""

import pytest
import torch
from backends import BACKENDS
from ps_roi_tester import PsRoiOpTester

import opforge_ops
import ops_reference


class TestPsRoiPool(PsRoiOpTester):
    op = "ps_roi_pool"
    backward = "_ps_roi_pool_backward"

    def reference(self, x, rois, scale, ph, pw, ratio):
        return ops_reference.ps_roi_pool(x, rois, scale, ph, pw)

    def forward_args(self, x, rois, scale, ph, pw, ratio):
        return (x, rois, scale, ph, pw)

    def backward_args(self, grad, rois, mapping, scale, ph, pw, ratio, shape):
        return (grad, rois, mapping, scale, ph, pw, *shape)

    def api_call(self, x, boxes, output_size, scale, ratio):
        return opforge_ops.ps_roi_pool(x, boxes, output_size, scale)

    def make_module(self, output_size, scale, ratio):
        return opforge_ops.PSRoIPool(output_size, scale)

    def test_schema_matches_torchvision(self):
        assert str(torch.ops.opforge.ps_roi_pool.default._schema) == (
            "opforge::ps_roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
            "SymInt pooled_width) -> (Tensor, Tensor)"
        )
        assert str(torch.ops.opforge._ps_roi_pool_backward.default._schema) == (
            "opforge::_ps_roi_pool_backward(Tensor grad, Tensor rois, Tensor channel_mapping, float spatial_scale, "
            "SymInt pooled_height, SymInt pooled_width, SymInt batch_size, SymInt channels, SymInt height, "
            "SymInt width) -> Tensor"
        )

    @pytest.mark.parametrize("backend", BACKENDS, ids=str)
    def test_the_last_row_and_column_are_never_pooled_like_torchvision(self, backend):
        backend.skip_unless_runs(torch.float32)
        x = torch.zeros(1, 1, 4, 4)
        x[0, 0, 3, :] = 100.0
        x[0, 0, :, 3] = 100.0
        out, _ = backend.call("ps_roi_pool", x, torch.tensor([[0.0, 0, 0, 4, 4]]), 1.0, 1, 1)
        assert out.item() == 0.0
