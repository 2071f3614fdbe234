"""ps_roi_pool on every backend (see ps_roi_tester.py) against its slow reference (below),
what is particular to it, and its torchvision cases (torchvision_compat/)."""

import itertools
import math

import pytest
import torch
from backends import BACKENDS
from ps_roi_tester import PsRoiOpTester

import opforge_ops
from ops_reference import acc as _acc
from ops_reference import round_half_away


# ------------------------------------------------------------ the slow reference
def reference(input, rois, spatial_scale, pooled_height, pooled_width):
    """(output, channel_mapping): output channel c of bin (ph, pw) is the mean of input
    channel (c * PH + ph) * PW + pw over the bin quantized to pixels; bins are clipped to
    [0, H - 1) x [0, W - 1), as torchvision's (the last row and column are never pooled)."""
    acc = _acc(rois)
    height, width = input.shape[-2:]
    bins = pooled_height * pooled_width
    channels_out = input.shape[1] // bins
    shape = (rois.shape[0], channels_out, pooled_height, pooled_width)
    mapping = (torch.arange(channels_out * bins, dtype=torch.int32).reshape(shape[1:])).expand(shape)
    rows = []
    for roi in rois.double().tolist():
        planes = input[int(roi[0])].double()
        x1, y1, x2, y2 = (round_half_away(float(acc(v) * acc(spatial_scale))) for v in roi[1:])
        bin_h = acc(max(y2 - y1, 1)) / acc(pooled_height)
        bin_w = acc(max(x2 - x1, 1)) / acc(pooled_width)
        out = []
        for ph in range(pooled_height):
            h0 = min(max(math.floor(acc(ph) * bin_h) + y1, 0), max(height - 1, 0))
            h1 = min(max(math.ceil(acc(ph + 1) * bin_h) + y1, 0), max(height - 1, 0))
            for pw in range(pooled_width):
                w0 = min(max(math.floor(acc(pw) * bin_w) + x1, 0), max(width - 1, 0))
                w1 = min(max(math.ceil(acc(pw + 1) * bin_w) + x1, 0), max(width - 1, 0))
                plane = planes[ph * pooled_width + pw :: bins]
                if h1 <= h0 or w1 <= w0:
                    out.append(plane.new_zeros(channels_out))
                else:
                    out.append(plane[:, h0:h1, w0:w1].mean(dim=(1, 2)))
        rows.append(torch.stack(out, dim=1).reshape(shape[1:]))
    output = torch.stack(rows) if rows else input.new_zeros(shape, dtype=torch.float64)
    return output.to(input.dtype), mapping.contiguous()



class TestPsRoiPool(PsRoiOpTester):
    op = "ps_roi_pool"
    backward = "_ps_roi_pool_backward"

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


# ---------------------------------------------------- torchvision-compatibility cases
def torchvision_cases():
    """ps_roi_pool's and PSRoIPool's cases for the torchvision differential suite;
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

    for dtype, form, memory in itertools.product(FLOAT_DTYPES, BOX_FORMS, MEMORY_LAYOUTS):
        for size, scale in ((2, 1.0), ((3, 2), 0.5), ([1, 4], 2.0)):
            yield Case(
                "ps_roi_pool", f"{dtype}-{form}-{memory}-{size}-{scale}",
                lambda dtype=dtype, form=form, memory=memory, size=size: ps_inputs(
                    dtype, form, memory, bin_count(size)),
                lambda ns, a, size=size, scale=scale: ns.ps_roi_pool(a[0], a[1], size, scale),
            )
            if scale <= 1.0:  # the gradient, on boxes off the last row and column
                yield Case(
                    "ps_roi_pool", f"{dtype}-{form}-{memory}-{size}-{scale}-interior",
                    lambda dtype=dtype, form=form, memory=memory, size=size: ps_inputs(
                        dtype, form, memory, bin_count(size), interior=True),
                    lambda ns, a, size=size, scale=scale: ns.ps_roi_pool(a[0], a[1], size, scale),
                    grad=dtype == torch.float64,
                )
    yield from crashing_torchvision(
        ps_common_cases("ps_roi_pool", lambda ns, a, size=1: ns.ps_roi_pool(a[0], a[1], size, 1.0)),
        {"output-size-0": "RuntimeError", "output-size-0-by-2": "RuntimeError"},  # torchvision: SIGFPE
    )
    yield Case("ps_roi_pool", "module", lambda: ps_inputs(torch.float64, "list", "contiguous", 6, interior=True),
               lambda ns, a: ns.PSRoIPool((2, 3), 0.5)(a[0], a[1]), grad=True)
    yield Case("ps_roi_pool", "module-repr", lambda: (), lambda ns, a: repr(ns.PSRoIPool((2, 3), 0.5)))


def test_backward_writes_every_element_of_every_channel_block():
    # 3x3 bins x 31 output channels = 279 input channels, more than two of the CPU backward's
    # channel blocks; the grad input it returns is allocated uninitialized and zeroed by the
    # kernel: with the allocator handing back memory full of NaN, every pixel no bin covers
    # (the last row and column among them) must still come back 0.
    shape = (2, 279, 12, 12)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(shape, generator=g, dtype=torch.float64)
    rois = torch.tensor([[0, 1, 1, 6, 7], [1, 0, 2, 9, 10], [1, 4, 4, 5, 5], [0, 20, 20, 30, 30]],
                        dtype=torch.float64)
    x64 = x.clone().requires_grad_()
    expected_out, mapping = reference(x64, rois, 1.0, 3, 3)
    grad = torch.randn(expected_out.shape, generator=g, dtype=torch.float64)
    (expected,) = torch.autograd.grad(expected_out, x64, grad)
    for _ in range(3):
        torch.full(shape, float("nan"), dtype=torch.float64)
    got = torch.ops.opforge._ps_roi_pool_backward(grad, rois, mapping, 1.0, 3, 3, *shape)
    assert not got.isnan().any()
    assert not got[:, :, -1].any() and not got[:, :, :, -1].any()
    torch.testing.assert_close(got, expected)
