"""ps_roi_align on every backend (see ps_roi_tester.py) against its slow reference (below),
what is particular to it, and its torchvision cases (torchvision_compat/)."""

import itertools
import math

import pytest
import torch
from backends import BACKENDS
from ps_roi_tester import PsRoiOpTester

import opforge_ops
from ops_reference import acc as _acc
from ops_reference import bilinear


# ------------------------------------------------------------ the slow reference
def reference(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio):
    """(output, channel_mapping): output channel c of bin (ph, pw) averages bilinear samples
    of input channel (c * PH + ph) * PW + pw on a regular grid inside the bin, boxes shifted
    by -0.5 pixel. An adaptive grid of 0 along a side averages nothing over 0 (NaN)."""
    acc = _acc(rois)
    bins = pooled_height * pooled_width
    channels_out = input.shape[1] // bins
    shape = (rois.shape[0], channels_out, pooled_height, pooled_width)
    mapping = (torch.arange(channels_out * bins, dtype=torch.int32).reshape(shape[1:])).expand(shape)
    rows = []
    for roi in rois.double().tolist():
        planes = input[int(roi[0])].double()
        start_x, start_y = (acc(v) * acc(spatial_scale) - acc(0.5) for v in roi[1:3])
        end_x, end_y = (acc(v) * acc(spatial_scale) - acc(0.5) for v in roi[3:5])
        bin_h, bin_w = (end_y - start_y) / acc(pooled_height), (end_x - start_x) / acc(pooled_width)
        raw_h = sampling_ratio if sampling_ratio > 0 else math.ceil(bin_h)
        raw_w = sampling_ratio if sampling_ratio > 0 else math.ceil(bin_w)
        grid_h, grid_w = max(raw_h, 0), max(raw_w, 0)
        count = math.nan if raw_h == 0 or raw_w == 0 else max(grid_h * grid_w, 1)
        out = []
        for ph in range(pooled_height):
            for pw in range(pooled_width):
                plane = planes[ph * pooled_width + pw :: bins]  # one channel per output channel
                total = plane.new_zeros(channels_out)
                for iy in range(grid_h):
                    y = start_y + acc(ph) * bin_h + (acc(iy) + acc(0.5)) * bin_h / acc(grid_h)
                    for ix in range(grid_w):
                        x = start_x + acc(pw) * bin_w + (acc(ix) + acc(0.5)) * bin_w / acc(grid_w)
                        total = total + bilinear(plane, float(y), float(x))
                out.append(total / count)
        rows.append(torch.stack(out, dim=1).reshape(shape[1:]))
    output = torch.stack(rows) if rows else input.new_zeros(shape, dtype=torch.float64)
    return output.to(input.dtype), mapping.contiguous()



class TestPsRoiAlign(PsRoiOpTester):
    op = "ps_roi_align"
    backward = "_ps_roi_align_backward"

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


# ---------------------------------------------------- torchvision-compatibility cases
def torchvision_cases():
    """ps_roi_align's and PSRoIAlign's cases for the torchvision differential suite;
    torchvision_compat/tv_cases.py calls this, with its helpers imported."""
    from tv_cases import (
        BOX_FORMS,
        FLOAT_DTYPES,
        MEMORY_LAYOUTS,
        Case,
        bin_count,
        crashing_torchvision,
        ps_common_cases,
        ps_inputs,
    )

    for dtype, form, memory in itertools.product(FLOAT_DTYPES + (torch.float16,), BOX_FORMS, MEMORY_LAYOUTS):
        for size, scale, ratio in ((2, 1.0, -1), ((3, 2), 0.5, 2), ([1, 4], 2.0, 0)):
            yield Case(
                "ps_roi_align", f"{dtype}-{form}-{memory}-{size}-{scale}-{ratio}",
                lambda dtype=dtype, form=form, memory=memory, size=size: ps_inputs(
                    dtype, form, memory, bin_count(size)),
                lambda ns, a, size=size, scale=scale, ratio=ratio: ns.ps_roi_align(a[0], a[1], size, scale, ratio),
                grad=dtype == torch.float64,
            )
    yield from crashing_torchvision(
        ps_common_cases("ps_roi_align", lambda ns, a, size=1: ns.ps_roi_align(a[0], a[1], size, 1.0, -1)),
        {
            "input-zero-height": "zeros",  # torchvision: reads before the input
            "input-zero-width": "zeros",
            "output-size-0": "RuntimeError",  # torchvision: SIGFPE (channels % 0)
            "output-size-0-by-2": "RuntimeError",
        },
    )
    yield Case("ps_roi_align", "keyword-arguments", lambda: ps_inputs(torch.float32, "tensor", "contiguous", 4),
               lambda ns, a: ns.ps_roi_align(input=a[0], boxes=a[1], output_size=(2, 2), spatial_scale=0.5,
                                             sampling_ratio=3))
    yield Case("ps_roi_align", "defaults", lambda: ps_inputs(torch.float32, "tensor", "contiguous", 9),
               lambda ns, a: ns.ps_roi_align(a[0], a[1], 3))
    yield Case("ps_roi_align", "module", lambda: ps_inputs(torch.float64, "list", "contiguous", 6),
               lambda ns, a: ns.PSRoIAlign((2, 3), 0.5, 2)(a[0], a[1]), grad=True)
    yield Case("ps_roi_align", "module-repr", lambda: (), lambda ns, a: repr(ns.PSRoIAlign((2, 3), 0.5, 2)))
