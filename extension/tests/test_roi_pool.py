"""roi_pool against its slow reference (below) on every backend (tests/backends.py), then
what only the CPU build exercises, and its torchvision cases (torchvision_compat/)."""

import itertools
import math

import pytest
import torch
from backends import ALL_FLOATS, BACKENDS, backend_tolerance

import opforge_ops
from ops_inputs import random_rois
from ops_reference import acc as _acc
from ops_reference import round_half_away


# ------------------------------------------------------------ the slow reference
def reference(input, rois, spatial_scale, pooled_height, pooled_width):
    """Max over each bin of the roi quantized to input pixels; argmax is the flat H*W index
    of the first maximum (-1 and output 0 for an empty bin)."""
    num_rois, channels = rois.shape[0], input.shape[1]
    height, width = input.shape[-2:]
    output = input.new_zeros((num_rois, channels, pooled_height, pooled_width))
    argmax = torch.full(output.shape, -1, dtype=torch.int32)
    outputs = []
    acc = _acc(rois)
    for n, roi in enumerate(rois.double().tolist()):
        plane = input[int(roi[0])]
        x1, y1, x2, y2 = (round_half_away(float(acc(v) * acc(spatial_scale))) for v in roi[1:])
        roi_w, roi_h = max(x2 - x1 + 1, 1), max(y2 - y1 + 1, 1)
        bin_h, bin_w = acc(roi_h) / acc(pooled_height), acc(roi_w) / acc(pooled_width)
        bins = []
        for ph in range(pooled_height):
            h0 = min(max(math.floor(acc(ph) * bin_h) + y1, 0), height)
            h1 = min(max(math.ceil(acc(ph + 1) * bin_h) + y1, 0), height)
            for pw in range(pooled_width):
                w0 = min(max(math.floor(acc(pw) * bin_w) + x1, 0), width)
                w1 = min(max(math.ceil(acc(pw + 1) * bin_w) + x1, 0), width)
                if h1 <= h0 or w1 <= w0:
                    bins.append(input.new_zeros(channels))
                    continue
                region = plane[:, h0:h1, w0:w1].reshape(channels, (h1 - h0) * (w1 - w0))
                values, where = region.max(dim=1)
                bins.append(values)
                rows_, cols_ = where // (w1 - w0) + h0, where % (w1 - w0) + w0
                argmax[n, :, ph, pw] = (rows_ * width + cols_).to(torch.int32)
        outputs.append(torch.stack(bins, dim=1).reshape(channels, pooled_height, pooled_width))
    if outputs:
        output = torch.stack(outputs)
    return output, argmax


OP = torch.ops.opforge.roi_pool


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("spatial_scale", [1.0, 0.5])
def test_roi_pool_matches_reference_with_argmax(dtype, spatial_scale):
    input = torch.randn(2, 3, 10, 12, dtype=dtype)
    rois = random_rois(8, 2, 10, 12, dtype, scale=spatial_scale)
    output, argmax = OP(input, rois, spatial_scale, 3, 4)
    expected, expected_argmax = reference(input, rois, spatial_scale, 3, 4)
    assert argmax.dtype == torch.int32
    torch.testing.assert_close(output, expected, rtol=0, atol=0)
    assert torch.equal(argmax, expected_argmax)


def test_roi_pool_gradient_matches_reference():
    input = torch.randn(2, 2, 8, 9, dtype=torch.float64, requires_grad=True)
    rois = random_rois(6, 2, 8, 9, torch.float64)
    weights = torch.randn(6, 2, 2, 3, dtype=torch.float64)
    (ours,) = torch.autograd.grad(
        (opforge_ops.roi_pool(input, rois, (2, 3)) * weights).sum(), input
    )
    (expected,) = torch.autograd.grad(
        (reference(input, rois, 1.0, 2, 3)[0] * weights).sum(), input
    )
    torch.testing.assert_close(ours, expected, rtol=0, atol=1e-12)


def test_roi_pool_gradcheck():
    input = torch.randn(2, 2, 6, 7, dtype=torch.float64, requires_grad=True)
    rois = random_rois(4, 2, 6, 7, torch.float64)
    assert torch.autograd.gradcheck(lambda x: opforge_ops.roi_pool(x, rois, (2, 3), 1.0), (input,))


