"""CUDA kernels of opforge_ops: every op against the CPU op on the same inputs.

Registration tests need no device: they run against any build that reports the "cuda"
backend in build_info() (and skip, saying so, on a CPU build). Everything else runs
wherever torch.cuda.is_available() and is skipped with "no CUDA device" elsewhere.
"""

import warnings
from types import SimpleNamespace

import pytest
import torch
from ops_table import BACKWARD_OPS, FORWARD_OPS, recipes

import opforge_ops

ops = torch.ops.opforge

HALF_TYPES = (torch.float16, torch.bfloat16)

built_with_cuda = "cuda" in opforge_ops.build_info().get("backends", [])
needs_cuda_build = pytest.mark.skipif(
    not built_with_cuda, reason="opforge_ops was built without CUDA kernels (build_info backends)"
)
needs_device = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def device_test(fn):
    return needs_cuda_build(needs_device(fn))


@pytest.fixture(autouse=True)
def _exact_matmul():
    # TF32 would make the deform_conv2d GEMMs differ from the CPU's by ~1e-3.
    if not torch.cuda.is_available():
        yield
        return
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


# ----------------------------------------------------------------------------- inputs


def random_boxes(n, dtype=torch.float32, device="cpu", seed=0, size=200.0):
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, generator=g) * size
    wh = torch.rand(n, 2, generator=g) * size / 4 + 1
    boxes = torch.cat([xy, xy + wh], dim=1)
    scores = torch.rand(n, generator=g)
    return boxes.to(device, dtype), scores.to(device, dtype)


def random_rois(n, batch, height, width, dtype=torch.float32, device="cpu", seed=0):
    """Rois in input coordinates (before spatial_scale), some reaching past the border."""
    g = torch.Generator().manual_seed(seed)
    x1 = torch.rand(n, generator=g) * width * 1.2 - width * 0.1
    y1 = torch.rand(n, generator=g) * height * 1.2 - height * 0.1
    w = torch.rand(n, generator=g) * width / 2
    h = torch.rand(n, generator=g) * height / 2
    index = torch.randint(0, batch, (n,), generator=g).float()
    rois = torch.stack([index, x1, y1, x1 + w, y1 + h], dim=1)
    return rois.to(device, dtype)


