"""roi_align against its slow reference (below) on every backend (tests/backends.py), then
what only the CPU build exercises, and its torchvision cases (torchvision_compat/)."""

import itertools
import math

import pytest
import torch
from backends import ALL_FLOATS, BACKENDS, DEVICE_NAMES, backend_tolerance
from torch._subclasses.fake_tensor import FakeTensorMode

import opforge_ops
from ops_inputs import random_rois
from ops_reference import acc as _acc
from ops_reference import bilinear


# ------------------------------------------------------------ the slow reference
def reference(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned):
    """Average of bilinear samples on a regular grid inside each of the roi's bins."""
    num_rois, channels = rois.shape[0], input.shape[1]
    acc = _acc(rois)
    rows = []
    offset = acc(0.5 if aligned else 0.0)
    for roi in rois.double().tolist():
        plane = input[int(roi[0])]
        x1, y1, x2, y2 = (acc(v) * acc(spatial_scale) - offset for v in roi[1:])
        roi_w, roi_h = x2 - x1, y2 - y1
        if not aligned:
            roi_w, roi_h = max(roi_w, acc(1)), max(roi_h, acc(1))
        bin_h, bin_w = roi_h / acc(pooled_height), roi_w / acc(pooled_width)
        grid_h = sampling_ratio if sampling_ratio > 0 else max(0, math.ceil(bin_h))
        grid_w = sampling_ratio if sampling_ratio > 0 else max(0, math.ceil(bin_w))
        count = max(grid_h * grid_w, 1)
        bins = []
        for ph in range(pooled_height):
            for pw in range(pooled_width):
                total = input.new_zeros(channels)
                for iy in range(grid_h):
                    y = y1 + acc(ph) * bin_h + (acc(iy) + acc(0.5)) * bin_h / acc(grid_h)
                    for ix in range(grid_w):
                        x = x1 + acc(pw) * bin_w + (acc(ix) + acc(0.5)) * bin_w / acc(grid_w)
                        total = total + bilinear(plane, float(y), float(x))
                bins.append(total / count)
        rows.append(torch.stack(bins, dim=1).reshape(channels, pooled_height, pooled_width))
    if not rows:
        return input.new_zeros((num_rois, channels, pooled_height, pooled_width))
    return torch.stack(rows)


OP = torch.ops.opforge.roi_align