def test_list_of_boxes_and_module():
    input = torch.randn(2, 3, 16, 16)
    boxes = [torch.tensor([[1.0, 1, 8, 8]]), torch.tensor([[0.0, 0, 15, 15], [3, 4, 5, 6]])]
    rois = torch.tensor([[0.0, 1, 1, 8, 8], [1, 0, 0, 15, 15], [1, 3, 4, 5, 6]])
    expected = opforge_ops.roi_pool(input, rois, 3, 1.0)
    torch.testing.assert_close(opforge_ops.roi_pool(input, boxes, 3), expected, rtol=0, atol=0)
    module = opforge_ops.RoIPool(3, spatial_scale=1.0)
    torch.testing.assert_close(module(input, boxes), expected, rtol=0, atol=0)
    assert repr(module) == "RoIPool(output_size=3, spatial_scale=1.0)"


def test_zero_rois_and_empty_batch():
    input = torch.randn(0, 3, 5, 5, requires_grad=True)
    output, argmax = OP(input, torch.zeros(0, 5), 1.0, 2, 2)
    assert output.shape == argmax.shape == (0, 3, 2, 2)
    output.sum().backward()
    assert input.grad.shape == input.shape


def test_rois_outside_the_image_give_zero_and_argmax_minus_one():
    input = torch.randn(1, 2, 6, 6)
    rois = torch.tensor([[0.0, 20, 20, 30, 30], [0, -30, -30, -10, -10]])
    output, argmax = OP(input, rois, 1.0, 2, 2)
    assert torch.equal(output, torch.zeros_like(output))
    assert torch.equal(argmax, torch.full_like(argmax, -1))


def test_zero_area_and_inverted_rois_match_reference():
    input = torch.randn(1, 2, 6, 6, dtype=torch.float64)
    rois = torch.tensor(
        [[0.0, 2, 2, 2, 2], [0, 4, 4, 1, 1], [0, 5.5, 0, 5.5, 6]], dtype=torch.float64
    )
    output, argmax = OP(input, rois, 1.0, 3, 2)
    expected, expected_argmax = reference(input, rois, 1.0, 3, 2)
    torch.testing.assert_close(output, expected, rtol=0, atol=0)
    assert torch.equal(argmax, expected_argmax)


def test_non_contiguous_inputs_match_contiguous():
    input = torch.randn(2, 8, 3, 10).permute(0, 2, 1, 3)
    rois = random_rois(5, 2, 8, 10).t().contiguous().t()
    ours = OP(input, rois, 1.0, 3, 3)
    expected = OP(input.contiguous(), rois.contiguous(), 1.0, 3, 3)
    assert torch.equal(ours[0], expected[0]) and torch.equal(ours[1], expected[1])


def test_parallel_backward_equals_serial():
    input = torch.randn(2, 32, 24, 24)
    rois = random_rois(60, 2, 24, 24)
    output, argmax = OP(input, rois, 1.0, 5, 5)
    grad = torch.randn_like(output)
    args = (grad, rois, argmax, 1.0, 5, 5, 2, 32, 24, 24)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        serial = torch.ops.opforge._roi_pool_backward(*args)
        torch.set_num_threads(max(threads, 2))
        parallel = torch.ops.opforge._roi_pool_backward(*args)
    finally:
        torch.set_num_threads(threads)
    torch.testing.assert_close(parallel, serial, rtol=0, atol=0)


def test_autocast_computes_in_float32_and_returns_the_input_dtype():
    input = torch.randn(1, 3, 8, 8).bfloat16()
    rois = random_rois(4, 1, 8, 8).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        output, argmax = OP(input, rois, 1.0, 2, 2)
    expected, expected_argmax = OP(input.float(), rois.float(), 1.0, 2, 2)
    assert output.dtype == torch.bfloat16 and argmax.dtype == torch.int32
    torch.testing.assert_close(output, expected.bfloat16(), rtol=0, atol=0)
    assert torch.equal(argmax, expected_argmax)


def test_double_backward_raises_a_clear_error():
    input = torch.randn(1, 1, 5, 5, dtype=torch.float64, requires_grad=True)
    rois = torch.tensor([[0.0, 0, 0, 4, 4]], dtype=torch.float64)
    (grad,) = torch.autograd.grad(
        opforge_ops.roi_pool(input, rois, 2).pow(2).sum(), input, create_graph=True
    )
    with pytest.raises(RuntimeError, match="first-order gradients only"):
        grad.sum().backward()


