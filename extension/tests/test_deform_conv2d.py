"""deform_conv2d: CPU kernel vs a slow Python reference, gradients, registrations, bad input."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opforge_ops import DeformConv2d, deform_conv2d

# --- reference -----------------------------------------------------------------


def _bilinear(planes: torch.Tensor, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Bilinear sample of every plane at (y, x); neighbours outside the image count as 0,
    and a point at or beyond one pixel outside samples 0 as a whole."""
    height, width = planes.shape[-2:]
    yv, xv = float(y.detach()), float(x.detach())
    if math.isnan(yv) or math.isnan(xv):
        return planes.new_full(planes.shape[:-2], math.nan)
    if yv <= -1 or yv >= height or xv <= -1 or xv >= width:
        return planes.new_zeros(planes.shape[:-2])
    y0, x0 = math.floor(yv), math.floor(xv)
    ly, lx = y - y0, x - x0  # tensors, so autograd reaches the offsets
    out = planes.new_zeros(planes.shape[:-2])
    for yy, wy in ((y0, 1 - ly), (y0 + 1, ly)):
        for xx, wx in ((x0, 1 - lx), (x0 + 1, lx)):
            if 0 <= yy < height and 0 <= xx < width:
                out = out + wy * wx * planes[..., yy, xx]
    return out


def reference_deform_conv2d(input, offset, weight, bias=None, stride=(1, 1), padding=(0, 0),
                            dilation=(1, 1), mask=None):
    """Deformable convolution written point by point, straight from the definition."""
    n, c, _, _ = input.shape
    out_c, c_per_group, kh, kw = weight.shape
    groups = c // c_per_group
    offset_groups = offset.shape[1] // (2 * kh * kw)
    out_h, out_w = offset.shape[-2:]
    c_per_offset_group = c // offset_groups
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    # columns[b][c][i][j] is the (out_h, out_w) map of samples for kernel tap (i, j).
    samples = []
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
                            v = _bilinear(input[b, chans], y, x)
                            if mask is not None:
                                v = v * mask[b, g * kh * kw + k, oh, ow]
                            row.append(v)
                        grid.append(torch.stack(row, dim=-1))
                    tap = torch.stack(grid, dim=-2)  # (c_per_offset_group, out_h, out_w)
                    for ci in range(c_per_offset_group):
                        per_channel[g * c_per_offset_group + ci][i][j] = tap[ci]
        samples.append(torch.stack([torch.stack([torch.stack(r) for r in ch]) for ch in per_channel]))
    cols = torch.stack(samples)  # (n, c, kh, kw, out_h, out_w)
    outs = []
    oc_per_group = out_c // groups
    for gr in range(groups):
        w = weight[gr * oc_per_group:(gr + 1) * oc_per_group]
        col = cols[:, gr * c_per_group:(gr + 1) * c_per_group]
        outs.append(torch.einsum("ocij,bcijhw->bohw", w, col))
    out = torch.cat(outs, dim=1)
    if bias is not None:
        out = out + bias.view(1, -1, 1, 1)
    return out


# --- helpers ---------------------------------------------------------------------


