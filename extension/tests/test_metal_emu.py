"""Every csrc/metal/*.metal kernel, run on the CPU through tests/metal_emu.

The kernels run with the grid and threadgroup sizes that csrc/metal/dispatch.h
gives the MPS host code, over buffers sized exactly (address sanitizer on), and
are compared with the CPU op (torch.ops.opforge.* when the extension is built)
or, without it, with the slow references below.  What this cannot cover is
listed in the closing note of the Metal work (Apple's compiler, fast math,
SIMD-group semantics, the GPU memory model); the macOS CI job compiles and
runs the real thing.
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import shutil
import subprocess

import numpy as np
import pytest
import torch
from metal_emu import harness

import opforge_ops  # noqa: F401  (its CPU kernels are the reference)

pytestmark = pytest.mark.skipif(
    shutil.which(harness.CXX) is None, reason=f"needs a C++20 compiler ({harness.CXX})"
)



METAL_OPS = sorted(p.stem for p in harness.METAL_DIR.glob("*.metal"))


@pytest.fixture(scope="module")
def geo() -> harness.Geometry:
    return harness.Geometry()


_BUILT: dict[str, harness.Emulated] = {}


def emu(op: str) -> harness.Emulated:
    """Compiled once per session (and cached on disk by source hash)."""
    if op not in _BUILT:
        _BUILT[op] = harness.build(op)
    return _BUILT[op]


@pytest.fixture(scope="module", autouse=True)
def _compile_kernels_in_parallel():
    # Compiling dominates this file's run time; use every core once up front.
    ops = METAL_OPS
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        list(pool.map(emu, ops))


def np_of(t: torch.Tensor) -> np.ndarray:
    return t.detach().contiguous().numpy().copy()


DTYPE = {torch.float32: "float", torch.float16: "half"}


# ----------------------------------------------------------- references
# The built extension's CPU kernels (conftest imports it); the slow references they are
# themselves tested against live in each op's test_<op>.py (`reference`).
def ref_roi_align(input, rois, scale, ph_, pw_, sampling, aligned):
    return torch.ops.opforge.roi_align(input, rois, scale, ph_, pw_, sampling, aligned)


def ref_roi_pool(input, rois, scale, ph_, pw_):
    return torch.ops.opforge.roi_pool(input, rois, scale, ph_, pw_)


def ref_nms(boxes, scores, thr):
    return torch.ops.opforge.nms(boxes, scores, thr)


def ref_deform_conv2d(x, w, off, mask, bias, stride, pad, dil, groups, offset_groups, use_mask):
    return torch.ops.opforge.deform_conv2d(
        x, w, off, mask, bias, *stride, *pad, *dil, groups, offset_groups, use_mask
    )


# --------------------------------------------------------- emulated ops
def make_rois(gen, K, batch, H, W, scale=1.0, min_size=0.5):
    b = torch.randint(0, batch, (K, 1), generator=gen).float()
    x1 = torch.rand(K, 1, generator=gen) * (W / scale) * 0.8
    y1 = torch.rand(K, 1, generator=gen) * (H / scale) * 0.8
    x2 = x1 + min_size + torch.rand(K, 1, generator=gen) * (W / scale) * 0.6
    y2 = y1 + min_size + torch.rand(K, 1, generator=gen) * (H / scale) * 0.6
    return torch.cat([b, x1, y1, x2, y2], 1)


def emu_roi_align_forward(geo, input, rois, scale, PH, PW, sampling, aligned, max_threads=1024):
    K, (_, C, H, W) = rois.shape[0], input.shape
    total = K * C * PH * PW
    p = geo.params(
        "OpfRoiAlignParams",
        total=total,
        channels=C,
        height=H,
        width=W,
        pooled_height=PH,
        pooled_width=PW,
        sampling_ratio=sampling,
        spatial_scale=scale,
        aligned=int(aligned),
    )
    out = np.zeros((K, C, PH, PW), dtype=np_of(input).dtype)
    g = geo.dispatch_1d(total, max_threads)
    emu("roi_align").launch(
        f"roi_align_forward_{DTYPE[input.dtype]}",
        g,
        {
            geo.buffer("OPF_ROI_ALIGN_FWD_BUF_INPUT"): np_of(input),
            geo.buffer("OPF_ROI_ALIGN_FWD_BUF_ROIS"): np_of(rois),
            geo.buffer("OPF_ROI_ALIGN_FWD_BUF_OUTPUT"): out,
            geo.buffer("OPF_ROI_ALIGN_FWD_BUF_PARAMS"): harness.params_bytes(p),
        },
    )
    return torch.from_numpy(out), g


def emu_roi_align_backward(
    geo,
    grad,
    rois,
    scale,
    PH,
    PW,
    batch,
    C,
    H,
    W,
    sampling,
    aligned,
    kernel=None,
    module=None,
    max_threads=1024,
):
    total = grad.numel()
    s = grad.stride()
    p = geo.params(
        "OpfRoiAlignParams",
        total=total,
        channels=C,
        height=H,
        width=W,
        pooled_height=PH,
        pooled_width=PW,
        sampling_ratio=sampling,
        spatial_scale=scale,
        aligned=int(aligned),
        grad_stride_n=s[0],
        grad_stride_c=s[1],
        grad_stride_h=s[2],
        grad_stride_w=s[3],
    )
    grad_input = np.zeros((batch, C, H, W), dtype=np.float32)
    # Strided grad: hand the kernel the underlying storage, as the MPS host code does.
    storage = grad.detach().as_strided(
        (grad.untyped_storage().nbytes() // grad.element_size(),), (1,), 0
    )
    g = geo.dispatch_1d(total, max_threads)
    (module or emu("roi_align")).launch(
        kernel or f"roi_align_backward_{DTYPE[grad.dtype]}",
        g,
        {
            geo.buffer("OPF_ROI_ALIGN_BWD_BUF_GRAD"): storage.numpy().copy(),
            geo.buffer("OPF_ROI_ALIGN_BWD_BUF_ROIS"): np_of(rois),
            geo.buffer("OPF_ROI_ALIGN_BWD_BUF_GRAD_INPUT"): grad_input,
            geo.buffer("OPF_ROI_ALIGN_BWD_BUF_PARAMS"): harness.params_bytes(p),
        },
    )
    return torch.from_numpy(grad_input), g


# ------------------------------------------------------------ roi_align
@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize("sampling", [0, 2])
def test_roi_align_forward_matches_cpu_over_many_threadgroups(geo, aligned, sampling):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 11, 13, generator=gen)
    rois = make_rois(gen, 40, 2, 11, 13, scale=0.5)
    rois[0, 1:] = torch.tensor([-3.0, -3.0, 30.0, 30.0])  # samples outside the map
    out, g = emu_roi_align_forward(geo, x, rois, 0.5, 5, 4, sampling, aligned)
    assert g.groups[0] > 1, "the test must span several threadgroups"
    torch.testing.assert_close(
        out, ref_roi_align(x, rois, 0.5, 5, 4, sampling, aligned), rtol=1e-5, atol=1e-5
    )


def _check_roi_align_backward(geo, kernel=None, module=None):
    gen = torch.Generator().manual_seed(2)
    B, C, H, W, PH, PW = 2, 2, 9, 10, 4, 4
    x = torch.randn(B, C, H, W, generator=gen, requires_grad=True)
    rois = make_rois(gen, 300, B, H, W)  # 9600 grad elements: 38 threadgroups of 256
    ref_out = ref_roi_align(x, rois, 1.0, PH, PW, 2, False)
    grad = torch.randn(ref_out.shape, generator=gen)
    (ref_grad,) = torch.autograd.grad(ref_out, x, grad)
    got, g = emu_roi_align_backward(
        geo, grad, rois, 1.0, PH, PW, B, C, H, W, 2, False, kernel, module
    )
    assert g.groups[0] * g.groups[1] >= 30
    torch.testing.assert_close(got, ref_grad, rtol=1e-4, atol=1e-4)


def test_roi_align_backward_accumulates_each_roi_once(geo):
    _check_roi_align_backward(geo)


def test_harness_catches_planted_grid_stride_double_count(geo):
    buggy = harness.build(harness.HERE / "buggy" / "roi_align_grid_stride.metal")
    with pytest.raises(AssertionError) as info:
        _check_roi_align_backward(geo, "roi_align_backward_grid_stride_float", buggy)
    assert "Mismatched elements" in str(info.value)


def test_roi_align_backward_with_strided_grad_and_small_pipeline(geo):
    gen = torch.Generator().manual_seed(3)
    B, C, H, W = 1, 3, 8, 8
    x = torch.randn(B, C, H, W, generator=gen, requires_grad=True)
    rois = make_rois(gen, 20, B, H, W)
    ref_out = ref_roi_align(x, rois, 1.0, 3, 3, 0, True)
    grad = torch.randn(3, 3, C, 20, generator=gen).permute(3, 2, 0, 1)  # non-contiguous
    (ref_grad,) = torch.autograd.grad(ref_out, x, grad)
    got, g = emu_roi_align_backward(geo, grad, rois, 1.0, 3, 3, B, C, H, W, 0, True, max_threads=96)
    assert g.threads[0] == 96  # clamped to the pipeline limit, still a SIMD multiple
    torch.testing.assert_close(got, ref_grad, rtol=1e-4, atol=1e-4)


def test_roi_align_half_forward_and_backward_accumulate_in_float(geo):
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(2, 3, 10, 10, generator=gen).half()
    rois = make_rois(gen, 30, 2, 10, 10).half()
    out, _ = emu_roi_align_forward(geo, x, rois, 1.0, 3, 3, 2, True)
    assert out.dtype == torch.float16
    xf = x.float().requires_grad_()
    ref = ref_roi_align(xf, rois.float(), 1.0, 3, 3, 2, True)
    torch.testing.assert_close(out.float(), ref, rtol=1e-2, atol=1e-2)
    grad = torch.randn(ref.shape, generator=gen).half()
    (ref_grad,) = torch.autograd.grad(ref, xf, grad.float())
    got, _ = emu_roi_align_backward(geo, grad, rois, 1.0, 3, 3, 2, 3, 10, 10, 2, True)
    assert got.dtype == torch.float32  # the float32 accumulation buffer the host casts
    torch.testing.assert_close(got, ref_grad, rtol=1e-2, atol=2e-2)


# ------------------------------------------------------------- roi_pool
def emu_roi_pool(geo, x, rois, scale, PH, PW):
    K, (_, C, H, W) = rois.shape[0], x.shape
    total = K * C * PH * PW
    p = geo.params(
        "OpfRoiPoolParams",
        total=total,
        channels=C,
        height=H,
        width=W,
        pooled_height=PH,
        pooled_width=PW,
        spatial_scale=scale,
    )
    out = np.zeros((K, C, PH, PW), dtype=np_of(x).dtype)
    arg = np.zeros((K, C, PH, PW), dtype=np.int32)
    emu("roi_pool").launch(
        f"roi_pool_forward_{DTYPE[x.dtype]}",
        geo.dispatch_1d(total),
        {
            geo.buffer("OPF_ROI_POOL_FWD_BUF_INPUT"): np_of(x),
            geo.buffer("OPF_ROI_POOL_FWD_BUF_ROIS"): np_of(rois),
            geo.buffer("OPF_ROI_POOL_FWD_BUF_OUTPUT"): out,
            geo.buffer("OPF_ROI_POOL_FWD_BUF_ARGMAX"): arg,
            geo.buffer("OPF_ROI_POOL_FWD_BUF_PARAMS"): harness.params_bytes(p),
        },
    )
    return torch.from_numpy(out), torch.from_numpy(arg)


def emu_roi_pool_backward(geo, grad, rois, argmax, B, C, H, W):
    total = grad.numel()
    s = grad.stride()
    K, _, PH, PW = grad.shape
    p = geo.params(
        "OpfRoiPoolParams",
        total=total,
        channels=C,
        height=H,
        width=W,
        pooled_height=PH,
        pooled_width=PW,
        spatial_scale=1.0,
        grad_stride_n=s[0],
        grad_stride_c=s[1],
        grad_stride_h=s[2],
        grad_stride_w=s[3],
    )
    gi = np.zeros((B, C, H, W), dtype=np.float32)
    g = geo.dispatch_1d(total)
    emu("roi_pool").launch(
        f"roi_pool_backward_{DTYPE[grad.dtype]}",
        g,
        {
            geo.buffer("OPF_ROI_POOL_BWD_BUF_GRAD"): np_of(grad),
            geo.buffer("OPF_ROI_POOL_BWD_BUF_ROIS"): np_of(rois),
            geo.buffer("OPF_ROI_POOL_BWD_BUF_ARGMAX"): np_of(argmax),
            geo.buffer("OPF_ROI_POOL_BWD_BUF_GRAD_INPUT"): gi,
            geo.buffer("OPF_ROI_POOL_BWD_BUF_PARAMS"): harness.params_bytes(p),
        },
    )
    return torch.from_numpy(gi), g


def test_roi_pool_forward_and_argmax_match_cpu(geo):
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(2, 3, 12, 9, generator=gen)
    rois = make_rois(gen, 25, 2, 24, 18, scale=0.5)
    rois[0, 1:] = torch.tensor([30.0, 30.0, 40.0, 40.0])  # off the map: empty bins
    out, arg = emu_roi_pool(geo, x, rois, 0.5, 3, 4)
    ref_out, ref_arg = ref_roi_pool(x, rois, 0.5, 3, 4)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(arg, ref_arg)
    assert (arg[0] == -1).all() and (out[0] == 0).all()


def test_roi_pool_backward_many_rois_many_threadgroups(geo):
    gen = torch.Generator().manual_seed(6)
    B, C, H, W = 2, 2, 8, 8
    x = torch.randn(B, C, H, W, generator=gen)
    rois = make_rois(gen, 400, B, H, W)
    out, arg = emu_roi_pool(geo, x, rois, 1.0, 3, 3)
    grad = torch.randn(out.shape, generator=gen)
    got, g = emu_roi_pool_backward(geo, grad, rois, arg, B, C, H, W)
    assert g.groups[0] >= 28
    ref = torch.zeros(B, C, H * W)
    for k in range(rois.shape[0]):
        b = int(rois[k, 0])
        for c in range(C):
            a = arg[k, c].flatten()
            ok = a >= 0
            ref[b, c].index_add_(0, a[ok].long(), grad[k, c].flatten()[ok])
    torch.testing.assert_close(got, ref.view(B, C, H, W), rtol=1e-5, atol=1e-5)
    cpu = torch.ops.opforge._roi_pool_backward(grad, rois, arg, 1.0, 3, 3, B, C, H, W)
    torch.testing.assert_close(got, cpu, rtol=1e-5, atol=1e-5)


def test_roi_pool_half(geo):
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(1, 2, 10, 10, generator=gen).half()
    rois = make_rois(gen, 12, 1, 10, 10).half()
    out, arg = emu_roi_pool(geo, x, rois, 1.0, 2, 2)
    ref_out, ref_arg = ref_roi_pool(x.float(), rois.float(), 1.0, 2, 2)
    torch.testing.assert_close(out.float(), ref_out)
    torch.testing.assert_close(arg, ref_arg)
    got, _ = emu_roi_pool_backward(geo, torch.ones_like(out), rois, arg, 1, 2, 10, 10)
    assert got.sum().item() == pytest.approx(float((arg >= 0).sum()))


# ------------------------------------------------------------------ nms
def emu_nms(geo, boxes, scores, thr, reduce_threads=1024):
    n = boxes.shape[0]
    order = torch.argsort(scores, descending=True, stable=True)
    sorted_boxes = boxes[order].contiguous()
    blocks = geo.nms_col_blocks(n)
    p = geo.params("OpfNmsParams", num_boxes=n, col_blocks=blocks, iou_threshold=thr)
    mask = np.zeros(n * blocks, dtype=np.uint64)
    m = emu("nms")
    mask_dispatch = geo.dispatch_nms_mask(n)
    m.launch(
        f"nms_mask_{DTYPE[boxes.dtype]}",
        mask_dispatch,
        {
            geo.buffer("OPF_NMS_MASK_BUF_BOXES"): np_of(sorted_boxes),
            geo.buffer("OPF_NMS_MASK_BUF_MASK"): mask,
            geo.buffer("OPF_NMS_MASK_BUF_PARAMS"): harness.params_bytes(p),
        },
    )
    keep = np.full(n, -7, dtype=np.int64)
    num = np.zeros(1, dtype=np.int64)
    removed = np.full(blocks, 0xDEADBEEF, dtype=np.uint64)  # the kernel must clear it
    m.launch(
        "nms_reduce",
        geo.dispatch_nms_reduce(reduce_threads),
        {
            geo.buffer("OPF_NMS_REDUCE_BUF_MASK"): mask,
            geo.buffer("OPF_NMS_REDUCE_BUF_ORDER"): np_of(order),
            geo.buffer("OPF_NMS_REDUCE_BUF_KEEP"): keep,
            geo.buffer("OPF_NMS_REDUCE_BUF_NUM_KEEP"): num,
            geo.buffer("OPF_NMS_REDUCE_BUF_REMOVED"): removed,
            geo.buffer("OPF_NMS_REDUCE_BUF_PARAMS"): harness.params_bytes(p),
        },
    )
    return torch.from_numpy(keep[: int(num[0])].copy()), mask_dispatch


def random_boxes(gen, n, extent=100.0, size=20.0):
    xy = torch.rand(n, 2, generator=gen) * extent
    wh = torch.rand(n, 2, generator=gen) * size + 0.5
    return torch.cat([xy, xy + wh], 1)


@pytest.mark.parametrize(
    "n,thr,reduce_threads",
    [(1, 0.5, 1024), (63, 0.5, 1024), (300, 0.3, 1024), (700, 0.5, 1024), (700, 0.7, 4)],
)
def test_nms_matches_cpu_across_tiles_and_threadgroups(geo, n, thr, reduce_threads):
    gen = torch.Generator().manual_seed(n)
    boxes = random_boxes(gen, n)
    scores = torch.rand(n, generator=gen)
    keep, d = emu_nms(geo, boxes, scores, thr, reduce_threads)
    if n > 64:
        assert d.groups[0] > 1 and d.groups[1] > 1
    assert torch.equal(keep, ref_nms(boxes, scores, thr))


def test_nms_suppression_chain_crosses_tiles(geo):
    # Box i overlaps box i+1 only: greedy keeps every other box, and each
    # decision depends on the previous tile's survivors.
    n = 200
    x = torch.arange(n, dtype=torch.float32) * 0.5
    boxes = torch.stack([x, torch.zeros(n), x + 1.0, torch.ones(n)], 1)
    scores = torch.linspace(1.0, 0.0, n)
    keep, _ = emu_nms(geo, boxes, scores, 0.3)
    assert torch.equal(keep, torch.arange(0, n, 2))
    assert torch.equal(keep, ref_nms(boxes, scores, 0.3))


def test_nms_reduce_ignores_extra_threadgroups(geo):
    # A host that dispatched the single-threadgroup scan over several
    # threadgroups must not get boxes kept twice.
    gen = torch.Generator().manual_seed(8)
    boxes, scores = random_boxes(gen, 200), torch.rand(200, generator=gen)
    good, _ = emu_nms(geo, boxes, scores, 0.5)
    real = geo.dispatch_nms_reduce
    try:
        geo.dispatch_nms_reduce = lambda t=1024: harness.Dispatch((3, 1, 1), real(t).threads)
        keep, _ = emu_nms(geo, boxes, scores, 0.5)
    finally:
        geo.dispatch_nms_reduce = real
    assert torch.equal(keep, good)


def test_nms_half_boxes(geo):
    gen = torch.Generator().manual_seed(9)
    boxes = random_boxes(gen, 150).half()
    scores = torch.rand(150, generator=gen)
    keep, _ = emu_nms(geo, boxes, scores, 0.5)
    assert torch.equal(keep, ref_nms(boxes.float(), scores, 0.5))


# --------------------------------------------------------- deform_conv2d
def deform_params(geo, x, w, stride, pad, dil, offset_groups, use_mask):
    B, C, H, W = x.shape
    _, _, KH, KW = w.shape
    OH = (H + 2 * pad[0] - (dil[0] * (KH - 1) + 1)) // stride[0] + 1
    OW = (W + 2 * pad[1] - (dil[1] * (KW - 1) + 1)) // stride[1] + 1
    return geo.params(
        "OpfDeformParams",
        total=0,
        batch=B,
        channels=C,
        height=H,
        width=W,
        out_h=OH,
        out_w=OW,
        kernel_h=KH,
        kernel_w=KW,
        stride_h=stride[0],
        stride_w=stride[1],
        pad_h=pad[0],
        pad_w=pad[1],
        dilation_h=dil[0],
        dilation_w=dil[1],
        offset_groups=offset_groups,
        use_mask=int(use_mask),
    )


def emu_deform_forward(geo, x, w, off, mask, bias, stride, pad, dil, groups, og, use_mask):
    """im2col on the emulated kernel, then the GEMM the host does with ATen."""
    p = deform_params(geo, x, w, stride, pad, dil, og, use_mask)
    B, C, OC, KH, KW = x.shape[0], x.shape[1], w.shape[0], w.shape[2], w.shape[3]
    p.total = geo.deform_items("im2col", p)
    cols = np.zeros((C * KH * KW, B * p.out_h * p.out_w), dtype=np_of(x).dtype)
    emu("deform_conv2d").launch(
        f"deform_im2col_{DTYPE[x.dtype]}",
        geo.dispatch_1d(p.total),
        {
            geo.buffer("OPF_DEFORM_IM2COL_BUF_INPUT"): np_of(x),
            geo.buffer("OPF_DEFORM_IM2COL_BUF_OFFSET"): np_of(off),
            geo.buffer("OPF_DEFORM_IM2COL_BUF_MASK"): np_of(mask)
            if use_mask
            else np.zeros(1, np_of(x).dtype),
            geo.buffer("OPF_DEFORM_IM2COL_BUF_COLUMNS"): cols,
            geo.buffer("OPF_DEFORM_IM2COL_BUF_PARAMS"): harness.params_bytes(p),
        },
    )
    columns = torch.from_numpy(cols).float()
    out = torch.bmm(
        w.float().reshape(groups, OC // groups, -1), columns.view(groups, -1, columns.shape[1])
    )
    out = out.reshape(OC, B, p.out_h, p.out_w).transpose(0, 1) + bias.float().view(1, -1, 1, 1)
    return out, columns, p


def emu_deform_backward(geo, grad, x, w, off, mask, stride, pad, dil, groups, og, use_mask):
    _, columns, p = emu_deform_forward(
        geo, x, w, off, mask, torch.zeros(w.shape[0]), stride, pad, dil, groups, og, use_mask
    )
    OC = w.shape[0]
    dt = np_of(x).dtype
    g_out = grad.float().transpose(0, 1).reshape(groups, OC // groups, -1)
    grad_cols = torch.bmm(
        w.float().reshape(groups, OC // groups, -1).transpose(1, 2), g_out
    ).reshape(columns.shape)
    grad_cols_np = grad_cols.to(x.dtype).numpy().copy()
    mask_np = np_of(mask) if use_mask else np.zeros(1, dt)
    p.total = geo.deform_items("col2im", p)
    grad_input = np.zeros(tuple(x.shape), dtype=np.float32)
    m = emu("deform_conv2d")
    col2im_dispatch = geo.dispatch_1d(p.total)
    m.launch(
        f"deform_col2im_{DTYPE[x.dtype]}",
        col2im_dispatch,
        {
            geo.buffer("OPF_DEFORM_COL2IM_BUF_COLUMNS"): grad_cols_np,
            geo.buffer("OPF_DEFORM_COL2IM_BUF_OFFSET"): np_of(off),
            geo.buffer("OPF_DEFORM_COL2IM_BUF_MASK"): mask_np,
            geo.buffer("OPF_DEFORM_COL2IM_BUF_GRAD_INPUT"): grad_input,
            geo.buffer("OPF_DEFORM_COL2IM_BUF_PARAMS"): harness.params_bytes(p),
        },
    )
    p.total = geo.deform_items("coord", p)
    grad_offset = np.zeros(tuple(off.shape), dtype=dt)
    grad_mask = np.zeros(tuple(mask.shape) if use_mask else (1,), dtype=dt)
    m.launch(
        f"deform_col2im_coord_{DTYPE[x.dtype]}",
        geo.dispatch_1d(p.total),
        {
            geo.buffer("OPF_DEFORM_COORD_BUF_COLUMNS"): grad_cols_np,
            geo.buffer("OPF_DEFORM_COORD_BUF_INPUT"): np_of(x),
            geo.buffer("OPF_DEFORM_COORD_BUF_OFFSET"): np_of(off),
            geo.buffer("OPF_DEFORM_COORD_BUF_MASK"): mask_np,
            geo.buffer("OPF_DEFORM_COORD_BUF_GRAD_OFFSET"): grad_offset,
            geo.buffer("OPF_DEFORM_COORD_BUF_GRAD_MASK"): grad_mask,
            geo.buffer("OPF_DEFORM_COORD_BUF_PARAMS"): harness.params_bytes(p),
        },
    )
    grad_weight = torch.bmm(
        g_out, columns.view(groups, -1, columns.shape[1]).transpose(1, 2)
    ).reshape(w.shape)
    return (
        torch.from_numpy(grad_input),
        grad_weight,
        torch.from_numpy(grad_offset).float(),
        torch.from_numpy(grad_mask).float(),
        grad.float().sum((0, 2, 3)),
    ), col2im_dispatch


def deform_case(
    gen,
    dtype=torch.float32,
    B=2,
    C=4,
    H=7,
    W=6,
    OC=6,
    K=(3, 3),
    groups=2,
    og=2,
    stride=(1, 1),
    pad=(1, 1),
    dil=(1, 1),
):
    OH = (H + 2 * pad[0] - (dil[0] * (K[0] - 1) + 1)) // stride[0] + 1
    OW = (W + 2 * pad[1] - (dil[1] * (K[1] - 1) + 1)) // stride[1] + 1
    x = torch.randn(B, C, H, W, generator=gen)
    w = torch.randn(OC, C // groups, *K, generator=gen) * 0.3
    off = torch.randn(B, 2 * og * K[0] * K[1], OH, OW, generator=gen) * 1.5
    mask = torch.rand(B, og * K[0] * K[1], OH, OW, generator=gen)
    bias = torch.randn(OC, generator=gen)
    return [t.to(dtype) for t in (x, w, off, mask, bias)]


@pytest.mark.parametrize("use_mask", [True, False])
@pytest.mark.parametrize("stride,pad,dil", [((1, 1), (1, 1), (1, 1)), ((2, 1), (0, 2), (1, 2))])
def test_deform_conv2d_forward_matches_cpu(geo, use_mask, stride, pad, dil):
    gen = torch.Generator().manual_seed(10)
    x, w, off, mask, bias = deform_case(gen, stride=stride, pad=pad, dil=dil)
    out, _, _ = emu_deform_forward(geo, x, w, off, mask, bias, stride, pad, dil, 2, 2, use_mask)
    ref = ref_deform_conv2d(x, w, off, mask, bias, stride, pad, dil, 2, 2, use_mask)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("use_mask", [True, False])
def test_deform_conv2d_backward_matches_autograd_of_reference(geo, use_mask):
    gen = torch.Generator().manual_seed(11)
    x, w, off, mask, bias = deform_case(gen, B=3)
    inputs = [t.clone().requires_grad_() for t in (x, w, off, mask, bias)]
    ref = ref_deform_conv2d(*inputs, (1, 1), (1, 1), (1, 1), 2, 2, use_mask)
    grad = torch.randn(ref.shape, generator=gen)
    ref_grads = torch.autograd.grad(ref, inputs, grad, allow_unused=True)
    got, d = emu_deform_backward(geo, grad, x, w, off, mask, (1, 1), (1, 1), (1, 1), 2, 2, use_mask)
    assert d.groups[0] > 10, "col2im must span many threadgroups"
    names = ["input", "weight", "offset", "mask", "bias"]
    for name, g_ref, g_got in zip(names, ref_grads, got):
        if name == "mask" and not use_mask:
            continue
        torch.testing.assert_close(
            g_got, g_ref, rtol=1e-3, atol=1e-3, msg=lambda m, n=name: f"grad_{n}: {m}"
        )
    cpu = torch.ops.opforge._deform_conv2d_backward(
        grad, x, w, off, mask, bias, 1, 1, 1, 1, 1, 1, 2, 2, use_mask
    )
    for name, c, g_got in zip(names, cpu, got):
        if name == "mask" and not use_mask:
            continue
        torch.testing.assert_close(g_got, c, rtol=1e-3, atol=1e-3)


def test_deform_conv2d_half_backward_accumulates_in_float(geo):
    gen = torch.Generator().manual_seed(12)
    x, w, off, mask, bias = deform_case(gen, dtype=torch.float16)
    inputs = [t.float().requires_grad_() for t in (x, w, off, mask, bias)]
    ref = ref_deform_conv2d(*inputs, (1, 1), (1, 1), (1, 1), 2, 2, True)
    out, _, _ = emu_deform_forward(geo, x, w, off, mask, bias, (1, 1), (1, 1), (1, 1), 2, 2, True)
    torch.testing.assert_close(out, ref, rtol=2e-2, atol=3e-2)
    grad = torch.randn(ref.shape, generator=gen).half()
    ref_grads = torch.autograd.grad(ref, inputs, grad.float())
    got, _ = emu_deform_backward(geo, grad, x, w, off, mask, (1, 1), (1, 1), (1, 1), 2, 2, True)
    assert got[0].dtype == torch.float32
    for g_got, g_ref in zip(got, ref_grads):
        torch.testing.assert_close(g_got, g_ref, rtol=3e-2, atol=6e-2)


# ------------------------------------------- index arithmetic past 2^31
def test_dispatch_gives_one_thread_per_item_past_2_pow_32(geo):
    n = 3 * 2**32 + 17
    d = geo.dispatch_1d(n)
    assert d.total_threads >= n > 2**33
    assert d.total_threads - n < d.threads[0] * d.groups[0]  # at most one row of spare threads
    # The thread of the last item, as the kernel computes its index.
    last_group = (n - 1) // d.threads[0]
    tgid_y, tgid_x = divmod(last_group, d.groups[0])
    assert tgid_y < d.groups[1]
    got = emu("roi_align").probe(
        "linear_index",
        [tgid_x, tgid_y, d.groups[0], d.groups[1], d.threads[0], (n - 1) % d.threads[0]],
        1,
    )
    assert got == [n - 1]


def test_dispatch_refuses_more_than_one_grid(geo):
    with pytest.raises(harness.EmuError):
        geo.dispatch_1d(65535 * 65535 * 256 + 1)


@pytest.mark.parametrize(
    "op,probe", [("roi_align", "roi_align_index"), ("roi_pool", "roi_pool_index")]
)
def test_roi_index_helpers_past_2_pow_31(op, probe):
    C, H, W, PH, PW = 256, 4096, 4096, 7, 7
    K = 1_000_000
    index = K * C * PH * PW - 3  # ~1.25e10 items
    batch = 199
    sn, sc, sh, sw = C * PH * PW, PH * PW, PW, 1
    got = emu(op).probe(probe, [C, H, W, PH, PW, index, batch, sn, sc, sh, sw], 6)
    n, rem = divmod(index, C * PH * PW)
    c, rem = divmod(rem, PH * PW)
    ph, pw = divmod(rem, PW)
    assert got[:4] == [n, c, ph, pw]
    assert got[4] == (batch * C + c) * H * W > 2**39
    assert got[5] == index


def test_nms_mask_word_index_past_2_pow_32():
    n = 4_000_000
    blocks = (n + 63) // 64
    assert emu("nms").probe("nms_mask_word_index", [n - 1, blocks - 1, blocks], 1) == [
        (n - 1) * blocks + blocks - 1
    ]


def test_deform_index_helpers_past_2_pow_31():
    B, C, H, W, OH, OW, KH, KW, OG = 64, 512, 256, 256, 256, 256, 3, 3, 8
    b, c, g, i, j, y, x = 63, 511, 7, 2, 2, 255, 255
    got = emu("deform_conv2d").probe(
        "deform_index", [B, C, H, W, OH, OW, KH, KW, OG, b, c, g, i, j, y, x], 4
    )
    assert got[0] == (b * C + c) * H * W
    assert got[1] == (b * OG + g) * 2 * KH * KW * OH * OW
    assert got[2] == (b * OG + g) * KH * KW * OH * OW
    assert got[3] == (((c * KH + i) * KW + j) * B + b) * OH * OW + y * OW + x
    assert got[3] > 2**34


# --------------------------------------------------- the harness itself
def test_structs_match_cpp_layout(geo):
    # Geometry() already compared every struct with the C++ sizeof; pin the
    # 8-byte-first layout the Metal side relies on.
    for name, cls in geo.structs.items():
        assert harness.ctypes.sizeof(cls) % 8 == 0, name


# `.pipeline("name")` or `.pipeline(std::string("prefix_") + type)` in the MPS host code, where
# type is metal_type()'s "float" or "half".
_PIPELINE = re.compile(r'\.pipeline\(\s*(?:std::string\()?"(\w+)"\)?\s*(\+\s*type)?\s*\)')


def test_every_kernel_in_every_metal_file_is_exercised():
    """Each kernel compiled from csrc/metal is one the MPS host code (csrc/mps/*_kernel.cpp) launches,
    and each it launches exists. The by-op testers run that host code on the metal_emu backend
    in float32 and float16, so a kernel no host code names is dead and fails here, without a
    hand-kept list of kernel names."""
    launched = set()
    for host in sorted(harness.MPS_DIR.glob("*_kernel.cpp")):
        for name, typed in _PIPELINE.findall(host.read_text()):
            launched |= {name + "float", name + "half"} if typed else {name}
    found = set()
    for path in sorted(harness.METAL_DIR.glob("*.metal")):
        found |= set(harness.build(path).kernels)
    assert len(found) >= 2 * len(list(harness.METAL_DIR.glob("*.metal")))
    assert found - launched == set(), "kernels no MPS host code launches"
    assert launched - found == set(), "kernels the MPS host code launches that no .metal file defines"


def test_out_of_bounds_write_is_reported(geo, tmp_path):
    # A kernel without a bounds check, dispatched with the real geometry,
    # writes past the buffer in its last threadgroup: the sanitizer must say so.
    src = tmp_path / "no_bounds_check.metal"
    src.write_text(
        '#include <metal_stdlib>\n#include "dispatch.h"\nusing namespace metal;\n'
        "kernel void fill(device float* out [[buffer(0)]], uint3 tgid [[threadgroup_position_in_grid]],\n"
        "  uint3 groups [[threadgroups_per_grid]], uint3 threads [[threads_per_threadgroup]],\n"
        "  uint3 tid [[thread_position_in_threadgroup]]) {\n"
        "  out[opf_linear_index(tgid, groups, threads, tid)] = 1.0f;\n}\n"
    )
    m = harness.build(src)
    with pytest.raises(harness.EmuError, match="heap-buffer-overflow"):
        m.launch("fill", geo.dispatch_1d(1000), {0: np.zeros(1000, np.float32)})
    ok = np.zeros(1024, np.float32)
    m.launch("fill", geo.dispatch_1d(1000), {0: ok})
    assert ok.sum() == 1024


def test_barrier_divergence_is_reported(geo, tmp_path):
    src = tmp_path / "divergent.metal"
    src.write_text(
        "#include <metal_stdlib>\nusing namespace metal;\n"
        "kernel void early(device float* out [[buffer(0)]], uint3 tid [[thread_position_in_threadgroup]]) {\n"
        "  threadgroup float shared[64];\n"
        "  if (tid.x == 3) return;\n"
        "  shared[tid.x] = 1.0f;\n"
        "  threadgroup_barrier(mem_flags::mem_threadgroup);\n"
        "  out[tid.x] = shared[(tid.x + 1) % 64];\n}\n"
    )
    m = harness.build(src)
    with pytest.raises(harness.EmuError, match="different barriers"):
        m.launch("early", harness.Dispatch((1, 1, 1), (64, 1, 1)), {0: np.zeros(64, np.float32)})


def test_threadgroup_memory_is_shared_within_a_threadgroup_only(tmp_path):
    src = tmp_path / "shared.metal"
    src.write_text(
        "#include <metal_stdlib>\nusing namespace metal;\n"
        "kernel void rotate(device const float* in [[buffer(0)]], device float* out [[buffer(1)]],\n"
        "  uint3 gid [[thread_position_in_grid]], uint3 tid [[thread_position_in_threadgroup]],\n"
        "  uint3 threads [[threads_per_threadgroup]]) {\n"
        "  threadgroup float tile[32];\n"
        "  tile[tid.x] = in[gid.x];\n"
        "  threadgroup_barrier(mem_flags::mem_threadgroup);\n"
        "  out[gid.x] = tile[(tid.x + 1) % threads.x];\n}\n"
    )
    m = harness.build(src)
    data = np.arange(96, dtype=np.float32)
    out = np.zeros(96, np.float32)
    m.launch("rotate", harness.Dispatch((3, 1, 1), (32, 1, 1)), {0: data, 1: out})
    expected = data.reshape(3, 32)[:, np.r_[1:32, 0]].reshape(-1)
    assert np.array_equal(out, expected)


def test_embedded_source_is_what_the_emulation_runs(tmp_path):
    # The MPS build compiles the header embed.py writes; its text (dispatch.h
    # inlined) must expand to exactly what the emulation expanded.
    import importlib.util

    spec = importlib.util.spec_from_file_location("embed", harness.METAL_DIR / "embed.py")
    embed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(embed)
    info = embed.generate(sorted(harness.METAL_DIR.glob("*.metal")), tmp_path, metallib="never")
    assert info["metallib"] is False and len(info["headers"]) == len(METAL_OPS)

    def strip(text: str) -> str:
        return "\n".join(
            line for line in text.splitlines() if line.strip() and not line.startswith("# ")
        )

    for path in sorted(harness.METAL_DIR.glob("*.metal")):
        header = (tmp_path / "opforge_metal" / f"{path.stem}.h").read_text()
        source = header.split('R"OPFMETAL(', 1)[1].split(')OPFMETAL"', 1)[0]
        assert '#include "' not in source
        inlined = tmp_path / f"{path.stem}.inlined.metal"
        inlined.write_text(source)
        a = harness.prepass.preprocess(path, [harness.METAL_DIR])
        b = harness.prepass.preprocess(inlined, [])
        assert strip(a) == strip(b), path.name


# ------------------------- csrc/mps/*_kernel.cpp host code (legacy ABI), emulated
# The same host code the legacy Mac wheel runs, built with OPFORGE_MPS_EMULATED: it
# registers opforge_emu::<op> on the CPU key and every Metal dispatch runs in
# the emulation. Every op runs on it as the metal_emu backend of its own test
# file (tests/backends.py); here: what is particular to the host code.  What it does not cover: ObjC encoding itself (setBuffer,
# dispatch_sync on the MPS stream), which only the macOS job exercises.
@pytest.fixture(scope="module")
def host():
    """torch.ops.opforge_emu, backed by the emulated legacy host code."""
    return harness.load_host()


@pytest.fixture
def metal_path(monkeypatch):
    monkeypatch.setenv("OPFORGE_MPS_CPU_BELOW", "0")
    for key in [k for k in os.environ if k.startswith("OPFORGE_MPS_CPU_BELOW_")]:
        monkeypatch.delenv(key)


def test_host_deform_conv2d_chunk_loop(host, metal_path, monkeypatch):
    # one image per chunk: the host's chunk loop (unchunked: test_deform_conv2d.py's metal_emu)
    monkeypatch.setenv("OPFORGE_MPS_DEFORM_MAX_COLUMNS", "1")
    gen = torch.Generator().manual_seed(23)
    x, w, off, mask, bias = deform_case(gen, B=3)
    inputs = [t.clone().requires_grad_() for t in (x, w, off, mask, bias)]
    args = (1, 1, 1, 1, 1, 1, 2, 2, True)
    ref = ref_deform_conv2d(*inputs, (1, 1), (1, 1), (1, 1), 2, 2, True)
    out = host.deform_conv2d(x, w, off, mask, bias, *args)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    grad = torch.randn(ref.shape, generator=gen)
    ref_grads = torch.autograd.grad(ref, inputs, grad)
    got = host._deform_conv2d_backward(grad, x, w, off, mask, bias, *args)
    for name, a, b in zip(("input", "weight", "offset", "mask", "bias"), got, ref_grads):
        torch.testing.assert_close(
            a, b, rtol=1e-3, atol=1e-3, msg=lambda m, n=name: f"grad_{n}: {m}"
        )


def test_host_bad_input_is_one_clear_error(host, metal_path):
    x = torch.randn(2, 1, 8, 8)
    with pytest.raises(RuntimeError, match=r"rois\[0, 0\] = 5 is not a batch index"):
        host.roi_align(x, torch.tensor([[5.0, 0, 0, 4, 4]]), 1.0, 2, 2, 2, False)
    with pytest.raises(RuntimeError, match="float32 or float16"):
        host.roi_align(x.double(), torch.tensor([[0.0, 0, 0, 4, 4]]).double(), 1.0, 2, 2, 2, False)


def test_host_small_problem_routes_to_cpu_kernel(host, monkeypatch):
    monkeypatch.delenv("OPFORGE_MPS_CPU_BELOW", raising=False)
    monkeypatch.setenv("OPFORGE_MPS_CPU_BELOW_NMS", "1000")
    gen = torch.Generator().manual_seed(24)
    boxes, scores = random_boxes(gen, 50), torch.rand(50, generator=gen)
    assert torch.equal(host.nms(boxes, scores, 0.5), torch.ops.opforge.nms(boxes, scores, 0.5))


_GEO: list = []


def geo_singleton() -> harness.Geometry:
    if not _GEO:
        _GEO.append(harness.Geometry())
    return _GEO[0]


# ------------------------------------------- what the shim would let pass
@pytest.mark.parametrize("op", METAL_OPS)
def test_metal_source_follows_msl_rules_the_shim_erases(op):
    expanded = harness.prepass.preprocess(harness.METAL_DIR / f"{op}.metal", [harness.METAL_DIR])
    names = harness.prepass.function_names(expanded)
    kernels = set(harness.build(op).kernels)
    assert kernels <= set(names), "the lint must see every kernel signature"
    assert len(names) > len(kernels), "and the helper functions"
    assert harness.prepass.lint(expanded) == []


def test_msl_lint_reports_what_apples_compiler_would():
    bad = (
        "inline float f(float* x, thread float& y) { return *x + y; }\n"
        "kernel void k(device float* a [[buffer(0)]], device float* b [[buffer(0)]],\n"
        "  uint g [[thread_position_in_grid]], uint3 t [[thread_position_in_threadgroup]]) {\n"
        "  double d = 1; a[g] = f(a, b[0]) + d; }\n"
    )
    problems = "\n".join(harness.prepass.lint(bad))
    assert "'float* x' needs an address space" in problems
    assert "MSL has no double" in problems
    assert "used twice" in problems
    assert "share one type" in problems
    assert "thread float& y" not in problems


# ------------------------- csrc/mps/*_kernel.cpp on torch's MPS C shim (stable ABI)
# The host code as the stable-ABI MPS wheel compiles it (TORCH_STABLE_ONLY, USE_MPS, one
# translation unit per op), linked with tests/metal_emu/shim_emu.h: every op runs on it as the
# metal_shim_emu backend of its own test file (tests/backends.py); here: what it links against.
# On a torch older than 2.14 (whose headers lack torch_mps_set_arg_bytes) the harness declares
# that one function itself; against torch 2.14+ headers every declaration is torch's own.
# What it does not cover: torch's real MPS shim on a Mac (Metal compiling the source, the MPS
# stream, pipeline thread limits), which only a macOS job with a Metal device exercises.
@pytest.fixture(scope="module")
def shim_host_objects() -> list:
    lib = harness.build_shim_host_library()
    objects = sorted(lib.parent.glob("host_*_kernel.cpp.o"))
    assert len(objects) == len(list(harness.MPS_DIR.glob("*_kernel.cpp")))
    return objects


def _undefined(obj) -> set[str]:
    out = subprocess.run(["nm", "-u", str(obj)], capture_output=True, text=True, check=True)
    return {line.split()[-1] for line in out.stdout.splitlines() if line.strip()}


@pytest.mark.skipif(shutil.which("nm") is None, reason="needs nm (binutils)")
def test_shim_host_calls_torch_only_through_the_c_shim(shim_host_objects):
    for obj in shim_host_objects:
        undefined = _undefined(obj)
        # mangled libtorch / c10 / ATen C++ (std:: and the C++ runtime are fine)
        cxx = sorted(s for s in undefined if re.match(r"_ZN(K?)(2at|3c10|5torch|5caffe2)", s))
        assert cxx == [], f"{obj.name} calls libtorch C++: {cxx[:5]}"
        assert not any(s.startswith("opforge_emu_") for s in undefined), obj.name
        shim = {s for s in undefined if s.startswith(("aoti_torch_", "torch_"))}
        assert {"aoti_torch_mps_create_shader_library", "aoti_torch_mps_get_kernel_function",
                "aoti_torch_mps_run_command_block", "aoti_torch_mps_start_encoding",
                "aoti_torch_mps_set_arg_tensor", "torch_mps_set_arg_bytes",
                "aoti_torch_mps_dispatch_array_with_group_size"} <= shim, obj.name


def test_shim_host_floor_is_set_by_torch_mps_set_arg_bytes(shim_host_objects):
    # torch's own table of when each shim function shipped (carried by torch-abi-audit)
    versions = pytest.importorskip("torch_abi_audit.torch_versions",
                                   reason="torch-abi-audit carries torch's shim version table")
    if shutil.which("nm") is None:
        pytest.skip("needs nm (binutils)")
    shim = sorted({s for obj in shim_host_objects for s in _undefined(obj)
                   if s.startswith(("aoti_torch_", "torch_"))})
    floor, defining, unknown = versions.minimum_version(shim)
    assert list(unknown) == []
    assert versions.format_version(floor) == "2.14.0"
    assert list(defining) == ["torch_mps_set_arg_bytes"]


def test_shim_host_bad_input_is_one_clear_error(metal_path):
    host = harness.load_shim_host()
    x = torch.randn(2, 1, 8, 8)
    with pytest.raises(RuntimeError, match=r"rois\[0, 0\] = 5 is not a batch index"):
        host.roi_align(x, torch.tensor([[5.0, 0, 0, 4, 4]]), 1.0, 2, 2, 2, False)
    with pytest.raises(RuntimeError, match="float32 or float16"):
        host.roi_align(x.double(), torch.tensor([[0.0, 0, 0, 4, 4]]).double(), 1.0, 2, 2, 2, False)


def test_shim_host_small_problem_routes_to_cpu_kernel(monkeypatch):
    # the crossover calls opforge::nms / opforge::_deform_conv2d_backward through
    # torch_call_dispatcher
    host = harness.load_shim_host()
    monkeypatch.delenv("OPFORGE_MPS_CPU_BELOW", raising=False)
    monkeypatch.setenv("OPFORGE_MPS_CPU_BELOW_NMS", "1000")
    gen = torch.Generator().manual_seed(24)
    boxes, scores = random_boxes(gen, 50), torch.rand(50, generator=gen)
    assert torch.equal(host.nms(boxes, scores, 0.5), torch.ops.opforge.nms(boxes, scores, 0.5))
    monkeypatch.setenv("OPFORGE_MPS_CPU_BELOW_DEFORM_CONV2D", "1000000")
    x, w, off, mask, bias = deform_case(gen, B=1)
    args = (x, w, off, mask, bias, 1, 1, 1, 1, 1, 1, 2, 2, True)
    out = host.deform_conv2d(*args)
    torch.testing.assert_close(out, torch.ops.opforge.deform_conv2d(*args))
    grads = host._deform_conv2d_backward(torch.ones_like(out), *args)
    expected = torch.ops.opforge._deform_conv2d_backward(torch.ones_like(out), *args)
    for a, b in zip(grads, expected):
        torch.testing.assert_close(a, b)


def test_shim_host_deform_conv2d_chunk_loop(metal_path, monkeypatch):
    host = harness.load_shim_host()
    monkeypatch.setenv("OPFORGE_MPS_DEFORM_MAX_COLUMNS", "1")
    gen = torch.Generator().manual_seed(23)
    x, w, off, mask, bias = deform_case(gen, B=3)
    args = (1, 1, 1, 1, 1, 1, 2, 2, True)
    ref = ref_deform_conv2d(x, w, off, mask, bias, (1, 1), (1, 1), (1, 1), 2, 2, True)
    torch.testing.assert_close(host.deform_conv2d(x, w, off, mask, bias, *args), ref,
                               rtol=1e-4, atol=1e-4)


def test_emulated_shim_refuses_what_torchs_shim_or_metal_would():
    # the emulation must be able to fail: a kernel asked of another op's library, arguments
    # bound outside a command block, a grid that is not a whole number of threadgroups
    import ctypes

    harness.load_shim_host()
    lib = ctypes.CDLL(str(harness.build_shim_host_library()))
    handle, function = ctypes.c_void_p(), ctypes.c_void_p()
    assert lib.aoti_torch_mps_create_shader_library(b"kernel void nms_mask_##T(...)",
                                                    ctypes.byref(handle)) == 0
    assert lib.aoti_torch_mps_get_kernel_function(handle, b"roi_align_forward_float",
                                                  ctypes.byref(function)) != 0
    assert lib.aoti_torch_mps_get_kernel_function(handle, b"nms_mask_float",
                                                  ctypes.byref(function)) == 0
    assert lib.aoti_torch_mps_start_encoding(function) != 0  # no command block
    assert lib.aoti_torch_mps_set_arg_int(function, 0, ctypes.c_int64(1)) != 0
    callback_type = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)
    seen = []

    def block(func, _):
        seen.append(lib.aoti_torch_mps_start_encoding(ctypes.c_void_p(func)))
        grid, group = (ctypes.c_uint64 * 1)(100), (ctypes.c_uint64 * 1)(64)
        seen.append(lib.aoti_torch_mps_dispatch_array_with_group_size(
            ctypes.c_void_p(func), grid, 1, group, 1))
        grid[0], group[0] = 2048, 2048
        seen.append(lib.aoti_torch_mps_dispatch_array_with_group_size(
            ctypes.c_void_p(func), grid, 1, group, 1))

    assert lib.aoti_torch_mps_run_command_block(function, callback_type(block), None) == 0
    assert seen[0] == 0 and seen[1] != 0 and seen[2] != 0  # non-uniform; over 1024 threads