@pytest.mark.parametrize(
    "input, rois, size, message",
    [
        (torch.zeros(3, 5, 5), torch.zeros(1, 5), 2, "input must be a 4-D"),
        (torch.zeros(1, 3, 5, 5), torch.zeros(1, 6), 2, r"rois \(boxes\) must have shape"),
        (torch.zeros(1, 3, 5, 5), torch.zeros(1, 5).double(), 2, "same dtype"),
        (torch.zeros(1, 3, 5, 5), torch.zeros(1, 5), -3, "output_size"),
        (torch.zeros(1, 3, 5, 5), torch.tensor([[3.0, 0, 0, 2, 2]]), 2, "not a batch index"),
        (torch.zeros(1, 3, 5, 5), torch.tensor([[0.0, 0, 0, float("inf"), 2]]), 2, "not finite"),
    ],
)
def test_bad_input_raises_runtime_error_naming_the_argument(input, rois, size, message):
    with pytest.raises(RuntimeError, match=message):
        OP(input, rois, 1.0, size, size)


def test_backward_op_rejects_an_out_of_range_argmax():
    grad = torch.ones(1, 1, 2, 2)
    argmax = torch.full((1, 1, 2, 2), 99, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="argmax holds 99"):
        torch.ops.opforge._roi_pool_backward(grad, torch.zeros(1, 5), argmax, 1.0, 2, 2, 1, 1, 4, 4)


def test_backward_op_rejects_an_argmax_of_the_wrong_dtype():
    grad = torch.ones(1, 1, 2, 2)
    with pytest.raises(RuntimeError, match="argmax must be an int32"):
        torch.ops.opforge._roi_pool_backward(
            grad,
            torch.zeros(1, 5),
            torch.zeros(1, 1, 2, 2, dtype=torch.int64),
            1.0,
            2,
            2,
            1,
            1,
            4,
            4,
        )


# ---------------------------------------------------------------- every backend
# The same cases on every backend of tests/backends.py: output and argmax against the
# reference, the backward against autograd through it.
@pytest.mark.parametrize("backend", BACKENDS, ids=str)
@pytest.mark.parametrize("dtype", ALL_FLOATS, ids=str)
@pytest.mark.parametrize("scale,size", [(1.0, (7, 7)), (0.5, (3, 5)), (0.125, (2, 2))])
def test_every_backend_matches_the_reference(backend, dtype, scale, size):
    backend.skip_unless_runs(dtype)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, 3, 18, 21, generator=g).to(dtype)
    rois = random_rois(40, 2, 18, 21, scale=scale, generator=g).to(dtype)
    out, argmax = backend.call("roi_pool", x, rois, scale, *size)
    x64 = x.double().requires_grad_()
    expected, expected_argmax = reference(x64, rois, scale, *size)
    assert out.dtype == dtype and argmax.dtype == torch.int32
    torch.testing.assert_close(argmax, expected_argmax, rtol=0, atol=0)
    torch.testing.assert_close(out.double(), expected, **backend_tolerance(dtype))
    grad = torch.randn(expected.shape[::-1], generator=g).to(dtype).permute(3, 2, 1, 0)
    (expected_grad,) = torch.autograd.grad(expected, x64, grad.double())
    got = backend.call("_roi_pool_backward", grad, rois, argmax, scale, *size, 2, 3, 18, 21)
    assert got.dtype == dtype
    torch.testing.assert_close(got.double(), expected_grad, **backend_tolerance(dtype))


# Many threadgroups (300 rois x 4 channels x 5 x 5 bins) against the CPU kernels in float32:
# the same maxima (argmax equal in float32), the backward scattering through the same argmax.
@pytest.mark.parametrize("backend", [b for b in BACKENDS if b.name != "cpu"], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_a_large_problem_matches_the_cpu_kernels(backend, dtype):
    backend.skip_unless_runs(dtype)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 4, 24, 24, generator=g).to(dtype)
    rois = random_rois(300, 2, 24, 24, generator=g).to(dtype)
    expected, expected_argmax = torch.ops.opforge.roi_pool(x.float(), rois.float(), 1.0, 5, 5)
    out, argmax = backend.call("roi_pool", x, rois, 1.0, 5, 5)
    tol = backend_tolerance(dtype)
    assert out.dtype == dtype and argmax.dtype == expected_argmax.dtype
    torch.testing.assert_close(out.float(), expected, **tol)
    if dtype == torch.float32:
        assert torch.equal(argmax, expected_argmax)
    grad = torch.randn(expected.shape, generator=g)
    expected_grad = torch.ops.opforge._roi_pool_backward(grad, rois.float(), argmax, 1.0, 5, 5, 2, 4, 24, 24)
    got = backend.call("_roi_pool_backward", grad.to(dtype), rois, argmax, 1.0, 5, 5, 2, 4, 24, 24)
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), expected_grad, **tol)