def make_case(batch=2, in_c=4, out_c=6, size=(7, 6), kernel=(3, 3), stride=(1, 1),
              padding=(0, 0), dilation=(1, 1), groups=1, offset_groups=1, use_mask=True,
              use_bias=True, offset_scale=2.0, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    kh, kw = kernel
    out_h = (size[0] + 2 * padding[0] - (dilation[0] * (kh - 1) + 1)) // stride[0] + 1
    out_w = (size[1] + 2 * padding[1] - (dilation[1] * (kw - 1) + 1)) // stride[1] + 1

    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=dtype)

    return dict(
        input=rand(batch, in_c, *size),
        offset=rand(batch, 2 * offset_groups * kh * kw, out_h, out_w) * offset_scale,
        weight=rand(out_c, in_c // groups, kh, kw),
        bias=rand(out_c) if use_bias else None,
        stride=stride,
        padding=padding,
        dilation=dilation,
        mask=torch.rand(batch, offset_groups * kh * kw, out_h, out_w, generator=gen, dtype=dtype)
        if use_mask
        else None,
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


def _call(fn, case):
    return fn(case["input"], case["offset"], case["weight"], case["bias"], stride=case["stride"],
              padding=case["padding"], dilation=case["dilation"], mask=case["mask"])


# --- forward vs reference --------------------------------------------------------


@pytest.mark.parametrize("name", sorted(CASES))
def test_forward_matches_reference(name):
    case = make_case(**CASES[name])
    torch.testing.assert_close(_call(deform_conv2d, case), _call(reference_deform_conv2d, case))


def _offsets_to(targets, h, w):
    """Offsets for a 1x1 kernel, stride 1, no padding that sample at the given (y, x) points."""
    oy = torch.tensor([[y for y, _ in row] for row in targets], dtype=torch.float64)
    ox = torch.tensor([[x for _, x in row] for row in targets], dtype=torch.float64)
    base_y = torch.arange(h, dtype=torch.float64)[:, None].expand(h, w)
    base_x = torch.arange(w, dtype=torch.float64)[None, :].expand(h, w)
    return torch.stack([oy - base_y, ox - base_x])[None]


def test_sampling_exactly_on_and_beyond_the_border():
    h, w = 3, 4
    points = [(-1.0, 0.0), (-0.5, -0.5), (0.0, 0.0), (2.0, 3.0), (2.5, 1.0), (3.0, 3.0)]
    targets = [points[:4], points[2:], [(1.25, 2.75), (-0.999, 3.999), (2.0, -1.0), (1.0, 4.0)]]
    offset = _offsets_to(targets, h, w)
    case = dict(input=torch.randn(1, 2, h, w, dtype=torch.float64), offset=offset,
                weight=torch.randn(3, 2, 1, 1, dtype=torch.float64), bias=None, stride=(1, 1),
                padding=(0, 0), dilation=(1, 1), mask=torch.rand(1, 1, h, w, dtype=torch.float64))
    out = _call(deform_conv2d, case)
    torch.testing.assert_close(out, _call(reference_deform_conv2d, case))
    # (-1, 0) and (3, 3) are outside: exactly zero output there.
    assert torch.all(out[0, :, 0, 0] == 0) and torch.all(out[0, :, 1, 3] == 0)


def test_nan_offsets_give_nan_where_they_sample_and_nowhere_else():
    case = make_case(batch=1, in_c=2, out_c=2, size=(4, 4), kernel=(1, 1), offset_scale=0.5)
    case["offset"][0, 0, 1, 2] = math.nan
    for key in ("input", "offset", "mask"):
        case[key].requires_grad_(True)
    out = _call(deform_conv2d, case)
    expected_nan = torch.zeros_like(out, dtype=torch.bool)
    expected_nan[0, :, 1, 2] = True
    assert torch.equal(out.isnan(), expected_nan)
    g_input, g_offset, g_mask = torch.autograd.grad(out.sum(), [case["input"], case["offset"], case["mask"]])
    assert not g_input.isnan().any()
    assert g_offset[0, :, 1, 2].isnan().all() and g_offset.isnan().sum() == 2
    assert g_mask[0, 0, 1, 2].isnan() and g_mask.isnan().sum() == 1


def test_float32_matches_float64_reference():
    case = make_case(dtype=torch.float32, groups=2, offset_groups=2)
    expected = _call(reference_deform_conv2d, {k: v.double() if isinstance(v, torch.Tensor) else v
                                               for k, v in case.items()})
    out = _call(deform_conv2d, case)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, expected.float(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_reduced_precision_computes_in_float32(dtype):
    case = make_case(dtype=dtype)
    out = _call(deform_conv2d, case)
    assert out.dtype == dtype
    upcast = {k: v.float() if isinstance(v, torch.Tensor) else v for k, v in case.items()}
    torch.testing.assert_close(out, _call(deform_conv2d, upcast).to(dtype))


def test_integer_offsets_reduce_to_plain_convolution():
    case = make_case(offset_scale=0.0, size=(8, 8), padding=(1, 1), stride=(2, 1), groups=2)
    expected = torch.nn.functional.conv2d(case["input"], case["weight"], case["bias"], stride=(2, 1),
                                          padding=(1, 1), groups=2)
    case["mask"] = None
    torch.testing.assert_close(_call(deform_conv2d, case), expected)


def test_non_contiguous_inputs():
    case = make_case(groups=2, offset_groups=2, in_c=4)
    expected = _call(reference_deform_conv2d, case)
    strided = dict(case)
    for key in ("input", "offset", "weight", "mask"):
        t = case[key]
        # Same values, transposed storage.
        strided[key] = t.transpose(-1, -2).contiguous().transpose(-1, -2)
        assert not strided[key].is_contiguous()
    strided["bias"] = torch.stack([case["bias"], case["bias"]], dim=1)[:, 0]
    assert not strided["bias"].is_contiguous()
    torch.testing.assert_close(_call(deform_conv2d, strided), expected)


def test_batch_of_zero_gives_empty_output_and_zero_grads():
    case = make_case(batch=0)
    for key in ("input", "offset", "weight", "mask", "bias"):
        case[key].requires_grad_(True)
    out = _call(deform_conv2d, case)
    assert out.shape == (0, 6, 5, 4)
    out.sum().backward()
    assert case["input"].grad.shape == case["input"].shape
    assert torch.equal(case["weight"].grad, torch.zeros_like(case["weight"]))
    assert torch.equal(case["bias"].grad, torch.zeros_like(case["bias"]))


def test_batch_split_into_chunks_matches_per_image():
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


# --- gradients -------------------------------------------------------------------


@pytest.mark.parametrize("name", ["plain", "no_mask", "groups_and_offset_groups",
                                  "stride_pad_dilation", "offsets_outside_image", "zero_offsets",
                                  "border"])
def test_gradients_match_reference_autograd(name):
    if name == "border":
        # Integer and border sampling points: the gradient there is the one-sided one the
        # reference's floor() picks.
        h, w = 3, 4
        targets = [[(-1.0, 0.0), (-0.5, -0.5), (0.0, 0.0), (2.0, 3.0)],
                   [(0.0, 0.0), (2.0, 3.0), (2.5, 1.0), (3.0, 3.0)],
                   [(1.25, 2.75), (-0.999, 3.999), (2.0, -1.0), (1.0, 4.0)]]
        case = dict(input=torch.randn(1, 2, h, w, dtype=torch.float64), offset=_offsets_to(targets, h, w),
                    weight=torch.randn(3, 2, 1, 1, dtype=torch.float64), bias=torch.randn(3, dtype=torch.float64),
                    stride=(1, 1), padding=(0, 0), dilation=(1, 1),
                    mask=torch.rand(1, 1, h, w, dtype=torch.float64))
    else:
        case = make_case(**CASES[name])
    leaves = [k for k in ("input", "offset", "weight", "mask", "bias") if case[k] is not None]
    ours = {k: case[k].clone().requires_grad_(True) for k in leaves}
    theirs = {k: case[k].clone().requires_grad_(True) for k in leaves}
    out = _call(deform_conv2d, dict(case, **ours))
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, [ours[k] for k in leaves], grad)
    ref_out = _call(reference_deform_conv2d, dict(case, **theirs))
    want = torch.autograd.grad(ref_out, [theirs[k] for k in leaves], grad, allow_unused=True)
    for key, g, w in zip(leaves, got, want):
        torch.testing.assert_close(g, torch.zeros_like(g) if w is None else w, msg=f"grad of {key}")


@pytest.mark.parametrize("use_mask", [True, False])
def test_gradcheck(use_mask):
    case = make_case(batch=2, in_c=4, out_c=2, size=(5, 4), kernel=(2, 2), groups=2,
                     offset_groups=2, padding=(1, 0), stride=(1, 2), use_mask=use_mask,
                     offset_scale=1.3, seed=3)
    leaves = [k for k in ("input", "offset", "weight", "mask", "bias") if case[k] is not None]
    tensors = [case[k].requires_grad_(True) for k in leaves]

    def fn(*args):
        return _call(deform_conv2d, dict(case, **dict(zip(leaves, args))))

    assert torch.autograd.gradcheck(fn, tensors, eps=1e-6, atol=1e-5)


def test_double_backward_raises_clear_error():
    case = make_case(batch=1, in_c=2, out_c=2, size=(4, 4), kernel=(2, 2))
    x = case["input"].requires_grad_(True)
    out = _call(deform_conv2d, case)
    (g,) = torch.autograd.grad(out.sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward of deform_conv2d is not supported"):
        g.sum().backward()


# --- registrations: opcheck, compile, export, autocast ------------------------


def _op_args(case):
    mask = case["mask"] if case["mask"] is not None else case["input"].new_zeros(case["input"].shape[0], 1)
    bias = case["bias"] if case["bias"] is not None else case["input"].new_zeros(case["weight"].shape[0])
    kh, kw = case["weight"].shape[-2:]
    return (case["input"], case["weight"], case["offset"], mask, bias, *case["stride"],
            *case["padding"], *case["dilation"], case["input"].shape[1] // case["weight"].shape[1],
            case["offset"].shape[1] // (2 * kh * kw), case["mask"] is not None)


@pytest.mark.parametrize("use_mask", [True, False])
def test_opcheck_forward(use_mask):
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


def test_opcheck_backward():
    case = make_case(batch=2, size=(5, 5))
    args = _op_args(case)
    grad = torch.randn(2, 6, 3, 3, dtype=torch.float64)
    torch.library.opcheck(torch.ops.opforge._deform_conv2d_backward.default, (grad, *args),
                          test_utils=("test_schema", "test_faketensor"))


def test_torch_compile_fullgraph_dynamic():
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


def test_torch_export():
    module = DeformConv2d(4, 3, (3, 2), stride=2, padding=1, dilation=(1, 2))
    x = torch.randn(2, 4, 9, 8)
    offset = torch.randn(2, 12, 5, 4)
    exported = torch.export.export(module, (x, offset))
    assert any(n.target is torch.ops.opforge.deform_conv2d.default for n in exported.graph.nodes)
    torch.testing.assert_close(exported.module()(x, offset), module(x, offset))


def test_autocast_computes_in_float32_and_returns_input_dtype():
    case = make_case(dtype=torch.bfloat16)
    weight = case["weight"].float()  # parameters usually stay float32 under autocast
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = deform_conv2d(case["input"], case["offset"], weight, case["bias"].float(), mask=case["mask"])
    assert out.dtype == torch.bfloat16
    expected = deform_conv2d(case["input"].float(), case["offset"].float(), weight, case["bias"].float(),
                             mask=case["mask"].float())
    torch.testing.assert_close(out, expected.to(torch.bfloat16))


def test_autocast_leaves_float64_alone():
    case = make_case()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = _call(deform_conv2d, case)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, _call(deform_conv2d, case))


# --- module ----------------------------------------------------------------------


def test_module_matches_functional_and_repr():
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
def test_module_rejects_bad_groups(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DeformConv2d(**kwargs)


# --- bad input -------------------------------------------------------------------


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


@pytest.mark.parametrize("name", sorted(BAD_FUNCTIONAL))
def test_bad_input_raises_error_naming_the_argument(name):
    make, error, message = BAD_FUNCTIONAL[name]
    with pytest.raises(error, match=message):
        _call(deform_conv2d, make())


@pytest.mark.parametrize("index, value, message", [
    (11, 0, "groups must be a positive"),
    (12, 0, "offset_groups must be a positive"),
    (12, -3, "offset_groups must be a positive"),
    (5, 2**40, "stride_h must be a positive integer below 2"),
    (7, 2**62, "padding"),
])
def test_bad_integer_arguments_to_the_raw_op(index, value, message):
    args = list(_op_args(_bad()))
    args[index] = value
    with pytest.raises(RuntimeError, match=message):
        torch.ops.opforge.deform_conv2d(*args)


def test_backward_op_rejects_wrong_grad_shape():
    args = _op_args(_bad())
    with pytest.raises(RuntimeError, match="grad must have the output shape"):
        torch.ops.opforge._deform_conv2d_backward(torch.randn(2, 6, 3, 4), *args)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batch=st.integers(0, 2), in_c=st.integers(0, 4), out_c=st.integers(0, 4),
    h=st.integers(0, 5), w=st.integers(0, 5), kh=st.integers(0, 3), kw=st.integers(0, 3),
    groups=st.integers(-1, 3), offset_groups=st.integers(-1, 3),
    stride=st.integers(-1, 3), pad=st.integers(-1, 2), dilation=st.integers(-1, 2),
    offset_c=st.integers(0, 40), oh=st.integers(0, 5), ow=st.integers(0, 5),
    use_mask=st.booleans(), mask_c=st.integers(0, 20),
    scale=st.sampled_from([0.0, 1.0, 1e3, float("inf"), float("nan")]),
)
def test_fuzz_never_crashes(batch, in_c, out_c, h, w, kh, kw, groups, offset_groups, stride, pad,
                            dilation, offset_c, oh, ow, use_mask, mask_c, scale):
    inp = torch.randn(batch, in_c, h, w)
    weight = torch.randn(out_c, max(in_c // max(groups, 1), 0), kh, kw)
    offset = torch.randn(batch, offset_c, oh, ow) * scale
    mask = torch.rand(batch, mask_c, oh, ow)
    bias = torch.randn(out_c)
    args = (inp, weight, offset, mask, bias, stride, stride, pad, pad, dilation, dilation, groups,
            offset_groups, use_mask)
    try:
        out = torch.ops.opforge.deform_conv2d(*args)
    except RuntimeError:
        return
    assert out.shape[:2] == (batch, out_c)
    grads = torch.ops.opforge._deform_conv2d_backward(torch.ones_like(out), *args)
    assert [g.shape for g in grads] == [t.shape for t in (inp, weight, offset, mask, bias)]


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    input_shape=st.lists(st.integers(0, 4), min_size=0, max_size=5),
    weight_shape=st.lists(st.integers(0, 3), min_size=0, max_size=5),
    offset_shape=st.lists(st.integers(0, 20), min_size=0, max_size=5),
    mask_shape=st.one_of(st.none(), st.lists(st.integers(0, 10), min_size=0, max_size=5)),
    stride=st.one_of(st.integers(-1, 3), st.tuples(st.integers(-1, 3), st.integers(-1, 3))),
    padding=st.one_of(st.integers(-1, 3), st.tuples(st.integers(-1, 3), st.integers(-1, 3))),
    dilation=st.one_of(st.integers(-1, 3), st.tuples(st.integers(-1, 3), st.integers(-1, 3))),
)
def test_fuzz_public_function_raises_only_clear_errors(input_shape, weight_shape, offset_shape, mask_shape,
                                                       stride, padding, dilation):
    mask = None if mask_shape is None else torch.rand(mask_shape)
    try:
        out = deform_conv2d(torch.randn(input_shape), torch.randn(offset_shape), torch.randn(weight_shape),
                            stride=stride, padding=padding, dilation=dilation, mask=mask)
    except (RuntimeError, ValueError, IndexError, ZeroDivisionError) as exc:
        # torchvision's exception types; the message names the op and the argument
        assert "deform_conv2d" in str(exc) or "offset" in str(exc)
        return
    assert out.dim() == 4
