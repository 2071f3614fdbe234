"""deform_conv2d on every backend (tests/backends.py) against its slow reference (below),
then what only the CPU build exercises (gradcheck, opcheck, torch.compile, torch.export,
autocast, the module, the Python function's checks), and its torchvision cases
(torchvision_compat/). A backend's own concerns (CUDA's chunk loop and streams, Metal's
threadgroup geometry) stay beside it, in test_cuda.py / test_metal_emu.py."""

from __future__ import annotations

import functools
import itertools
import math

import pytest
import torch
from backends import ALL_FLOATS, BACKENDS, backend_tolerance

from opforge_ops import DeformConv2d, deform_conv2d


# ------------------------------------------------------------ the slow reference
def _bilinear_zero_padded(planes, y, x):
    """Bilinear sample of every plane at (y, x), neighbours outside the image counting as 0
    (deform_conv2d's rule; a point one pixel or more outside samples 0). y and x are 0-d
    tensors, so autograd reaches the offsets; they keep the offsets' dtype, as the kernels'
    sampling positions do (float32 offsets: float32 positions)."""
    height, width = planes.shape[-2:]
    yv, xv = float(y.detach()), float(x.detach())
    if math.isnan(yv) or math.isnan(xv):
        return planes.new_full(planes.shape[:-2], math.nan)
    if yv <= -1 or yv >= height or xv <= -1 or xv >= width:
        return planes.new_zeros(planes.shape[:-2])
    y0, x0 = math.floor(yv), math.floor(xv)
    ly, lx = y - y0, x - x0
    out = planes.new_zeros(planes.shape[:-2])
    for yy, wy in ((y0, 1 - ly), (y0 + 1, ly)):
        for xx, wx in ((x0, 1 - lx), (x0 + 1, lx)):
            if 0 <= yy < height and 0 <= xx < width:
                out = out + wy * wx * planes[..., yy, xx]
    return out


def reference(
    input, offset, weight, bias=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1), mask=None
):
    """Deformable convolution point by point: kernel tap (i, j) of output pixel (oh, ow)
    samples the input at (oh * sh - ph + i * dh, ow * sw - pw + j * dw) plus the tap's
    offset (offset group of the channel), times the tap's mask; then a grouped 1x1-per-tap
    contraction with the weight, plus bias."""
    n, c = input.shape[:2]
    out_c, c_per_group, kh, kw = weight.shape
    groups = c // c_per_group if c_per_group else 1
    offset_groups = offset.shape[1] // (2 * kh * kw) if kh * kw else 1
    out_h, out_w = offset.shape[-2:]
    c_per_offset_group = c // offset_groups
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    samples = []  # per image: (c, kh, kw, out_h, out_w)
    for b in range(n):
        per_channel = [[[None] * kw for _ in range(kh)] for _ in range(c)]
        for g in range(offset_groups):
            chans = slice(g * c_per_offset_group, (g + 1) * c_per_offset_group)
            for i in range(kh):
                for j in range(kw):
                    k = i * kw + j
                    grid = []
                    for oh in range(out_h):
                        row = []
                        for ow in range(out_w):
                            y = oh * sh - ph + i * dh + offset[b, g * 2 * kh * kw + 2 * k, oh, ow]
                            x = ow * sw - pw + j * dw + offset[b, g * 2 * kh * kw + 2 * k + 1, oh, ow]
                            v = _bilinear_zero_padded(input[b, chans], y, x)
                            if mask is not None:
                                v = v * mask[b, g * kh * kw + k, oh, ow]
                            row.append(v)
                        grid.append(torch.stack(row, dim=-1))
                    tap = torch.stack(grid, dim=-2)
                    for ci in range(c_per_offset_group):
                        per_channel[g * c_per_offset_group + ci][i][j] = tap[ci]
        samples.append(
            torch.stack([torch.stack([torch.stack(r) for r in ch]) for ch in per_channel])
        )
    if not samples or c == 0 or kh * kw == 0 or out_h * out_w == 0:
        out = input.new_zeros((n, out_c, out_h, out_w))
    else:
        cols = torch.stack(samples)  # (n, c, kh, kw, out_h, out_w)
        outs = []
        oc_per_group = out_c // groups
        for gr in range(groups):
            w = weight[gr * oc_per_group : (gr + 1) * oc_per_group]
            col = cols[:, gr * c_per_group : (gr + 1) * c_per_group]
            outs.append(torch.einsum("ocij,bcijhw->bohw", w, col))
        out = torch.cat(outs, dim=1)
    if bias is not None:
        out = out + bias.view(1, -1, 1, 1)
    return out