# ---------------------------------------------------- torchvision-compatibility cases
def torchvision_cases():
    """roi_pool's and RoIPool's cases for the torchvision differential suite;
    torchvision_compat/tv_cases.py calls this, with its helpers imported."""
    from tv_cases import BOX_FORMS, FLOAT_DTYPES, MEMORY_LAYOUTS, Case, roi_common_cases, roi_inputs

    for dtype, form, memory in itertools.product(FLOAT_DTYPES, BOX_FORMS, MEMORY_LAYOUTS):
        for size, scale in ((2, 1.0), ((3, 2), 0.5), ([1, 4], 2.0)):
            yield Case(
                "roi_pool", f"{dtype}-{form}-{memory}-{size}-{scale}",
                lambda dtype=dtype, form=form, memory=memory: roi_inputs(dtype, form, memory),
                lambda ns, a, size=size, scale=scale: ns.roi_pool(a[0], a[1], size, scale),
                grad=dtype == torch.float64,
            )
    yield from roi_common_cases("roi_pool", lambda ns, a, size=2: ns.roi_pool(a[0], a[1], size, 1.0))
    yield Case("roi_pool", "module", lambda: roi_inputs(torch.float64, "list", "contiguous"),
               lambda ns, a: ns.RoIPool((2, 3), 0.5)(a[0], a[1]), grad=True)
    yield Case("roi_pool", "module-repr", lambda: (), lambda ns, a: repr(ns.RoIPool((2, 3), 0.5)))


def _dirty_the_allocator(shape, dtype):
    """Frees tensors of `shape` full of NaN, so that the next allocation of that size is likely
    to reuse their memory: a kernel that leaves part of its output unwritten shows NaN there."""
    for _ in range(3):
        torch.full(shape, float("nan"), dtype=dtype)


def test_bins_of_every_shape_and_ties_over_several_channel_blocks_match_the_reference():
    # 70 channels: more than one of the CPU kernel's channel blocks. Values from {0, 1, 2, 3}:
    # most bins hold ties, so the first maximum in scan order must win. 7x7 bins over rois of
    # 1 to 25 pixels a side give bins of 1 to 3 pixels a side (the fixed-shape scans) and wider
    # ones (the general loop); rois partly or wholly outside the image give empty bins, and
    # some reach the last row and column.
    shape = (2, 70, 24, 26)
    g = torch.Generator().manual_seed(5)
    input = torch.randint(0, 4, shape, generator=g).double()
    rois = torch.tensor(
        [
            [0, 0, 0, 4, 4],
            [1, 2, 3, 12, 10],
            [0, 3, 2, 19, 17],
            [1, 0, 0, 25, 23],
            [0, -10, -10, 2, 3],
            [1, 30, 30, 40, 40],
            [0, 20, 15, 25, 23],
            [1, 25, 23, 25, 23],
        ],
        dtype=torch.float64,
    )
    out, argmax = OP(input, rois, 1.0, 7, 7)
    expected, expected_argmax = reference(input, rois, 1.0, 7, 7)
    assert torch.equal(out, expected)
    assert torch.equal(argmax, expected_argmax)

    # The backward adds each bin's grad at its argmax; every other element is 0.
    grad = torch.randn(out.shape, generator=g, dtype=torch.float64)
    want = torch.zeros(shape, dtype=torch.float64)
    for n, c, ph, pw in itertools.product(range(len(rois)), range(shape[1]), range(7), range(7)):
        where = int(argmax[n, c, ph, pw])
        if where >= 0:
            want[int(rois[n, 0]), c].view(-1)[where] += grad[n, c, ph, pw]
    _dirty_the_allocator(shape, torch.float64)
    got = torch.ops.opforge._roi_pool_backward(grad, rois, argmax, 1.0, 7, 7, *shape)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