def feature_map(shape, dtype=torch.float32, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(device, dtype)


def deform_inputs(batch=3, cin=4, cout=6, size=(9, 8), kernel=(3, 3), groups=2, offset_groups=2,
                  stride=(1, 2), pad=(1, 0), dilation=(1, 2), dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    kh, kw = kernel
    out_h = (size[0] + 2 * pad[0] - (dilation[0] * (kh - 1) + 1)) // stride[0] + 1
    out_w = (size[1] + 2 * pad[1] - (dilation[1] * (kw - 1) + 1)) // stride[1] + 1
    tensors = dict(
        input=torch.randn(batch, cin, *size, generator=g),
        weight=torch.randn(cout, cin // groups, kh, kw, generator=g),
        offset=torch.randn(batch, 2 * offset_groups * kh * kw, out_h, out_w, generator=g) * 2,
        mask=torch.rand(batch, offset_groups * kh * kw, out_h, out_w, generator=g),
        bias=torch.randn(cout, generator=g),
    )
    args = (*stride, *pad, *dilation, groups, offset_groups)
    return {k: v.to(dtype) for k, v in tensors.items()}, args


def deform_call(t, args, use_mask=True):
    return ops.deform_conv2d(t["input"], t["weight"], t["offset"], t["mask"], t["bias"], *args, use_mask)


def to(tensors, device):
    return {k: v.to(device) for k, v in tensors.items()}


def grads_of(out, inputs, seed=1):
    grad_out = feature_map(out.shape, out.dtype, out.device, seed=seed)
    return torch.autograd.grad(out, inputs, grad_out)


def assert_close_to_scale(got, expected, fraction, what=""):
    """Low-precision results: the largest error is a small fraction of the largest value."""
    scale = expected.abs().max().item() or 1.0
    error = (got.float() - expected.float()).abs().max().item()
    assert error <= fraction * scale, f"{what}: max error {error:.3g} > {fraction} * {scale:.3g}"


def tolerance(dtype):
    return {
        torch.float64: dict(rtol=1e-9, atol=1e-9),
        torch.float32: dict(rtol=1e-4, atol=1e-4),
        torch.float16: dict(rtol=1e-2, atol=1e-2),
        torch.bfloat16: dict(rtol=5e-2, atol=5e-2),
    }[dtype]


# ------------------------------------------------------------------------ registration


@needs_cuda_build
@pytest.mark.parametrize("op", FORWARD_OPS)
@pytest.mark.parametrize("key", ["CUDA", "AutocastCUDA"])
def test_forward_op_has_cuda_and_autocast_cuda_kernels(op, key):
    assert torch._C._dispatch_has_kernel_for_dispatch_key(f"opforge::{op}", key)


@needs_cuda_build
@pytest.mark.parametrize("op", BACKWARD_OPS)
def test_backward_op_has_cuda_kernel(op):
    assert torch._C._dispatch_has_kernel_for_dispatch_key(f"opforge::{op}", "CUDA")


@needs_cuda_build
def test_build_info_records_the_cuda_toolchain():
    info = opforge_ops.build_info()
    assert info["cuda_version"] == torch.version.cuda
    assert info["cuda_arch_list"]


# -------------------------------------------------------------------------------- nms
# (every backend against the reference: test_nms.py; CUDA's particular concerns here)


@device_test
def test_nms_30k_boxes_matches_cpu():
    # Dense boxes, so many suppressions cross the 64-box block boundaries.
    boxes, scores = random_boxes(30000, seed=30, size=400.0)
    expected = ops.nms(boxes, scores, 0.5)
    got = ops.nms(boxes.cuda(), scores.cuda(), 0.5)
    torch.testing.assert_close(got.cpu(), expected, rtol=0, atol=0)


@device_test
def test_nms_scores_on_another_device_is_one_clear_error():
    boxes, scores = random_boxes(10, device="cuda")
    with pytest.raises(RuntimeError, match="same device"):
        ops.nms(boxes, scores.cpu(), 0.5)


# -------------------------------------------------------------------------- roi_align
# (every backend against the reference: test_roi_align.py; CUDA's particular concerns here)

ROI_ALIGN_CASES = [
    # spatial_scale, output size, sampling_ratio, aligned
    (1.0, (7, 7), 2, False),
    (0.5, (5, 3), 0, True),
    (0.25, (2, 4), -1, False),
    (1.0, (1, 1), 0, True),
]


@device_test
def test_roi_align_non_contiguous_inputs():
    x = feature_map((2, 5, 12, 14)).cuda()
    rois = random_rois(20, 2, 12, 14).cuda()
    channels_last = x.to(memory_format=torch.channels_last)
    wide = torch.zeros(20, 10, device="cuda")
    wide[:, ::2] = rois
    strided_rois = wide[:, ::2]
    assert not channels_last.is_contiguous() and not strided_rois.is_contiguous()
    expected = ops.roi_align(x, rois, 1.0, 3, 3, 2, False)
    got = ops.roi_align(channels_last, strided_rois, 1.0, 3, 3, 2, False)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    # A non-contiguous grad_output (expand) goes through the strided backward path.
    grad = torch.ones(1, 1, 1, 1, device="cuda").expand(20, 5, 3, 3)
    g1 = ops._roi_align_backward(grad, rois, 1.0, 3, 3, 2, 5, 12, 14, 2, False)
    g2 = ops._roi_align_backward(grad.contiguous(), rois, 1.0, 3, 3, 2, 5, 12, 14, 2, False)
    torch.testing.assert_close(g1, g2)


@device_test
def test_roi_align_empty_rois_and_empty_grad():
    x = feature_map((1, 3, 8, 8)).cuda()
    out = ops.roi_align(x, torch.empty(0, 5, device="cuda"), 1.0, 2, 2, 0, False)
    assert out.shape == (0, 3, 2, 2) and out.device.type == "cuda"
    g = ops._roi_align_backward(torch.empty(0, 3, 2, 2, device="cuda"), torch.empty(0, 5, device="cuda"),
                                1.0, 2, 2, 1, 3, 8, 8, 0, False)
    assert g.shape == (1, 3, 8, 8) and not g.any()


@device_test
def test_roi_align_bad_batch_index_reads_nothing_without_a_host_sync():
    x = feature_map((2, 3, 8, 8)).cuda() + 5
    rois = torch.tensor([[2.0, 0, 0, 4, 4], [1.0, 0, 0, 4, 4]], device="cuda")
    out = ops.roi_align(x, rois, 1.0, 2, 2, 0, False)
    assert not out[0].any() and out[1].all()


@device_test
@pytest.mark.parametrize("dtype", HALF_TYPES)
def test_roi_align_autocast_computes_in_float_and_returns_input_dtype(dtype):
    x = feature_map((2, 3, 10, 10), dtype, "cuda")
    rois = random_rois(8, 2, 10, 10, dtype, "cuda")
    with torch.autocast("cuda", dtype=dtype):
        got = ops.roi_align(x, rois, 1.0, 3, 3, 2, True)
    assert got.dtype == dtype
    expected = ops.roi_align(x.float(), rois.float(), 1.0, 3, 3, 2, True).to(dtype)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def free_device_bytes():
    free, _ = torch.cuda.mem_get_info()
    return free


@device_test
def test_roi_align_input_past_2_31_elements():
    # (1, 33, 8192, 8192) half = 2.2e9 elements: 32-bit index math would wrap and read
    # the wrong plane. The last channel's bottom-right corner holds 3.0, the rest 0.
    shape = (1, 33, 8192, 8192)
    needed = 2 * 2 * 33 * 8192 * 8192 + 4 * 33 * 8192 * 8192 + (2 << 30)  # input, fp32 grad, slack
    if torch.cuda.get_device_properties(0).total_memory < needed or free_device_bytes() < needed:
        pytest.skip(f"needs {needed / 2**30:.0f} GiB of free device memory")
    x = torch.zeros(shape, dtype=torch.float16, device="cuda")
    assert x.numel() > 2**31
    x[0, -1, -64:, -64:] = 3.0
    rois = torch.tensor([[0.0, 8192 - 50, 8192 - 50, 8192 - 10, 8192 - 10]], dtype=torch.float16, device="cuda")
    out = ops.roi_align(x, rois, 1.0, 4, 4, 2, False)
    assert torch.all(out[0, -1] == 3.0)
    assert not out[0, :-1].any()
    grad = torch.ones_like(out)
    del x
    g = ops._roi_align_backward(grad, rois, 1.0, 4, 4, 1, 33, 8192, 8192, 2, False)
    # 16 bins, each spreading a gradient of 1 over its samples; elements are rounded to half.
    assert g[0, -1, -64:, -64:].float().sum().item() == pytest.approx(16.0, rel=1e-2)
    assert g[0, -1].float().sum().item() == pytest.approx(16.0, rel=1e-2)
    del g
    torch.cuda.empty_cache()


# --------------------------------------------------------------------------- roi_pool
# (every backend against the reference: test_roi_pool.py; CUDA's particular concerns here)


@device_test
def test_roi_pool_empty_rois():
    x = feature_map((1, 3, 8, 8)).cuda()
    out, argmax = ops.roi_pool(x, torch.empty(0, 5, device="cuda"), 1.0, 2, 2)
    assert out.shape == argmax.shape == (0, 3, 2, 2)


@device_test
@pytest.mark.parametrize("dtype", HALF_TYPES)
def test_roi_pool_autocast_returns_input_dtype(dtype):
    x = feature_map((1, 3, 10, 10), dtype, "cuda")
    rois = random_rois(8, 1, 10, 10, dtype, "cuda")
    with torch.autocast("cuda", dtype=dtype):
        out, _ = ops.roi_pool(x, rois, 1.0, 3, 3)
    assert out.dtype == dtype
    torch.testing.assert_close(out, ops.roi_pool(x.float(), rois.float(), 1.0, 3, 3)[0].to(dtype))


@device_test
def test_roi_pool_input_past_2_31_elements():
    shape = (1, 33, 8192, 8192)
    needed = 2 * 33 * 8192 * 8192 + 4 * 33 * 8192 * 8192 + (2 << 30)
    if free_device_bytes() < needed:
        pytest.skip(f"needs {needed / 2**30:.0f} GiB of free device memory")
    x = torch.zeros(shape, dtype=torch.float16, device="cuda")
    x[0, -1, -5, -7] = 2.0
    rois = torch.tensor([[0.0, 8192 - 40, 8192 - 40, 8191, 8191]], dtype=torch.float16, device="cuda")
    out, argmax = ops.roi_pool(x, rois, 1.0, 1, 1)
    assert out[0, -1, 0, 0].item() == 2.0
    assert argmax[0, -1, 0, 0].item() == (8192 - 5) * 8192 + (8192 - 7)
    del x
    g = ops._roi_pool_backward(torch.ones_like(out), rois, argmax, 1.0, 1, 1, 1, 33, 8192, 8192)
    assert g[0, -1, -5, -7].item() == 1.0 and g.float().sum().item() == 33.0
    del g
    torch.cuda.empty_cache()


# ---------------------------------------------------------------------- deform_conv2d
# (every backend against the reference: test_deform_conv2d.py; CUDA's particular concerns
# here and in the emulation's section below)


def check_deform_chunk_loop(ops_, device=None):
    """37 images: a chunk of 32 and a short one (kMaxImagesPerChunk), against the CPU op."""
    t, args = deform_inputs(batch=37, cin=2, cout=2, size=(5, 5), groups=1, offset_groups=1)
    values = list(t.values())
    moved = [v.to(device) for v in values] if device else values
    expected = ops.deform_conv2d(*values, *args, True)
    torch.testing.assert_close(ops_.deform_conv2d(*moved, *args, True).cpu(), expected, **tolerance(torch.float64))
    grad = feature_map(expected.shape, torch.float64, seed=5)
    got = ops_._deform_conv2d_backward(grad.to(device) if device else grad, *moved, *args, True)
    want = ops._deform_conv2d_backward(grad, *values, *args, True)
    for name, a, b in zip(["input", "weight", "offset", "mask", "bias"], got, want):
        torch.testing.assert_close(a.cpu(), b, **tolerance(torch.float64), msg=f"grad of {name}")


@device_test
def test_deform_conv2d_chunk_loop_matches_cpu():
    check_deform_chunk_loop(ops, "cuda")


@device_test
def test_deform_conv2d_gradcheck_on_cuda():
    t, args = deform_inputs(batch=1, cin=2, cout=2, size=(4, 4), groups=1, offset_groups=1, stride=(1, 1),
                            pad=(1, 1), dilation=(1, 1), seed=7)
    inputs = [v.cuda().requires_grad_() for v in t.values()]
    # nondet_tol: col2im's float64 atomic adds may sum in any order.
    assert torch.autograd.gradcheck(lambda *a: ops.deform_conv2d(*a, *args, True), inputs, nondet_tol=1e-12)


@device_test
@pytest.mark.parametrize("dtype", HALF_TYPES)
def test_deform_conv2d_autocast_returns_input_dtype(dtype):
    t, args = deform_inputs(dtype=dtype, seed=9)
    gpu = to(t, "cuda")
    with torch.autocast("cuda", dtype=dtype):
        got = deform_call(gpu, args)
    assert got.dtype == dtype
    expected = deform_call({k: v.float() for k, v in gpu.items()}, args).to(dtype)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


@device_test
def test_deform_conv2d_bad_input_names_the_problem():
    t, args = deform_inputs()
    gpu = to(t, "cuda")
    with pytest.raises(RuntimeError, match="offset"):
        ops.deform_conv2d(gpu["input"], gpu["weight"], gpu["offset"][:, :-1], gpu["mask"], gpu["bias"], *args, True)
    with pytest.raises(RuntimeError, match="device"):
        ops.deform_conv2d(gpu["input"], gpu["weight"].cpu(), gpu["offset"], gpu["mask"], gpu["bias"], *args, True)


# ------------------------------------------------------------- autocast nms, gradcheck


@device_test
@pytest.mark.parametrize("dtype", HALF_TYPES)
def test_nms_autocast_runs_in_float(dtype):
    boxes, scores = random_boxes(500, dtype=dtype, device="cuda", seed=11)
    with torch.autocast("cuda", dtype=dtype):
        got = ops.nms(boxes, scores, 0.5)
    torch.testing.assert_close(got, ops.nms(boxes.float(), scores.float(), 0.5))


@device_test
def test_roi_align_gradcheck_on_cuda():
    x = feature_map((1, 2, 6, 6), torch.float64, "cuda").requires_grad_()
    rois = random_rois(4, 1, 6, 6, torch.float64, "cuda")
    assert torch.autograd.gradcheck(lambda a: ops.roi_align(a, rois, 1.0, 2, 2, 2, True), (x,), nondet_tol=1e-12)


# -------------------------------------------------------------------------- determinism


def _roi_align_backward_call():
    x = feature_map((1, 2, 8, 8), device="cuda").requires_grad_()
    rois = random_rois(6, 1, 8, 8, device="cuda")
    out = ops.roi_align(x, rois, 1.0, 2, 2, 2, False)
    return torch.autograd.grad(out.sum(), x)[0]


def _roi_pool_backward_call():
    x = feature_map((1, 2, 8, 8), device="cuda").requires_grad_()
    rois = random_rois(6, 1, 8, 8, device="cuda")
    out, _ = ops.roi_pool(x, rois, 1.0, 2, 2)
    return torch.autograd.grad(out.sum(), x)[0]


def _deform_backward_call():
    t, args = deform_inputs(dtype=torch.float32)
    gpu = {k: v.cuda().requires_grad_() for k, v in t.items()}
    return torch.autograd.grad(deform_call(gpu, args).sum(), gpu["input"])[0]


BACKWARDS = {
    "roi_align_backward_cuda": _roi_align_backward_call,
    "roi_pool_backward_cuda": _roi_pool_backward_call,
    "deform_conv2d_backward_cuda": _deform_backward_call,
}


@pytest.fixture
def deterministic_mode(monkeypatch):
    # deform_conv2d's GEMMs go through cuBLAS, which deterministic mode accepts only with this set.
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    saved = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    yield
    torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])


@device_test
@pytest.mark.parametrize("name", list(BACKWARDS))
def test_atomic_backward_refuses_deterministic_mode(name, deterministic_mode):
    torch.use_deterministic_algorithms(True)
    with pytest.raises(RuntimeError, match=name):
        BACKWARDS[name]()


@device_test
@pytest.mark.parametrize("name", list(BACKWARDS))
def test_atomic_backward_warns_in_warn_only_mode_and_still_computes(name, deterministic_mode):
    expected = BACKWARDS[name]()
    torch.use_deterministic_algorithms(True, warn_only=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = BACKWARDS[name]()
    assert any(name in str(w.message) for w in caught)
    torch.testing.assert_close(got, expected)


@device_test
def test_forward_ops_run_in_deterministic_mode(deterministic_mode):
    torch.use_deterministic_algorithms(True)
    boxes, scores = random_boxes(2000, device="cuda")
    assert torch.equal(ops.nms(boxes, scores, 0.5), ops.nms(boxes, scores, 0.5))
    x = feature_map((1, 2, 8, 8), device="cuda")
    rois = random_rois(6, 1, 8, 8, device="cuda")
    assert torch.equal(ops.roi_align(x, rois, 1.0, 2, 2, 2, False), ops.roi_align(x, rois, 1.0, 2, 2, 2, False))


# The stable ABI has no at::globalContext().alertNotDeterministic: a stable build's Python
# autograd backward raises it for CUDA tensors instead (ops/_dispatch.py alert_cuda_atomics).
# No GPU needed: fake CUDA tensors reach the check, and ATen's own alert (put_ on the CPU)
# gives the words both builds must use. Every backward op (ops_table.py) adds with atomics on
# CUDA; `_<op>_backward` alerts as `<op>_backward_cuda`.
ATOMIC_BACKWARDS = [f"{op[1:]}_cuda" for op in BACKWARD_OPS]


class _SavedContext:
    """What a setup_context calls on its ctx, recorded: saved tensors and attributes."""

    saved_tensors: tuple = ()

    def save_for_backward(self, *tensors):
        self.saved_tensors = tensors

    def mark_non_differentiable(self, *tensors):
        pass

    def set_materialize_grads(self, value):
        pass


def _recorded_backward(name):
    """(backward, ctx, outputs): the Python gradient formula of the op whose CUDA backward
    alerts as `name` (registered in a stable build; a legacy one runs csrc/autograd's twin),
    and its setup_context's record of a call on real CPU tensors as the op's smoke recipe
    makes it (extension/recipes.py). (Recording on fake CUDA tensors would need a CUDA
    runtime.) The op's own arguments are caught below autograd by a dispatch mode."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from opforge_ops.ops._dispatch import AUTOGRAD_FORMULAS

    op = name.removesuffix("_backward_cuda")
    recipe = recipes()[op]
    calls = []

    class Capture(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func.namespace == "opforge" and func.__name__.split(".")[0] == op:
                calls.append((args, out))
            return out

    with Capture():
        getattr(ops, op)(*recipe["inputs"](torch.float32))
    (args, out), = calls
    backward, setup_context = AUTOGRAD_FORMULAS[op]
    ctx = _SavedContext()
    setup_context(ctx, args, out)
    return backward, ctx, tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _stable_backward_case(recorded, device):
    """(backward, ctx, grads): the recorded formula, a context holding what its setup_context
    saved with every tensor a fake `device` tensor, and a grad for each floating-point output
    (call under FakeTensorMode)."""
    backward, saved, outputs = recorded

    def fake(value):
        if not isinstance(value, torch.Tensor):
            return value
        return torch.empty(value.shape, dtype=value.dtype, device=device)

    ctx = SimpleNamespace(**{key: fake(value) for key, value in vars(saved).items()})
    ctx.saved_tensors = tuple(fake(t) for t in saved.saved_tensors)
    grads = tuple(fake(o) if o.is_floating_point() else None for o in outputs)
    return backward, ctx, grads


@pytest.mark.parametrize("name", ATOMIC_BACKWARDS)
@pytest.mark.parametrize("stable", [True, False], ids=["stable", "legacy"])
def test_stable_build_alerts_from_python_with_atens_words(name, stable, deterministic_mode, monkeypatch):
    from torch._subclasses.fake_tensor import FakeTensorMode

    from opforge_ops.ops import _dispatch

    monkeypatch.setattr(_dispatch, "_STABLE", [stable])
    torch.use_deterministic_algorithms(True)
    with pytest.raises(RuntimeError) as aten:
        torch.zeros(3).put_(torch.tensor([0]), torch.tensor([1.0]))
    expected = str(aten.value).replace("put_", f"opforge::{name}", 1)
    recorded = _recorded_backward(name)
    with FakeTensorMode():
        backward, ctx, grads = _stable_backward_case(recorded, "cuda")
        if stable:
            with pytest.raises(RuntimeError) as ours:
                backward(ctx, *grads)
            assert str(ours.value) == expected
        torch.use_deterministic_algorithms(True, warn_only=True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            backward(ctx, *grads)  # the fake kernel runs after the warning
    # a legacy library's CUDA kernel alerts itself: nothing from Python
    assert [str(w.message) for w in caught if "deterministic" in str(w.message)] == ([expected] if stable else [])
    with FakeTensorMode():
        backward, ctx, grads = _stable_backward_case(recorded, "cpu")
        torch.use_deterministic_algorithms(True)
        backward(ctx, *grads)  # the CPU kernels are deterministic: no alert in either build


# ------------------------------------------------------------------------------ streams


def _stream_cases():
    boxes, scores = random_boxes(3000, seed=12)
    x = feature_map((2, 3, 16, 16))
    rois = random_rois(50, 2, 16, 16)
    t, args = deform_inputs(dtype=torch.float32, seed=13)
    return {
        "nms": ((boxes, scores), lambda b, s: ops.nms(b, s, 0.5)),
        "roi_align": ((x, rois), lambda a, r: ops.roi_align(a, r, 1.0, 3, 3, 2, True)),
        "roi_pool": ((x, rois), lambda a, r: ops.roi_pool(a, r, 1.0, 3, 3)[0]),
        "deform_conv2d": (tuple(t.values()), lambda *a: ops.deform_conv2d(*a, *args, True)),
        "deform_conv2d_backward": (
            tuple(t.values()),
            lambda *a: ops._deform_conv2d_backward(torch.ones_like(ops.deform_conv2d(*a, *args, True)), *a, *args, True)[0],
        ),
    }


@device_test
@pytest.mark.parametrize("case", list(_stream_cases()))
def test_kernels_run_on_the_current_stream(case):
    """Inputs are written on a side stream behind a long sleep. A kernel launched on the
    default stream would not wait for them and would read the zeros that are there first."""
    host_inputs, fn = _stream_cases()[case]
    expected = fn(*(h.cuda() for h in host_inputs))
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        inputs = [torch.zeros_like(h, device="cuda") for h in host_inputs]
        pinned = [h.pin_memory() for h in host_inputs]
    side.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time on this stream
        for dst, src in zip(inputs, pinned):
            dst.copy_(src, non_blocking=True)
        got = fn(*inputs)
    # Nothing was queued on the default stream: it is idle although the side stream is busy.
    assert torch.cuda.default_stream().query()
    side.synchronize()
    torch.testing.assert_close(got, expected)


# ------------------------------------------------------------------------ empty inputs


def _empty_calls():
    d = "cuda"
    x = torch.randn(1, 3, 8, 8, device=d)
    no_rois = torch.empty(0, 5, device=d)
    t, args = deform_inputs(batch=0, dtype=torch.float32)
    t = to(t, d)
    return {
        "nms": lambda: ops.nms(torch.empty(0, 4, device=d), torch.empty(0, device=d), 0.5),
        "roi_align": lambda: ops.roi_align(x, no_rois, 1.0, 2, 2, 0, False),
        "roi_align_backward": lambda: ops._roi_align_backward(
            torch.empty(0, 3, 2, 2, device=d), no_rois, 1.0, 2, 2, 1, 3, 8, 8, 0, False),
        "roi_pool": lambda: ops.roi_pool(x, no_rois, 1.0, 2, 2),
        "roi_pool_backward": lambda: ops._roi_pool_backward(
            torch.empty(0, 3, 2, 2, device=d), no_rois, torch.empty(0, 3, 2, 2, dtype=torch.int32, device=d),
            1.0, 2, 2, 1, 3, 8, 8),
        "deform_conv2d": lambda: deform_call(t, args),
        "deform_conv2d_backward": lambda: ops._deform_conv2d_backward(
            torch.empty(0, 6, *deform_call(t, args).shape[2:], device=d), *t.values(), *args, True),
    }


@device_test
@pytest.mark.parametrize("case", ["nms", "roi_align", "roi_align_backward", "roi_pool",
                                  "roi_pool_backward", "deform_conv2d", "deform_conv2d_backward"])
def test_empty_inputs_launch_no_opforge_kernel(case):
    call = _empty_calls()[case]
    call()  # warm up lazy initialisation outside the profile
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    launched = [e.name for e in prof.events()
                if e.device_type == torch.autograd.DeviceType.CUDA and "opforge" in e.name]
    assert launched == []


# ------------------------------------------- the CUDA sources, emulated on the CPU
#
# No GPU is needed for this part: tests/cuda_emu compiles the kernel files in csrc/cuda
# (kernels and their host wrappers, unchanged) as host C++, runs every launch one
# (block, thread) at a time on an emulated one-SM device, and registers them as
# torch.ops.opforge_cuda_emu (and, built against the stable ABI as the cu130_stable wheel is,
# torch.ops.opforge_cuda_emu_stable). Every op's tests run there as the cuda_emu and
# cuda_stable_emu backends of its own test file (tests/backends.py); here: what is particular to
# the emulated CUDA files, in both builds.

import cuda_emu  # noqa: E402


@pytest.fixture(scope="module", params=cuda_emu.ABIS)
def emu(request):
    import shutil

    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("no C++ compiler to build the CPU emulation of the CUDA kernels")
    return cuda_emu.load(request.param)


EMU_DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]


def emu_tolerance(dtype):
    return dict(rtol=1e-5, atol=1e-5) if dtype in (torch.float32, torch.float64) else {}


def test_emulated_roi_kernels_read_nothing_for_a_roi_the_cpu_rejects(emu):
    # No host copy of the rois (a sync per call): a bad batch index, a non-finite
    # coordinate or a roi needing more than 2^24 samples reads nothing and yields 0.
    x = feature_map((1, 3, 8, 8)) + 5
    rois = torch.tensor([[1.0, 0, 0, 4, 4], [-1.0, 0, 0, 4, 4], [0.0, float("nan"), 0, 4, 4],
                         [0.0, 0, 0, 1e9, 1e9], [0.0, 1, 1, 5, 5]])
    out = emu.roi_align(x, rois, 1.0, 2, 2, 0, False)
    assert not out[:4].any() and out[4].all()
    pooled, argmax = emu.roi_pool(x, rois[:3], 1.0, 2, 2)
    assert not pooled.any() and (argmax == -1).all()
    grad = emu._roi_align_backward(torch.ones(4, 3, 2, 2), rois[:4], 1.0, 2, 2, 1, 3, 8, 8, 0, False)
    assert not grad.any()


def test_emulated_nms_runs_blocks_of_threads_that_meet_at_barriers(emu):
    # nms_mask_kernel's threads each load one column box into shared memory and compare
    # against all 64 after __syncthreads: one thread at a time, they would read boxes not
    # yet loaded (cuda_emu runs such a kernel's blocks as threads meeting at a barrier).
    boxes, scores = random_boxes(700, seed=3)
    before = emu._launches()
    torch.testing.assert_close(emu.nms(boxes, scores, 0.5), ops.nms(boxes, scores, 0.5), rtol=0, atol=0)
    assert emu._launches() == before + 2  # the mask kernel, then the reduce


def test_emulated_deform_conv2d_chunk_loop_matches_cpu(emu):
    check_deform_chunk_loop(emu)


def test_emulated_kernels_launch_nothing_for_empty_inputs(emu):
    before = emu._launches()
    assert emu.nms(torch.empty(0, 4), torch.empty(0), 0.5).shape == (0,)
    out = emu.roi_align(feature_map((1, 3, 8, 8)), torch.empty(0, 5), 1.0, 2, 2, 0, False)
    assert out.shape == (0, 3, 2, 2)
    emu._roi_pool_backward(torch.empty(0, 3, 2, 2), torch.empty(0, 5), torch.empty(0, 3, 2, 2, dtype=torch.int32),
                          1.0, 2, 2, 1, 3, 8, 8)
    t, args = deform_inputs(batch=0)
    assert emu.deform_conv2d(*t.values(), *args, True).shape[0] == 0
    assert emu._launches() == before