def make_case(batch=2, in_c=4, out_c=6, size=(7, 6), kernel=(3, 3), stride=(1, 1),
              padding=(0, 0), dilation=(1, 1), groups=1, offset_groups=1, use_mask=True,
              use_bias=True, offset_scale=2.0, dtype=torch.float64, seed=0):
    """Values on a grid exact in every float type (eighths), so one float64 reference of a
    case serves every dtype; offsets are odd sixteenths, so no sample lands on a pixel's
    row or column, where the offset gradient is one-sided (test_gradients_at_pixels)."""
    gen = torch.Generator().manual_seed(seed)
    kh, kw = kernel
    out_h = (size[0] + 2 * padding[0] - (dilation[0] * (kh - 1) + 1)) // stride[0] + 1
    out_w = (size[1] + 2 * padding[1] - (dilation[1] * (kw - 1) + 1)) // stride[1] + 1

    def eighths(low, high, *shape):
        return torch.randint(low, high + 1, shape, generator=gen).to(dtype) / 8

    offset_shape = (batch, 2 * offset_groups * kh * kw, out_h, out_w)
    steps = round(8 * offset_scale)
    offset = (2 * torch.randint(-steps, steps + 1, offset_shape, generator=gen) + 1).to(dtype) / 16
    return dict(
        input=eighths(-16, 16, batch, in_c, *size),
        offset=offset if steps else torch.zeros(offset_shape, dtype=dtype),
        weight=eighths(-8, 8, out_c, in_c // groups, kh, kw),
        bias=eighths(-8, 8, out_c) if use_bias else None,
        stride=stride,
        padding=padding,
        dilation=dilation,
        mask=eighths(0, 8, batch, offset_groups * kh * kw, out_h, out_w) if use_mask else None,
    )


CASES = {
    "plain": dict(),
    "no_mask": dict(use_mask=False),
    "no_bias": dict(use_bias=False),
    "groups": dict(in_c=4, out_c=6, groups=2),
    "offset_groups": dict(in_c=6, offset_groups=3),
    "groups_and_offset_groups": dict(in_c=4, out_c=4, groups=2, offset_groups=4, use_mask=False),
    "stride_pad_dilation": dict(size=(9, 8), stride=(2, 3), padding=(2, 1), dilation=(2, 1)),
    "rect_kernel": dict(kernel=(2, 3), padding=(1, 0)),
    "one_by_one": dict(kernel=(1, 1), offset_scale=0.7),
    "zero_offsets": dict(offset_scale=0.0),
    "offsets_outside_image": dict(offset_scale=12.0),
    "single_pixel_image": dict(size=(1, 1), kernel=(1, 1), padding=(1, 1)),
}
# zero offsets sample on pixels: their gradient is test_gradients_at_pixels'
GRADIENT_CASES = ["plain", "no_mask", "groups_and_offset_groups", "stride_pad_dilation",
                  "rect_kernel", "offsets_outside_image"]
LEAVES = ("input", "weight", "offset", "mask", "bias")


def _call(fn, case):
    return fn(case["input"], case["offset"], case["weight"], case["bias"], stride=case["stride"],
              padding=case["padding"], dilation=case["dilation"], mask=case["mask"])


def _op_args(case):
    """The raw op's arguments: input, weight, offset, mask, bias, the ints, use_mask."""
    mask = case["mask"] if case["mask"] is not None else case["input"].new_zeros(case["input"].shape[0], 1)
    bias = case["bias"] if case["bias"] is not None else case["input"].new_zeros(case["weight"].shape[0])
    kh, kw = case["weight"].shape[-2:]
    return (case["input"], case["weight"], case["offset"], mask, bias, *case["stride"],
            *case["padding"], *case["dilation"], case["input"].shape[1] // case["weight"].shape[1],
            case["offset"].shape[1] // (2 * kh * kw), case["mask"] is not None)


def _in(case, dtype):
    return {k: v.to(dtype) if isinstance(v, torch.Tensor) else v for k, v in case.items()}


@functools.cache
def expected(name):
    """(case, output, grad_output, {leaf: gradient}) of the float64 reference, computed once."""
    case = make_case(**CASES[name])
    leaves = {k: case[k].clone().requires_grad_() for k in LEAVES if case[k] is not None}
    if case["bias"] is None:  # the raw op always takes a bias: zeros, whose gradient is still defined
        leaves["bias"] = torch.zeros(case["weight"].shape[0], dtype=torch.float64, requires_grad=True)
    out = _call(reference, dict(case, **leaves))
    grad = torch.randint(-8, 9, out.shape, generator=torch.Generator().manual_seed(1)).double() / 8
    grads = torch.autograd.grad(out, list(leaves.values()), grad)
    return case, out.detach(), grad, dict(zip(leaves, grads))


def assert_matches(got, want, dtype, what=""):
    """backend_tolerance(dtype), its atol scaled by the largest expected value."""
    tol = backend_tolerance(dtype)
    scale = max(1.0, want.abs().max().item()) if want.numel() else 1.0
    torch.testing.assert_close(got.double(), want, rtol=tol["rtol"], atol=tol["atol"] * scale, equal_nan=True,
                               msg=lambda m: f"{what}: {m}")


def _offsets_to(targets, h, w):
    """Offsets for a 1x1 kernel, stride 1, no padding that sample at the given (y, x) points."""
    oy = torch.tensor([[y for y, _ in row] for row in targets], dtype=torch.float64)
    ox = torch.tensor([[x for _, x in row] for row in targets], dtype=torch.float64)
    base_y = torch.arange(h, dtype=torch.float64)[:, None].expand(h, w)
    base_x = torch.arange(w, dtype=torch.float64)[None, :].expand(h, w)
    return torch.stack([oy - base_y, ox - base_x])[None]


def _bad(**changes):
    case = make_case(batch=2, in_c=4, out_c=6, size=(5, 5), dtype=torch.float32)
    case.update(changes)
    return case


BAD_FUNCTIONAL = {
    "input_rank": (lambda: _bad(input=torch.randn(4, 5, 5)), ValueError, "input must be a 4-D"),
    # read as a 4 x 9 kernel, as torchvision reads it: the offset channels no longer fit
    "weight_rank": (lambda: _bad(weight=torch.randn(6, 4, 9)), RuntimeError, "offset tensor at dimension 1"),
    "weight_rank_1": (lambda: _bad(weight=torch.randn(6)), ValueError, "weight must be a 4-D"),
    "weight_rank_0": (lambda: _bad(weight=torch.tensor(1.0)), IndexError, "weight must be a 4-D"),
    "offset_rank": (lambda: _bad(offset=torch.randn(2, 18, 9)), RuntimeError, "offset must be 4-D"),
    "offset_rank_1": (lambda: _bad(offset=torch.randn(18)), IndexError, "offset must be a 4-D"),
    "offset_too_few_channels": (lambda: _bad(offset=torch.randn(2, 17, 3, 3)), RuntimeError, "offset"),
    "offset_channels": (lambda: _bad(offset=torch.randn(2, 54, 3, 3)), RuntimeError, "offset_groups"),
    "offset_spatial": (lambda: _bad(offset=torch.randn(2, 18, 4, 3)), RuntimeError, "offset spatial size"),
    "offset_batch": (lambda: _bad(offset=torch.randn(3, 18, 3, 3)), RuntimeError, r"offset\.shape\[0\]"),
    "mask_channels": (lambda: _bad(mask=torch.rand(2, 8, 3, 3)), RuntimeError, r"mask\.shape\[1\]"),
    "mask_rank": (lambda: _bad(mask=torch.rand(2, 9, 3)), RuntimeError, "mask must be 4-D"),
    "mask_batch": (lambda: _bad(mask=torch.rand(1, 9, 3, 3)), RuntimeError, r"mask\.shape\[0\]"),
    "mask_spatial": (lambda: _bad(mask=torch.rand(2, 9, 3, 2)), RuntimeError, "mask spatial size"),
    "weight_channels": (lambda: _bad(weight=torch.randn(6, 3, 3, 3)), RuntimeError, "groups"),
    "out_channels_not_divisible": (lambda: _bad(weight=torch.randn(5, 2, 3, 3), bias=torch.randn(5)),
                                   RuntimeError, "output channels"),
    "bias_shape": (lambda: _bad(bias=torch.randn(5)), RuntimeError, "bias must have shape"),
    "dtype_mismatch": (lambda: _bad(weight=torch.randn(6, 4, 3, 3, dtype=torch.float64)), RuntimeError,
                       "weight to have the same dtype"),
    "integer_input": (lambda: _bad(input=torch.ones(2, 4, 5, 5, dtype=torch.int64),
                                   weight=torch.ones(6, 4, 3, 3, dtype=torch.int64),
                                   offset=torch.zeros(2, 18, 3, 3, dtype=torch.int64),
                                   mask=torch.ones(2, 9, 3, 3, dtype=torch.int64),
                                   bias=torch.ones(6, dtype=torch.int64)), RuntimeError, "floating point"),
    "zero_stride": (lambda: _bad(stride=(0, 1)), RuntimeError, "stride_h must be a positive"),
    "negative_dilation": (lambda: _bad(dilation=(1, -1)), RuntimeError, "dilation_w must be a positive"),
    "negative_padding": (lambda: _bad(padding=(-1, 0)), RuntimeError, "padding"),
    "kernel_larger_than_input": (lambda: _bad(input=torch.randn(2, 4, 2, 5)), RuntimeError, "larger than the padded input"),
    "meta_device_offset": (lambda: _bad(offset=torch.randn(2, 18, 3, 3, device="meta")), RuntimeError,
                           "offset must be a CPU tensor on the same device as input"),
}


class TestDeformConv2d:
    # ------------------------------------------------------ every backend
    @pytest.mark.parametrize("backend", BACKENDS, ids=str)
    @pytest.mark.parametrize("dtype", ALL_FLOATS, ids=str)
    @pytest.mark.parametrize("name", sorted(CASES))
    def test_forward_matches_reference(self, backend, dtype, name):
        backend.skip_unless_runs(dtype, "deform_conv2d")
        case, want, _, _ = expected(name)
        out = backend.call("deform_conv2d", *_op_args(_in(case, dtype)))
        assert out.dtype == dtype
        assert_matches(out, want, dtype, "output")

    @pytest.mark.parametrize("backend", BACKENDS, ids=str)
    @pytest.mark.parametrize("dtype", ALL_FLOATS, ids=str)
    @pytest.mark.parametrize("name", GRADIENT_CASES)
    def test_backward_is_the_gradient_of_the_reference(self, backend, dtype, name):
        backend.skip_unless_runs(dtype, "_deform_conv2d_backward")
        case, _, grad, want = expected(name)
        args = _op_args(_in(case, dtype))
        got = backend.call("_deform_conv2d_backward", grad.to(dtype), *args)
        for leaf, g in zip(LEAVES, got):
            if leaf in want:  # without a mask, the mask's gradient is not defined
                assert g.dtype == dtype and g.shape == want[leaf].shape, leaf
                assert_matches(g, want[leaf], dtype, f"grad of {leaf}")

    @pytest.mark.parametrize("backend", BACKENDS, ids=str)
    def test_non_contiguous_inputs(self, backend):
        backend.skip_unless_runs(torch.float32, "deform_conv2d")
        case, want, _, _ = expected("groups_and_offset_groups")
        case = _in(case, torch.float32)
        strided = dict(case)
        for key in ("input", "offset", "weight"):  # same values, transposed storage
            strided[key] = case[key].transpose(-1, -2).contiguous().transpose(-1, -2)
            assert not strided[key].is_contiguous()
        strided["bias"] = torch.stack([case["bias"], case["bias"]], dim=1)[:, 0]
        assert not strided["bias"].is_contiguous()
        assert_matches(backend.call("deform_conv2d", *_op_args(strided)), want, torch.float32, "output")

    @pytest.mark.parametrize("backend", BACKENDS, ids=str)
    def test_empty_batch_gives_an_empty_output_and_zero_grads(self, backend):
        backend.skip_unless_runs(torch.float32, "deform_conv2d")
        args = _op_args(make_case(batch=0, dtype=torch.float32))
        out = backend.call("deform_conv2d", *args)
        assert out.shape == (0, 6, 5, 4)
        grads = backend.call("_deform_conv2d_backward", out, *args)
        assert [g.shape for g in grads] == [t.shape for t in args[:5]]
        assert not any(g.any() for g in grads)

    @pytest.mark.parametrize("backend", BACKENDS, ids=str)
    def test_nan_offsets_give_nan_where_they_sample_and_nowhere_else(self, backend):
        backend.skip_unless_runs(torch.float32, "deform_conv2d")
        case = make_case(batch=1, in_c=2, out_c=2, size=(4, 4), kernel=(1, 1), offset_scale=0.5,
                         dtype=torch.float32)
        case["offset"][0, 0, 1, 2] = math.nan
        args = _op_args(case)
        out = backend.call("deform_conv2d", *args)
        expected_nan = torch.zeros_like(out, dtype=torch.bool)
        expected_nan[0, :, 1, 2] = True
        assert torch.equal(out.isnan(), expected_nan)
        g_input, _, g_offset, g_mask, _ = backend.call("_deform_conv2d_backward", torch.ones_like(out), *args)
        assert not g_input.isnan().any()
        assert g_offset[0, :, 1, 2].isnan().all() and g_offset.isnan().sum() == 2
        assert g_mask[0, 0, 1, 2].isnan() and g_mask.isnan().sum() == 1

    @pytest.mark.parametrize("backend", BACKENDS, ids=str)
    def test_samples_on_and_far_beyond_the_border_match_the_cpu_kernels(self, backend):
        # On the border (-1 and height are outside), just inside it, and 1e30 away (a value
        # whose floor no integer type holds): the output and every gradient as the CPU gives.
        backend.skip_unless_runs(torch.float32, "deform_conv2d")
        h, w = 3, 4
        targets = [[(-1.0, 0.0), (-0.5, -0.5), (0.0, 0.0), (2.0, 3.0)],
                   [(1e30, 1.0), (2.0, 3.0), (2.5, 1.0), (3.0, 3.0)],
                   [(1.25, 2.75), (-0.999, 3.999), (2.0, -1.0), (1.0, -1e30)]]
        g = torch.Generator().manual_seed(5)
        case = dict(input=torch.randn(1, 2, h, w, generator=g), offset=_offsets_to(targets, h, w).float(),
                    weight=torch.randn(3, 2, 1, 1, generator=g), bias=torch.randn(3, generator=g),
                    stride=(1, 1), padding=(0, 0), dilation=(1, 1), mask=torch.rand(1, 1, h, w, generator=g))
        args = _op_args(case)
        want = torch.ops.opforge.deform_conv2d(*args)
        grad = torch.randn(want.shape, generator=g)
        assert_matches(backend.call("deform_conv2d", *args), want.double(), torch.float32, "output")
        got = backend.call("_deform_conv2d_backward", grad, *args)
        for name, mine, cpu in zip(LEAVES, got, torch.ops.opforge._deform_conv2d_backward(grad, *args)):
            assert_matches(mine, cpu.double(), torch.float32, f"grad {name}")

    @pytest.mark.parametrize("backend", BACKENDS, ids=str)
    @pytest.mark.parametrize("index, value, message", [
        (11, 0, "groups must be a positive"),
        (12, 0, "offset_groups must be a positive"),
        (12, -3, "offset_groups must be a positive"),
        (5, 2**40, "stride_h must be a positive integer below 2"),
        (7, 2**62, "padding"),
    ])
    def test_bad_integer_arguments_name_the_argument(self, backend, index, value, message):
        backend.skip_unless_runs(torch.float32, "deform_conv2d")
        args = list(_op_args(_bad()))
        args[index] = value
        with pytest.raises(RuntimeError, match=f"deform_conv2d: .*{message}|{message}"):
            backend.call("deform_conv2d", *args)

    @pytest.mark.parametrize("backend", BACKENDS, ids=str)
    def test_backward_rejects_a_grad_of_the_wrong_shape(self, backend):
        backend.skip_unless_runs(torch.float32, "_deform_conv2d_backward")
        with pytest.raises(RuntimeError, match="grad must have the output shape"):
            backend.call("_deform_conv2d_backward", torch.randn(2, 6, 3, 4), *_op_args(_bad()))

    # -------------------------------------------------- the CPU build only
    def test_sampling_exactly_on_and_beyond_the_border(self):
        h, w = 3, 4
        points = [(-1.0, 0.0), (-0.5, -0.5), (0.0, 0.0), (2.0, 3.0), (2.5, 1.0), (3.0, 3.0)]
        targets = [points[:4], points[2:], [(1.25, 2.75), (-0.999, 3.999), (2.0, -1.0), (1.0, 4.0)]]
        offset = _offsets_to(targets, h, w)
        case = dict(input=torch.randn(1, 2, h, w, dtype=torch.float64), offset=offset,
                    weight=torch.randn(3, 2, 1, 1, dtype=torch.float64), bias=None, stride=(1, 1),
                    padding=(0, 0), dilation=(1, 1), mask=torch.rand(1, 1, h, w, dtype=torch.float64))
        out = _call(deform_conv2d, case)
        torch.testing.assert_close(out, _call(reference, case))
        # (-1, 0) and (3, 3) are outside: exactly zero output there.
        assert torch.all(out[0, :, 0, 0] == 0) and torch.all(out[0, :, 1, 3] == 0)

    @pytest.mark.parametrize("where", ["zero_offsets", "border"])
    def test_gradients_at_pixels(self, where):
        # Samples on a pixel's row or column, and on and past the border: the offset gradient
        # there is the one-sided one the reference's floor() picks.
        if where == "border":
            h, w = 3, 4
            targets = [[(-1.0, 0.0), (-0.5, -0.5), (0.0, 0.0), (2.0, 3.0)],
                       [(0.0, 0.0), (2.0, 3.0), (2.5, 1.0), (3.0, 3.0)],
                       [(1.25, 2.75), (-0.999, 3.999), (2.0, -1.0), (1.0, 4.0)]]
            case = dict(input=torch.randn(1, 2, h, w, dtype=torch.float64), offset=_offsets_to(targets, h, w),
                        weight=torch.randn(3, 2, 1, 1, dtype=torch.float64), bias=torch.randn(3, dtype=torch.float64),
                        stride=(1, 1), padding=(0, 0), dilation=(1, 1),
                        mask=torch.rand(1, 1, h, w, dtype=torch.float64))
        else:
            case = make_case(**CASES[where])
        ours = {k: case[k].clone().requires_grad_(True) for k in LEAVES}
        theirs = {k: case[k].clone().requires_grad_(True) for k in LEAVES}
        out = _call(deform_conv2d, dict(case, **ours))
        grad = torch.randn_like(out)
        got = torch.autograd.grad(out, list(ours.values()), grad)
        want = torch.autograd.grad(_call(reference, dict(case, **theirs)), list(theirs.values()), grad)
        for key, g, w in zip(LEAVES, got, want):
            torch.testing.assert_close(g, w, msg=f"grad of {key}")

    @pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
    def test_reduced_precision_computes_in_float32(self, dtype):
        case = make_case(dtype=dtype)
        out = _call(deform_conv2d, case)
        assert out.dtype == dtype
        upcast = {k: v.float() if isinstance(v, torch.Tensor) else v for k, v in case.items()}
        torch.testing.assert_close(out, _call(deform_conv2d, upcast).to(dtype))

    def test_integer_offsets_reduce_to_plain_convolution(self):
        case = make_case(offset_scale=0.0, size=(8, 8), padding=(1, 1), stride=(2, 1), groups=2)
        expected = torch.nn.functional.conv2d(case["input"], case["weight"], case["bias"], stride=(2, 1),
                                              padding=(1, 1), groups=2)
        case["mask"] = None
        torch.testing.assert_close(_call(deform_conv2d, case), expected)

    def test_batch_split_into_chunks_matches_per_image(self):
        # Large enough that the kernel's column buffer (2**23 elements) holds 2 images,
        # so a batch of 3 runs as a full chunk and a short one.
        case = make_case(batch=3, in_c=16, out_c=4, size=(155, 155), dtype=torch.float32, offset_scale=1.0)
        for key in ("input", "offset", "weight", "mask", "bias"):
            case[key].requires_grad_(True)
        out = _call(deform_conv2d, case)
        grad = torch.randn_like(out)
        grads = torch.autograd.grad(out, [case[k] for k in ("input", "offset", "mask", "weight")], grad)
        for b in range(3):
            one = dict(case, input=case["input"][b:b + 1], offset=case["offset"][b:b + 1],
                       mask=case["mask"][b:b + 1])
            out_b = _call(deform_conv2d, one)
            torch.testing.assert_close(out[b:b + 1], out_b)
            g_in, g_off, g_mask = torch.autograd.grad(out_b, [one["input"], one["offset"], one["mask"]],
                                                      grad[b:b + 1])
            torch.testing.assert_close(grads[0][b:b + 1], g_in)
            torch.testing.assert_close(grads[1][b:b + 1], g_off)
            torch.testing.assert_close(grads[2][b:b + 1], g_mask)

    @pytest.mark.parametrize("use_mask", [True, False])
    def test_gradcheck(self, use_mask):
        case = make_case(batch=2, in_c=4, out_c=2, size=(5, 4), kernel=(2, 2), groups=2,
                         offset_groups=2, padding=(1, 0), stride=(1, 2), use_mask=use_mask,
                         offset_scale=1.3, seed=3)
        leaves = [k for k in ("input", "offset", "weight", "mask", "bias") if case[k] is not None]
        tensors = [case[k].requires_grad_(True) for k in leaves]

        def fn(*args):
            return _call(deform_conv2d, dict(case, **dict(zip(leaves, args))))

        assert torch.autograd.gradcheck(fn, tensors, eps=1e-6, atol=1e-5)

    def test_double_backward_raises_clear_error(self):
        case = make_case(batch=1, in_c=2, out_c=2, size=(4, 4), kernel=(2, 2))
        x = case["input"].requires_grad_(True)
        out = _call(deform_conv2d, case)
        (g,) = torch.autograd.grad(out.sum(), x, create_graph=True)
        with pytest.raises(RuntimeError, match="deform_conv2d supports first-order gradients only"):
            g.sum().backward()

    @pytest.mark.parametrize("use_mask", [True, False])
    def test_opcheck_forward(self, use_mask):
        case = make_case(batch=2, in_c=4, out_c=2, size=(5, 5), groups=2, offset_groups=2,
                         stride=(2, 1), padding=(1, 1), use_mask=use_mask)
        args = list(_op_args(case))
        for i in range(5):
            if i != 3 or use_mask:
                args[i] = args[i].requires_grad_(True)
        torch.library.opcheck(
            torch.ops.opforge.deform_conv2d.default, tuple(args),
            test_utils=("test_schema", "test_autograd_registration", "test_faketensor",
                        "test_aot_dispatch_dynamic"),
        )

    def test_opcheck_backward(self):
        case = make_case(batch=2, size=(5, 5))
        args = _op_args(case)
        grad = torch.randn(2, 6, 3, 3, dtype=torch.float64)
        torch.library.opcheck(torch.ops.opforge._deform_conv2d_backward.default, (grad, *args),
                              test_utils=("test_schema", "test_faketensor"))

    def test_torch_compile_fullgraph_dynamic(self):
        module = DeformConv2d(4, 6, 3, padding=1, groups=2).double()
        compiled = torch.compile(module, fullgraph=True, backend="aot_eager", dynamic=True)
        for batch, size in ((2, 6), (3, 5)):
            x = torch.randn(batch, 4, size, size, dtype=torch.float64, requires_grad=True)
            offset = torch.randn(batch, 18, size, size, dtype=torch.float64)
            mask = torch.rand(batch, 9, size, size, dtype=torch.float64)
            out = compiled(x, offset, mask)
            torch.testing.assert_close(out, module(x, offset, mask))
            (g,) = torch.autograd.grad(out.sum(), x)
            (g_eager,) = torch.autograd.grad(module(x, offset, mask).sum(), x)
            torch.testing.assert_close(g, g_eager)

    def test_torch_export(self):
        module = DeformConv2d(4, 3, (3, 2), stride=2, padding=1, dilation=(1, 2))
        x = torch.randn(2, 4, 9, 8)
        offset = torch.randn(2, 12, 5, 4)
        exported = torch.export.export(module, (x, offset))
        assert any(n.target is torch.ops.opforge.deform_conv2d.default for n in exported.graph.nodes)
        torch.testing.assert_close(exported.module()(x, offset), module(x, offset))

    def test_autocast_computes_in_float32_and_returns_input_dtype(self):
        case = make_case(dtype=torch.bfloat16)
        weight = case["weight"].float()  # parameters usually stay float32 under autocast
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = deform_conv2d(case["input"], case["offset"], weight, case["bias"].float(), mask=case["mask"])
        assert out.dtype == torch.bfloat16
        expected = deform_conv2d(case["input"].float(), case["offset"].float(), weight, case["bias"].float(),
                                 mask=case["mask"].float())
        torch.testing.assert_close(out, expected.to(torch.bfloat16))

    def test_autocast_leaves_float64_alone(self):
        case = make_case()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = _call(deform_conv2d, case)
        assert out.dtype == torch.float64
        torch.testing.assert_close(out, _call(deform_conv2d, case))

    def test_module_matches_functional_and_repr(self):
        m = DeformConv2d(4, 6, (3, 2), stride=(2, 1), padding=1, dilation=2, groups=2, bias=False)
        assert m.weight.shape == (6, 2, 3, 2) and m.bias is None
        assert repr(m) == ("DeformConv2d(4, 6, kernel_size=(3, 2), stride=(2, 1), padding=(1, 1), "
                           "dilation=(2, 2), groups=2, bias=False)")
        x = torch.randn(1, 4, 8, 8)
        offset = torch.randn(1, 12, 3, 8)
        torch.testing.assert_close(m(x, offset), deform_conv2d(x, offset, m.weight, stride=(2, 1),
                                                               padding=(1, 1), dilation=(2, 2)))
        bound = 1 / math.sqrt(2 * 3 * 2)
        with_bias = DeformConv2d(4, 6, 3)
        assert with_bias.bias.abs().max() <= 1 / math.sqrt(4 * 9) and m.weight.abs().max() <= bound

    @pytest.mark.parametrize("kwargs, message", [
        (dict(in_channels=3, out_channels=4, kernel_size=3, groups=2), "in_channels must be divisible by groups"),
        (dict(in_channels=4, out_channels=3, kernel_size=3, groups=2), "out_channels must be divisible by groups"),
    ])
    def test_module_rejects_bad_groups(self, kwargs, message):
        with pytest.raises(ValueError, match=message):
            DeformConv2d(**kwargs)

    @pytest.mark.parametrize("name", sorted(BAD_FUNCTIONAL))
    def test_bad_input_raises_error_naming_the_argument(self, name):
        make, error, message = BAD_FUNCTIONAL[name]
        with pytest.raises(error, match=message):
            _call(deform_conv2d, make())


# ---------------------------------------------------- torchvision-compatibility cases
def _tv_inputs(dtype, batch=2, in_c=4, out_c=6, groups=1, offset_groups=1, kernel=(3, 3),
               stride=(1, 1), padding=(0, 0), dilation=(1, 1), size=(7, 8), mask=False, bias=True,
               memory="contiguous"):
    from tv_cases import layout

    kh, kw = kernel
    out_h = (size[0] + 2 * padding[0] - (dilation[0] * (kh - 1) + 1)) // stride[0] + 1
    out_w = (size[1] + 2 * padding[1] - (dilation[1] * (kw - 1) + 1)) // stride[1] + 1
    x = layout(torch.rand(batch, in_c, *size, dtype=dtype), memory)
    offset = layout(torch.randn(batch, 2 * offset_groups * kh * kw, out_h, out_w, dtype=dtype), memory)
    weight = torch.randn(out_c, in_c // max(groups, 1), kh, kw, dtype=dtype)
    b = torch.randn(out_c, dtype=dtype) if bias else None
    m = torch.rand(batch, offset_groups * kh * kw, out_h, out_w, dtype=dtype) if mask else None
    return x, offset, weight, b, m


def _tv_call(stride=(1, 1), padding=(0, 0), dilation=(1, 1)):
    def call(ns, a):
        x, offset, weight, bias, mask = a
        return ns.deform_conv2d(x, offset, weight, bias, stride=stride, padding=padding,
                                dilation=dilation, mask=mask)
    return call


def torchvision_cases():
    """deform_conv2d's and DeformConv2d's cases for the torchvision differential suite;
    torchvision_compat/tv_cases.py calls this, with its helpers imported."""
    from tv_cases import FLOAT_DTYPES, Case, crashing_torchvision

    geometries = {
        "plain": {},
        "stride-pad-dilation": dict(stride=(2, 1), padding=(1, 2), dilation=(1, 2)),
        "groups": dict(in_c=4, out_c=6, groups=2),
        "offset-groups": dict(in_c=4, offset_groups=2),
        "kernel-1x2": dict(kernel=(1, 2)),
    }
    for (gname, geo), dtype, mask, bias in itertools.product(
            geometries.items(), FLOAT_DTYPES, (False, True), (False, True)):
        conv = {k: geo[k] for k in ("stride", "padding", "dilation") if k in geo}
        yield Case(
            "deform_conv2d", f"{gname}-{dtype}-mask{mask}-bias{bias}",
            lambda geo=geo, dtype=dtype, mask=mask, bias=bias: _tv_inputs(dtype, mask=mask, bias=bias, **geo),
            _tv_call(**conv), grad=dtype == torch.float64 and gname in ("plain", "groups", "offset-groups"),
        )
    for memory in ("channels_last", "strided"):
        yield Case("deform_conv2d", f"layout-{memory}",
                   lambda memory=memory: _tv_inputs(torch.float32, mask=True, memory=memory), _tv_call())
    yield Case("deform_conv2d", "int-stride-padding",
               lambda: _tv_inputs(torch.float32, stride=(2, 2), padding=(1, 1)), _tv_call(2, 1, 1))
    yield Case("deform_conv2d", "float16", lambda: _tv_inputs(torch.float16, mask=True), _tv_call())
    degenerate = {
        "zero-batch": dict(batch=0),
        "zero-out-channels": dict(out_c=0),
    }
    for name, geo in degenerate.items():
        yield Case("deform_conv2d", name, lambda geo=geo: _tv_inputs(torch.float32, **geo), _tv_call())

    def bad(**changes):
        def make():
            x, offset, weight, b, m = _tv_inputs(torch.float32, mask=True)
            values = dict(x=x, offset=offset, weight=weight, b=b, m=m)
            values.update({k: v() for k, v in changes.items()})
            return values["x"], values["offset"], values["weight"], values["b"], values["m"]
        return make

    malformed = {
        "weight-0d": bad(weight=lambda: torch.tensor(1.0)),
        "weight-1d": bad(weight=lambda: torch.rand(6)),
        "weight-3d": bad(weight=lambda: torch.rand(6, 4, 3)),
        "input-3d": bad(x=lambda: torch.rand(4, 7, 8)),
        "offset-1d": bad(offset=lambda: torch.rand(18)),
        "offset-3d": bad(offset=lambda: torch.rand(18, 5, 6)),
        "offset-too-few-channels": bad(offset=lambda: torch.rand(2, 5, 5, 6)),
        "offset-channels-not-multiple": bad(offset=lambda: torch.rand(2, 19, 5, 6)),
        "offset-batch": bad(offset=lambda: torch.rand(1, 18, 5, 6)),
        "offset-spatial": bad(offset=lambda: torch.rand(2, 18, 4, 6)),
        "kernel-empty": bad(weight=lambda: torch.rand(6, 4, 0, 3)),
        "weight-zero-in-channels": bad(weight=lambda: torch.rand(6, 0, 3, 3)),
        "groups-not-dividing": bad(weight=lambda: torch.rand(6, 3, 3, 3)),
        "out-channels-not-divisible": bad(weight=lambda: torch.rand(5, 2, 3, 3), b=lambda: torch.rand(5)),
        "mask-channels": bad(m=lambda: torch.rand(2, 8, 5, 6)),
        "mask-3d": bad(m=lambda: torch.rand(9, 5, 6)),
        "bias-length": bad(b=lambda: torch.rand(3)),
        "weight-dtype": bad(weight=lambda: torch.rand(6, 4, 3, 3, dtype=torch.float64)),
        "integer-tensors": lambda: tuple(t.int() if t is not None else None
                                         for t in _tv_inputs(torch.float32, mask=True)),
        "kernel-larger-than-input": bad(x=lambda: torch.rand(2, 4, 2, 2)),
    }
    for name, make in malformed.items():
        yield Case("deform_conv2d", name, make, _tv_call())
    yield from crashing_torchvision(
        (Case("deform_conv2d", name, lambda: _tv_inputs(torch.float32), _tv_call(**conv))
         for name, conv in {"stride-negative": dict(stride=-1), "padding-negative": dict(padding=-1),
                            "dilation-zero": dict(dilation=0), "stride-three-values": dict(stride=(1, 1, 1)),
                            "stride-zero": dict(stride=0)}.items()),
        {"stride-zero": "RuntimeError"},  # torchvision: SIGFPE (division by zero)
    )
    yield Case("deform_conv2d", "module", lambda: _tv_inputs(torch.float64, in_c=4, mask=True)[:2] + (
        torch.rand(2, 9, 5, 6, dtype=torch.float64),), _tv_module, grad=True)
    yield Case("deform_conv2d", "module-repr", lambda: (),
               lambda ns, a: repr(ns.DeformConv2d(4, 6, 3, stride=2, padding=1, dilation=2, groups=2, bias=False)))
    for name, kwargs in {"module-groups-in": dict(in_channels=3, out_channels=4, kernel_size=3, groups=2),
                         "module-groups-out": dict(in_channels=4, out_channels=3, kernel_size=3, groups=2),
                         "module-groups-zero": dict(in_channels=4, out_channels=4, kernel_size=3, groups=0)}.items():
        yield Case("deform_conv2d", name, lambda: (), lambda ns, a, kwargs=kwargs: ns.DeformConv2d(**kwargs))


def _tv_module(ns, a):
    torch.manual_seed(7)  # the same initial parameters in both namespaces
    module = ns.DeformConv2d(4, 6, 3).double()
    return module(*a)


def test_products_split_by_columns_on_two_threads_match_one_thread():
    # b1, 64 -> 64 channels, 32x32: the CPU kernel's products (columns = weight @ im2col, and
    # the column gradient) are large enough to go by column blocks on two threads; one thread
    # computes each in one piece.
    case = make_case(batch=1, in_c=64, out_c=64, size=(32, 32), padding=(1, 1), dtype=torch.float32,
                     offset_scale=1.0)
    for key in ("input", "offset", "weight", "mask", "bias"):
        case[key].requires_grad_(True)
    keys = ("input", "offset", "mask", "weight", "bias")
    results = []
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            out = _call(deform_conv2d, case)
            results.append((out, torch.autograd.grad(out, [case[k] for k in keys], torch.ones_like(out))))
    finally:
        torch.set_num_threads(threads)
    (one, one_grads), (two, two_grads) = results
    torch.testing.assert_close(two, one)
    for key, a, b in zip(keys, two_grads, one_grads):
        torch.testing.assert_close(a, b, msg=key)