def tolerance(dtype):
    return (
        {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 1e-10, "rtol": 1e-10}
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize("sampling_ratio", [-1, 0, 2])
def test_roi_align_matches_reference(dtype, aligned, sampling_ratio):
    input = torch.randn(2, 3, 10, 12, dtype=dtype)
    rois = random_rois(6, 2, 10, 12, dtype, scale=0.5)
    args = (0.5, 3, 4, sampling_ratio, aligned)
    expected = reference(input, rois, *args)
    torch.testing.assert_close(OP(input, rois, *args), expected, **tolerance(dtype))


@pytest.mark.parametrize("aligned", [False, True])
def test_roi_align_gradient_matches_reference(aligned):
    input = torch.randn(2, 2, 8, 9, dtype=torch.float64, requires_grad=True)
    rois = random_rois(5, 2, 8, 9, torch.float64)
    weights = torch.randn(5, 2, 3, 2, dtype=torch.float64)
    args = (1.0, 3, 2, -1, aligned)
    (ours,) = torch.autograd.grad((OP(input, rois, *args) * weights).sum(), input)
    (expected,) = torch.autograd.grad(
        (reference(input, rois, *args) * weights).sum(), input
    )
    torch.testing.assert_close(ours, expected, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize("sampling_ratio", [-1, 2])
def test_roi_align_gradcheck(aligned, sampling_ratio):
    input = torch.randn(2, 2, 6, 7, dtype=torch.float64, requires_grad=True)
    rois = random_rois(4, 2, 6, 7, torch.float64)
    assert torch.autograd.gradcheck(
        lambda x: OP(x, rois, 1.0, 2, 3, sampling_ratio, aligned), (input,)
    )


def test_list_of_boxes_equals_indexed_rois():
    input = torch.randn(2, 3, 16, 16)
    boxes = [torch.tensor([[1.0, 1, 8, 8], [2, 3, 12, 9]]), torch.tensor([[0.0, 0, 15, 15]])]
    rois = torch.tensor([[0.0, 1, 1, 8, 8], [0, 2, 3, 12, 9], [1, 0, 0, 15, 15]])
    torch.testing.assert_close(
        opforge_ops.roi_align(input, boxes, 4),
        opforge_ops.roi_align(input, rois, 4),
        rtol=0,
        atol=0,
    )


def test_function_defaults_and_module_match_torchvision_signature():
    input = torch.randn(1, 2, 9, 9)
    rois = torch.tensor([[0.0, 1, 1, 7, 6]])
    expected = OP(input, rois, 1.0, 3, 3, -1, False)
    torch.testing.assert_close(opforge_ops.roi_align(input, rois, (3, 3)), expected, rtol=0, atol=0)
    module = opforge_ops.RoIAlign((3, 3), spatial_scale=1.0, sampling_ratio=-1)
    torch.testing.assert_close(module(input, rois), expected, rtol=0, atol=0)
    assert (
        repr(module)
        == "RoIAlign(output_size=(3, 3), spatial_scale=1.0, sampling_ratio=-1, aligned=False)"
    )


def test_zero_rois_give_an_empty_output():
    out = opforge_ops.roi_align(torch.randn(2, 3, 5, 5), torch.zeros(0, 5), 2)
    assert out.shape == (0, 3, 2, 2)


def test_batch_of_zero_images_with_zero_rois():
    input = torch.randn(0, 3, 5, 5, requires_grad=True)
    out = opforge_ops.roi_align(input, torch.zeros(0, 5), 2)
    assert out.shape == (0, 3, 2, 2)
    out.sum().backward()
    assert input.grad.shape == input.shape


def test_rois_outside_the_image_pool_to_zero():
    input = torch.randn(1, 2, 6, 6)
    rois = torch.tensor([[0.0, 20, 20, 30, 30], [0, -30, -30, -10, -10]])
    out = opforge_ops.roi_align(input, rois, 2, sampling_ratio=2)
    assert torch.equal(out, torch.zeros_like(out))


@pytest.mark.parametrize("aligned", [False, True])
def test_zero_area_rois_match_reference(aligned):
    input = torch.randn(1, 2, 6, 6, dtype=torch.float64)
    rois = torch.tensor(
        [[0.0, 2, 2, 2, 2], [0, 1.5, 3, 1.5, 5], [0, 4, 4, 3, 3]], dtype=torch.float64
    )
    for sampling_ratio in (-1, 2):
        args = (1.0, 2, 2, sampling_ratio, aligned)
        torch.testing.assert_close(OP(input, rois, *args), reference(input, rois, *args))


def test_non_contiguous_inputs_match_contiguous():
    base = torch.randn(2, 8, 3, 10)
    input = base.permute(0, 2, 1, 3)  # [2, 3, 8, 10], not contiguous
    rois = random_rois(5, 2, 8, 10, torch.float32).t().contiguous().t()
    assert not input.is_contiguous() and not rois.is_contiguous()
    args = (1.0, 3, 3, 2, True)
    torch.testing.assert_close(
        OP(input, rois, *args), OP(input.contiguous(), rois.contiguous(), *args), rtol=0, atol=0
    )


def test_channels_last_input():
    input = torch.randn(2, 4, 9, 9).to(memory_format=torch.channels_last)
    rois = random_rois(4, 2, 9, 9)
    torch.testing.assert_close(
        OP(input, rois, 1.0, 2, 2, -1, False), OP(input.contiguous(), rois, 1.0, 2, 2, -1, False)
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("channels", [8, 13, 40])
def test_channels_last_path_matches_channels_first(dtype, channels):
    # With 8 channels or more a channels-last input is read in place, a vector of channels per
    # bilinear sample (13, 40: whole vectors and a tail); aligned and not, adaptive and fixed.
    # Each channel's arithmetic is the channels-first loop's, in its order, in the baseline
    # build and in its AVX2 clone (no fused multiply-adds): the bins are bit-identical.
    input = torch.randn(2, channels, 11, 9, dtype=dtype)
    rois = random_rois(6, 2, 11, 9, dtype=dtype)
    for args in ((0.5, 3, 2, -1, False), (1.0, 2, 3, 2, True)):
        expected = OP(input, rois, *args)
        got = OP(input.to(memory_format=torch.channels_last), rois, *args)
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
        # A transposed view that is channels-last by its strides takes the same path.
        strided = input.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)
        torch.testing.assert_close(OP(strided, rois, *args), got, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("channels,height,width", [(24, 20, 20), (13, 21, 19), (40, 9, 7)])
def test_many_rois_on_channels_first_input_match_one_roi_at_a_time(dtype, channels, height, width):
    # Many rois on a small image: the input is transposed once (register tiles and their
    # edges: channels and planes that are not whole tiles) and sampled channels-last; one roi
    # at a time samples it in place, channels-first. Both must give the same bins.
    input = torch.randn(2, channels, height, width, dtype=dtype)
    rois = random_rois(64, 2, height, width, dtype=dtype)
    for args in ((1.0, 7, 7, 2, True), (0.5, 3, 3, -1, False)):
        one_by_one = torch.cat([OP(input, rois[i : i + 1], *args) for i in range(len(rois))])
        torch.testing.assert_close(OP(input, rois, *args), one_by_one, rtol=0, atol=0)


def test_many_rois_and_channels_use_every_thread_consistently():
    # Large enough for at::parallel_for to split; compared with a single-threaded run.
    input = torch.randn(2, 64, 32, 32)
    rois = random_rois(100, 2, 32, 32)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        serial = OP(input, rois, 1.0, 7, 7, 2, True)
        serial_grad = torch.ops.opforge._roi_align_backward(
            serial, rois, 1.0, 7, 7, 2, 64, 32, 32, 2, True
        )
    finally:
        torch.set_num_threads(threads)
    torch.set_num_threads(max(threads, 2))
    try:
        parallel = OP(input, rois, 1.0, 7, 7, 2, True)
        parallel_grad = torch.ops.opforge._roi_align_backward(
            serial, rois, 1.0, 7, 7, 2, 64, 32, 32, 2, True
        )
    finally:
        torch.set_num_threads(threads)
    torch.testing.assert_close(parallel, serial, rtol=0, atol=0)
    torch.testing.assert_close(parallel_grad, serial_grad, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_types_are_computed_in_float_and_rounded(dtype):
    input = torch.randn(1, 3, 8, 8).to(dtype)
    rois = random_rois(4, 1, 8, 8).to(dtype)
    out = OP(input, rois, 1.0, 2, 2, 2, False)
    assert out.dtype == dtype
    expected = OP(input.float(), rois.float(), 1.0, 2, 2, 2, False).to(dtype)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_autocast_computes_in_float32_and_returns_the_input_dtype():
    input = torch.randn(1, 3, 8, 8).bfloat16()
    rois = random_rois(4, 1, 8, 8).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = opforge_ops.roi_align(input, rois, 2, sampling_ratio=2)
    assert out.dtype == torch.bfloat16
    expected = OP(input.float(), rois.float(), 1.0, 2, 2, 2, False).bfloat16()
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_autocast_gradient_flows_to_a_bfloat16_input():
    input = torch.randn(1, 2, 6, 6).bfloat16().requires_grad_()
    rois = random_rois(3, 1, 6, 6).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = opforge_ops.roi_align(input, rois, 2)
    out.float().sum().backward()
    assert input.grad.dtype == torch.bfloat16 and input.grad.shape == input.shape


def test_double_backward_raises_a_clear_error():
    input = torch.randn(1, 1, 5, 5, dtype=torch.float64, requires_grad=True)
    rois = torch.tensor([[0.0, 0, 0, 4, 4]], dtype=torch.float64)
    (grad,) = torch.autograd.grad(
        OP(input, rois, 1.0, 2, 2, 2, False).pow(2).sum(), input, create_graph=True
    )
    with pytest.raises(RuntimeError, match="first-order gradients only"):
        grad.sum().backward()


@pytest.mark.parametrize(
    "input, rois, output_size, message",
    [
        (torch.zeros(3, 5, 5), torch.zeros(1, 5), 2, "input must be a 4-D"),
        (torch.zeros(1, 3, 5, 5), torch.zeros(1, 4), 2, r"rois \(boxes\) must have shape \[K, 5\]"),
        (torch.zeros(1, 3, 5, 5), torch.zeros(1, 5, dtype=torch.float64), 2, "same dtype"),
        (torch.zeros(1, 3, 5, 5), torch.zeros(1, 5), (2, -1), "output_size"),
        (
            torch.zeros(1, 3, 5, 5),
            torch.tensor([[1.0, 0, 0, 2, 2]]),
            2,
            r"rois\[0, 0\] = 1 is not a batch index",
        ),
        (torch.zeros(1, 3, 5, 5), torch.tensor([[-1.0, 0, 0, 2, 2]]), 2, "not a batch index"),
        (
            torch.zeros(1, 3, 5, 5),
            torch.tensor([[0.0, 0, float("nan"), 2, 2]]),
            2,
            r"rois\[0, 2\] = nan is not finite",
        ),
        (
            torch.zeros(1, 3, 5, 5, dtype=torch.int32),
            torch.zeros(1, 5, dtype=torch.int32),
            2,
            "floating point",
        ),
    ],
)
def test_bad_input_raises_runtime_error_naming_the_argument(input, rois, output_size, message):
    height, width = (output_size, output_size) if isinstance(output_size, int) else output_size
    with pytest.raises(RuntimeError, match=message):
        OP(input, rois, 1.0, height, width, -1, False)


def test_huge_roi_with_adaptive_sampling_is_an_error_not_a_hang():
    with pytest.raises(RuntimeError, match="sampling_ratio"):
        opforge_ops.roi_align(torch.zeros(1, 1, 4, 4), torch.tensor([[0.0, 0, 0, 1e12, 1e12]]), 2)


@pytest.mark.parametrize(
    "boxes, error, message",
    [
        (torch.zeros(2, 4), AssertionError, r"boxes must be a Tensor\[K, 5\]"),
        ([torch.zeros(2, 5)], AssertionError, r"boxes\[0\] must be a Tensor\[L, 4\]"),
        ([], ValueError, "empty list"),
        ("boxes", AssertionError, "boxes must be a Tensor"),
    ],
)
def test_bad_boxes_raise_torchvisions_exception_types(boxes, error, message):
    with pytest.raises(error, match=message):
        opforge_ops.roi_align(torch.zeros(1, 1, 4, 4), boxes, 2)


def test_output_size_is_read_as_torchvision_reads_it():
    x, rois = torch.rand(1, 1, 4, 4), torch.tensor([[0.0, 0, 0, 3, 3]])
    assert opforge_ops.roi_align(x, rois, (1, 2, 3)).shape == (1, 1, 1, 2)  # the first two
    assert opforge_ops.roi_align(x, rois, 0).shape == (1, 1, 0, 0)
    with pytest.raises(IndexError):
        opforge_ops.roi_align(x, rois, (2,))


def test_backward_op_rejects_a_mismatched_grad():
    with pytest.raises(RuntimeError, match="grad must have shape"):
        torch.ops.opforge._roi_align_backward(
            torch.zeros(2, 1, 2, 2), torch.zeros(1, 5), 1.0, 2, 2, 1, 1, 4, 4, -1, False
        )


# ---------------------------------------------------------------- every backend
# The same cases on every backend of tests/backends.py, forward and backward against the
# reference; grad is non-contiguous, as autograd may pass it.
BACKEND_CASES = [(1.0, (7, 7), 2, False), (0.5, (5, 3), 0, True), (0.25, (2, 4), -1, False)]


@pytest.mark.parametrize("backend", BACKENDS, ids=str)
@pytest.mark.parametrize("dtype", ALL_FLOATS, ids=str)
@pytest.mark.parametrize("scale,size,ratio,aligned", BACKEND_CASES)
def test_every_backend_matches_the_reference(backend, dtype, scale, size, ratio, aligned):
    backend.skip_unless_runs(dtype)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 13, 11, generator=g).to(dtype)
    rois = random_rois(40, 2, 13, 11, scale=scale, generator=g).to(dtype)
    out = backend.call("roi_align", x, rois, scale, *size, ratio, aligned)
    x64 = x.double().requires_grad_()
    expected = reference(x64, rois, scale, *size, ratio, aligned)
    assert out.dtype == dtype
    torch.testing.assert_close(out.double(), expected, **backend_tolerance(dtype))
    grad = torch.randn(expected.shape[::-1], generator=g).to(dtype).permute(3, 2, 1, 0)
    (expected_grad,) = torch.autograd.grad(expected, x64, grad.double())
    got = backend.call("_roi_align_backward", grad, rois, scale, *size, 2, 3, 13, 11, ratio, aligned)
    assert got.dtype == dtype
    torch.testing.assert_close(got.double(), expected_grad, **backend_tolerance(dtype))


# Many threadgroups (500 rois x 8 channels x 7 x 7 bins), forward and backward against the CPU
# kernels in float32; on a device also through autograd (the device's Autograd registration).
@pytest.mark.parametrize("backend", [b for b in BACKENDS if b.name != "cpu"], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("aligned", [False, True])
def test_a_large_problem_matches_the_cpu_kernels(backend, dtype, aligned):
    backend.skip_unless_runs(dtype)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 8, 32, 32, generator=g).to(dtype)
    rois = random_rois(500, 2, 32, 32, scale=0.5, generator=g).to(dtype)
    args = (0.5, 7, 7, 2, aligned)
    x32 = x.float().requires_grad_()
    expected = OP(x32, rois.float(), *args)
    grad = torch.randn(expected.shape, generator=g)
    (expected_grad,) = torch.autograd.grad(expected, x32, grad)
    tol = backend_tolerance(dtype)
    out = backend.call("roi_align", x, rois, *args)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), expected.detach(), **tol)
    got = backend.call("_roi_align_backward", grad.to(dtype), rois, *args[:3], 2, 8, 32, 32, *args[3:])
    torch.testing.assert_close(got.float(), expected_grad, **tol)
    if backend.name in DEVICE_NAMES:
        def forward_backward(x, rois, grad):
            x = x.requires_grad_()
            out = opforge_ops.roi_align(x, rois, (7, 7), 0.5, 2, aligned)
            return out, torch.autograd.grad(out, x, grad)[0]

        out, got = backend.call_function(forward_backward, x, rois, grad.to(dtype))
        assert out.dtype == got.dtype == dtype
        torch.testing.assert_close(out.float(), expected.detach(), **tol)
        torch.testing.assert_close(got.float(), expected_grad, **tol)


# ---------------------------------------------------- torchvision-compatibility cases
def torchvision_cases():
    """roi_align's and RoIAlign's cases (float and quantized) for the torchvision differential
    suite; torchvision_compat/tv_cases.py calls this, with its helpers imported."""
    from tv_cases import (
        BOX_FORMS,
        FLOAT_DTYPES,
        MEMORY_LAYOUTS,
        QUANTIZED_DTYPES,
        Case,
        crashing_torchvision,
        quantize,
        roi_common_cases,
        roi_inputs,
        rois,
    )

    for dtype, form, memory in itertools.product(FLOAT_DTYPES + (torch.float16,), BOX_FORMS, MEMORY_LAYOUTS):
        for size, scale, ratio, aligned in ((2, 1.0, -1, False), ((3, 2), 0.5, 2, True), ([4, 1], 2.0, 0, False)):
            yield Case(
                "roi_align", f"{dtype}-{form}-{memory}-{size}-{scale}-{ratio}-{aligned}",
                lambda dtype=dtype, form=form, memory=memory: roi_inputs(dtype, form, memory),
                lambda ns, a, size=size, scale=scale, ratio=ratio, aligned=aligned: ns.roi_align(
                    a[0], a[1], size, scale, ratio, aligned),
                grad=dtype == torch.float64,
            )
    yield from crashing_torchvision(
        roi_common_cases("roi_align", lambda ns, a, size=2: ns.roi_align(a[0], a[1], size, 1.0, -1, False)),
        {"input-zero-height": "zeros", "input-zero-width": "zeros"},  # torchvision: segmentation fault
    )
    yield Case("roi_align", "keyword-arguments", lambda: roi_inputs(torch.float32, "tensor", "contiguous"),
               lambda ns, a: ns.roi_align(input=a[0], boxes=a[1], output_size=(2, 2), spatial_scale=0.5,
                                          sampling_ratio=3, aligned=True))
    yield Case("roi_align", "defaults", lambda: roi_inputs(torch.float32, "tensor", "contiguous"),
               lambda ns, a: ns.roi_align(a[0], a[1], 3))
    yield Case("roi_align", "module", lambda: roi_inputs(torch.float64, "list", "contiguous"),
               lambda ns, a: ns.RoIAlign((2, 3), 0.5, 2, aligned=True)(a[0], a[1]), grad=True)
    yield Case("roi_align", "module-repr", lambda: (),
               lambda ns, a: repr(ns.RoIAlign((2, 3), 0.5, 2, aligned=True)))

    # the QuantizedCPU kernel
    for dtype, (size, scale, ratio, aligned) in itertools.product(
            QUANTIZED_DTYPES, ((2, 1.0, -1, False), ((3, 2), 0.5, 2, True), (4, 1.0, 0, True))):
        yield Case(
            "roi_align", f"quantized-{dtype}-{size}-{scale}-{ratio}-{aligned}",
            lambda dtype=dtype: (quantize(torch.rand(1, 3, 9, 11) * 4, 0.05, 3, dtype),
                                 quantize(rois(7, 1, 9, 11).clamp(min=0), 0.125, 0, dtype)),
            lambda ns, a, size=size, scale=scale, ratio=ratio, aligned=aligned: ns.roi_align(
                a[0], a[1], size, scale, ratio, aligned))
    yield Case("roi_align", "quantized-list-boxes",
               lambda: (quantize(torch.rand(1, 2, 8, 8), 0.02, 10, torch.quint8),
                        [quantize(rois(3, 1, 8, 8)[:, 1:].clamp(min=0), 0.25, 0, torch.quint8)]),
               lambda ns, a: ns.roi_align(a[0], a[1], 2))
    yield Case("roi_align", "quantized-zero-rois",
               lambda: (quantize(torch.rand(1, 2, 8, 8), 0.02, 10, torch.quint8),
                        quantize(torch.zeros(0, 5), 0.25, 0, torch.quint8)),
               lambda ns, a: ns.roi_align(a[0], a[1], 2))
    yield Case("roi_align", "quantized-input-float-rois",
               lambda: (quantize(torch.rand(1, 2, 8, 8), 0.02, 10, torch.quint8), rois(3, 1, 8, 8)),
               lambda ns, a: ns.roi_align(a[0], a[1], 2))


# A list of per-image boxes becomes Tensor[K, 5] rois whose first column is the image index:
# up to three images each image's boxes padded with its index; from four, a few rows take the
# Python-list path, more than 256 the bucketize path; both eager and TorchScript, in the
# boxes' dtype, with images that have no boxes.
@pytest.mark.parametrize("counts", [(3,), (0, 4), (2, 0, 5), (100, 157), (200, 300, 1), (0, 0),
                                    (1, 0, 2, 3), (0, 5, 0, 0, 7), (70, 0, 70, 70, 70)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_list_boxes_become_rois_indexed_by_image(counts, dtype):
    g = torch.Generator().manual_seed(sum(counts))
    boxes = [(torch.rand(n, 4, generator=g) * 20).to(dtype) for n in counts]
    expected = torch.cat([torch.cat([torch.full((n, 1), float(i), dtype=dtype), b], dim=1)
                          for i, (n, b) in enumerate(zip(counts, boxes))])
    rois = opforge_ops.ops._utils.rois_from_boxes(boxes)
    assert rois.dtype == dtype and torch.equal(rois, expected)
    x = torch.rand(len(counts), 3, 24, 24, generator=g).to(dtype)
    eager = opforge_ops.roi_align(x, boxes, 2, 1.0, 2)
    assert torch.equal(eager, opforge_ops.roi_align(x, expected, 2, 1.0, 2))
    assert torch.equal(torch.jit.script(opforge_ops.roi_align)(x, boxes, 2, 1.0, 2), eager)


def _python_conversion(boxes):
    """The wrappers' conversion without the library's helper op: TorchScript's path (and a
    library's without the helper)."""
    utils = opforge_ops.ops._utils
    saved, utils._BOXES_TO_ROIS = utils._BOXES_TO_ROIS, None
    try:
        return utils.convert_boxes_to_roi_format(boxes)
    finally:
        utils._BOXES_TO_ROIS = saved


_HELPER = opforge_ops.ops._utils._BOXES_TO_ROIS
# the legacy build's helper is composite (autograd, any device); the stable build's a CPU kernel
_COMPOSITE_HELPER = torch._C._dispatch_has_kernel_for_dispatch_key(
    "opforge::_boxes_to_rois", "CompositeImplicitAutograd")


# opforge::_boxes_to_rois copies plain CPU boxes of one floating dtype directly and composes a
# pad per image + cat for everything else: both give what the Python conversion gives, value,
# dtype (torch.cat's promotion) and shape alike.
@pytest.mark.parametrize("case", ["bfloat16", "mixed-dtypes", "strided", "integer", "empty",
                                  "one-image", "five-images"])
def test_boxes_to_rois_helper_matches_the_python_conversion(case):
    g = torch.Generator().manual_seed(7)

    def box(n, dtype=torch.float32):
        return (torch.rand(n, 4, generator=g) * 30).to(dtype)

    boxes = {
        "bfloat16": lambda: [box(3, torch.bfloat16), box(2, torch.bfloat16)],
        "mixed-dtypes": lambda: [box(3), box(2, torch.float64), box(1, torch.float16)],
        "strided": lambda: [box(8)[::2], (torch.rand(4, 6, generator=g) * 30)[:, 1:5], box(4).t().contiguous().t()],
        "integer": lambda: [box(3, torch.int64), box(2, torch.int64)],
        "empty": lambda: [box(0), box(0)],
        "one-image": lambda: [box(6)],
        "five-images": lambda: [box(n) for n in (2, 0, 3, 1, 4)],
    }[case]()
    got, want = _HELPER(boxes), _python_conversion(boxes)
    assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
    eager = opforge_ops.ops._utils.rois_from_boxes(boxes)  # the wrappers' path
    assert eager.dtype == want.dtype and torch.equal(eager, want)


def test_boxes_to_rois_helper_has_meta_and_fake_kernels():
    meta = _HELPER([torch.empty(3, 4, device="meta"), torch.empty(2, 4, device="meta")])
    assert meta.device.type == "meta" and meta.shape == (5, 5)
    with FakeTensorMode():
        fake = _HELPER([torch.empty(3, 4), torch.empty(0, 4, dtype=torch.float64)])
        assert fake.shape == (3, 5) and fake.dtype == torch.float64


def test_list_boxes_that_need_a_graph_keep_it():
    boxes = [torch.rand(3, 4, requires_grad=True), torch.rand(2, 4)]
    rois = opforge_ops.ops._utils.rois_from_boxes(boxes)
    assert rois.requires_grad
    rois.sum().backward()
    assert torch.equal(boxes[0].grad, torch.ones(3, 4))
    with torch.no_grad():
        assert not opforge_ops.ops._utils.rois_from_boxes(boxes).requires_grad


@pytest.mark.skipif(not _COMPOSITE_HELPER, reason="the stable build's _boxes_to_rois is a CPU "
                    "kernel the wrappers call only for boxes that need no graph (the test above)")
def test_composite_helper_keeps_autograd_and_says_an_empty_list_is_wrong():
    boxes = [torch.rand(3, 4, requires_grad=True), torch.rand(2, 4)]
    rois = _HELPER(boxes)
    assert rois.requires_grad  # composed from differentiable ATen ops, not the direct copy
    rois.sum().backward()
    assert torch.equal(boxes[0].grad, torch.ones(3, 4))
    with pytest.raises(RuntimeError, match="empty list"):
        _HELPER([])


# Eager calls use the helper; a traced, exported or compiled graph holds the ATen ops instead,
# so it loads beside the stable build too (which has no _boxes_to_rois).
def test_graphs_of_list_boxes_keep_aten_ops_not_the_helper():
    g = torch.Generator().manual_seed(3)
    x = torch.rand(2, 4, 12, 12, generator=g)
    boxes = [torch.rand(n, 4, generator=g) * 5 for n in (3, 2)]
    for b in boxes:
        b[:, 2:] += b[:, :2]

    class Model(torch.nn.Module):
        def forward(self, x, a, b):
            return opforge_ops.roi_align(x, [a, b], 3, 1.0, 2, True)

    eager = Model()(x, *boxes)
    exported = torch.export.export(Model(), (x, *boxes))
    targets = {str(n.target) for n in exported.graph.nodes if n.op == "call_function"}
    assert "opforge._boxes_to_rois.default" not in targets and "aten.cat.default" in targets
    torch.testing.assert_close(exported.module()(x, *boxes), eager)
    traced = torch.jit.trace(Model(), (x, *boxes))
    kinds = {n.kind() for n in traced.graph.nodes()}
    assert "opforge::_boxes_to_rois" not in kinds and "aten::cat" in kinds
    torch.testing.assert_close(traced(x, *boxes), eager)
    compiled = torch.compile(Model(), fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x, *boxes), eager)
