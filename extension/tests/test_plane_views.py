"""CPU kernels on views whose (N, C, H, W) planes are dense but not packed together: a channel
slice x[:, a:b] (an R-FCN head taking part of a feature map), a batch slice x[1:], a slice of a
gradient. The kernels copy such inputs plane by plane on the extension's threads
(csrc/cpu/contiguous.h) instead of ATen's copy; the results must be exactly those of the same
values made contiguous first, on one thread and on two, below and above the size where the copy
is shared among threads. A quantized roi_align reads a contiguous input's integers in place."""

import pytest
import torch

import opforge_ops  # noqa: F401  (registers torch.ops.opforge)

OPS = torch.ops.opforge


def feature(batch, channels, height, width, seed=0):
    return torch.randn(batch, channels, height, width, generator=torch.Generator().manual_seed(seed))


def rois_for(count, batch, height, width, seed=1):
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(count, 2, generator=g) * torch.tensor([width * 0.6, height * 0.6])
    wh = torch.rand(count, 2, generator=g) * torch.tensor([width * 0.4, height * 0.4]) + 1
    index = torch.randint(0, batch, (count, 1), generator=g).float()
    return torch.cat([index, xy, xy + wh], dim=1)


# (name, big): a small call stays on the calling thread; a big one (over 4M elements to copy,
# cpu/parallel_policy.h's kParallelWork) shares the copy among threads.
SIZES = [("small", (2, 24, 12, 14)), ("big", (2, 112, 160, 160))]


def views(shape):
    """Plane-dense views of a bigger tensor, each with its contiguous copy."""
    n, c, h, w = shape
    wide = feature(n + 1, c + 9, h, w)
    for name, view in (("channel slice", wide[:n, 4:4 + c]), ("batch slice", wide[1:, :c])):
        assert not view.is_contiguous() and view.stride(3) == 1 and view.stride(2) == w
        yield name, view


@pytest.fixture(params=[1, 2], ids=["1 thread", "2 threads"])
def threads(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


def same(a, b, what=""):
    for x, y in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,)):
        assert x.is_contiguous(), what
        assert torch.equal(x, y), what


@pytest.mark.parametrize(("size", "shape"), SIZES, ids=[s for s, _ in SIZES])
def test_forward_on_a_plane_dense_view_equals_the_contiguous_input(size, shape, threads):
    n, c, h, w = shape
    rois = rois_for(6, n, h, w)
    for name, view in views(shape):
        dense = view.contiguous()
        same(OPS.roi_align(view, rois, 0.5, 3, 3, 2, True), OPS.roi_align(dense, rois, 0.5, 3, 3, 2, True), name)
        same(OPS.roi_pool(view, rois, 0.5, 3, 3), OPS.roi_pool(dense, rois, 0.5, 3, 3), name)
        ps = view[:, : (c // 4) * 4]  # ps ops take C = channels_out * 2 * 2
        ps_dense = ps.contiguous()
        same(OPS.ps_roi_align(ps, rois, 0.5, 2, 2, 2), OPS.ps_roi_align(ps_dense, rois, 0.5, 2, 2, 2), name)
        same(OPS.ps_roi_pool(ps, rois, 0.5, 2, 2), OPS.ps_roi_pool(ps_dense, rois, 0.5, 2, 2), name)


@pytest.mark.parametrize(("size", "shape"), SIZES, ids=[s for s, _ in SIZES])
def test_backward_of_a_plane_dense_gradient_equals_the_contiguous_one(size, shape, threads):
    n, c, h, w = shape
    x = feature(*shape)
    rois = rois_for(6, n, h, w)
    ph = pw = 7 if size == "big" else 3
    # a gradient sliced out of a wider one: planes (ph, pw) dense, not packed together
    grad = feature(6, c + 5, ph, pw, seed=3)[:, 2:2 + c]
    assert not grad.is_contiguous()
    dense = grad.contiguous()
    same(OPS._roi_align_backward(grad, rois, 0.5, ph, pw, n, c, h, w, 2, False),
         OPS._roi_align_backward(dense, rois, 0.5, ph, pw, n, c, h, w, 2, False))
    _, argmax = OPS.roi_pool(x, rois, 0.5, ph, pw)
    argmax_view = torch.cat([argmax, argmax[:, :3]], dim=1)[:, :c]
    assert not argmax_view.is_contiguous()
    same(OPS._roi_pool_backward(grad, rois, argmax_view, 0.5, ph, pw, n, c, h, w),
         OPS._roi_pool_backward(dense, rois, argmax, 0.5, ph, pw, n, c, h, w))
    bins = ph * pw
    ps_x = feature(n, bins * 3, h, w)
    _, mapping = OPS.ps_roi_align(ps_x, rois, 0.5, ph, pw, 2)
    ps_grad = feature(6, 5, ph, pw, seed=4)[:, 1:4]
    assert not ps_grad.is_contiguous()
    same(OPS._ps_roi_align_backward(ps_grad, rois, mapping, 0.5, ph, pw, 2, n, bins * 3, h, w),
         OPS._ps_roi_align_backward(ps_grad.contiguous(), rois, mapping, 0.5, ph, pw, 2, n,
                                    bins * 3, h, w))
    _, mapping = OPS.ps_roi_pool(ps_x, rois, 0.5, ph, pw)
    same(OPS._ps_roi_pool_backward(ps_grad, rois, mapping, 0.5, ph, pw, n, bins * 3, h, w),
         OPS._ps_roi_pool_backward(ps_grad.contiguous(), rois, mapping, 0.5, ph, pw, n,
                                   bins * 3, h, w))


@pytest.mark.parametrize("dtype", [torch.quint8, torch.qint8, torch.qint32])
@pytest.mark.parametrize("rois", [4, 400], ids=["few rois (planes)", "many rois (channels-last copy)"])
def test_quantized_roi_align_on_a_cropped_input_equals_its_contiguous_copy(dtype, rois, threads):
    zero_point = 0 if dtype == torch.qint32 else 3
    wide = torch.quantize_per_tensor(feature(1, 12, 10, 12).abs() * 2, 0.05, zero_point, dtype)
    boxes = rois_for(rois, 1, 10, 12)
    qboxes = torch.quantize_per_tensor(boxes, 0.125, 0, dtype)
    # a crop (one image: a channel slice of it would still be contiguous): its integers are
    # made contiguous by ATen; the contiguous copy's are read in place
    cropped = wide[:, :, 1:9, 2:11]
    assert not cropped.is_contiguous()
    got = opforge_ops.roi_align(cropped, qboxes, (3, 2), 1.0, 2, True)
    want = opforge_ops.roi_align(cropped.contiguous(), qboxes, (3, 2), 1.0, 2, True)
    assert got.dtype == dtype and torch.equal(got.int_repr(), want.int_repr())
