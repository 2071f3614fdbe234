"""QuantizedCPU kernels of nms and roi_align (quint8, qint8, qint32); exact agreement with
torchvision is checked in torchvision_compat/, here against the float kernels. A legacy build's
kernels are C++ (csrc/quantized); a stable-ABI build's are Python (the stable ABI has no quantized
tensors: opforge_ops/ops/nms.py and roi_align.py register them), with the same checks."""

import pytest
import torch

import opforge_ops

DTYPES = [torch.quint8, torch.qint8, torch.qint32]



def quantize(x, scale, zero_point, dtype):
    return torch.quantize_per_tensor(x, scale, 0 if dtype == torch.qint32 else zero_point, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_quantized_nms_keeps_what_float_nms_keeps_on_representable_boxes(dtype):
    # coordinates on the quantization grid, distinct scores: the same boxes survive
    dets = (torch.randint(0, 40, (60, 2)).float().repeat(1, 2) + torch.cat(
        [torch.zeros(60, 2), torch.randint(1, 20, (60, 2)).float()], dim=1)) * 0.5
    scores = torch.randperm(60).float()
    qdets, qscores = quantize(dets, 0.5, 0, dtype), quantize(scores, 1.0, 0, dtype)
    assert torch.equal(qdets.dequantize(), dets) and torch.equal(qscores.dequantize(), scores)
    kept = opforge_ops.nms(qdets, qscores, 0.4)
    assert kept.dtype == torch.int64
    assert torch.equal(kept, opforge_ops.nms(dets, scores, 0.4))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("aligned", [False, True])
def test_quantized_roi_align_is_float_roi_align_requantized(dtype, aligned):
    x = quantize(torch.rand(1, 3, 10, 12) * 4, 0.05, 3, dtype)
    xy = torch.rand(6, 2) * 8
    rois = torch.cat([torch.zeros(6, 1), xy, xy + torch.rand(6, 2) * 6 + 1], dim=1)
    qrois = quantize(rois, 0.125, 0, dtype)
    out = opforge_ops.roi_align(x, qrois, (3, 2), 1.0, -1, aligned)
    assert out.dtype == dtype and (out.q_scale(), out.q_zero_point()) == (x.q_scale(), x.q_zero_point())
    reference = opforge_ops.roi_align(x.dequantize(), qrois.dequantize(), (3, 2), 1.0, -1, aligned)
    expected = quantize(reference, x.q_scale(), x.q_zero_point(), dtype).int_repr().long()
    assert (out.int_repr().long() - expected).abs().max() <= 1  # rounding of a float sum, at most one step


@pytest.mark.parametrize("dtype", DTYPES)
def test_quantized_roi_align_same_roi_alone_or_among_many(dtype):
    # One roi on a 40x40 image is sampled plane by plane; 300 rois make the C++ kernel sample a
    # channels-last copy of the image instead: each roi gets the same integers either way.
    x = quantize(torch.rand(1, 20, 40, 40) * 4, 0.05, 3, dtype)
    xy = torch.rand(300, 2) * 28
    rois = torch.cat([torch.zeros(300, 1), xy, xy + torch.rand(300, 2) * 8 + 1], dim=1)
    qrois = quantize(rois, 0.125, 0, dtype)
    many = opforge_ops.roi_align(x, qrois, (3, 3), 1.0, 2, True)
    for i in (0, 17, 299):
        alone = opforge_ops.roi_align(x, qrois[i : i + 1], (3, 3), 1.0, 2, True)
        assert torch.equal(alone.int_repr(), many[i : i + 1].int_repr()), i


def test_quantized_roi_align_rejects_float_rois_and_batches():
    x = quantize(torch.rand(1, 2, 6, 6), 0.05, 3, torch.quint8)
    with pytest.raises(ValueError, match="quantized"):
        opforge_ops.roi_align(x, torch.tensor([[0.0, 1, 1, 4, 4]]), 2)
    batch = quantize(torch.rand(2, 2, 6, 6), 0.05, 3, torch.quint8)
    with pytest.raises(RuntimeError, match="Only one image per batch is allowed"):
        opforge_ops.roi_align(batch, quantize(torch.tensor([[0.0, 1, 1, 4, 4]]), 0.25, 0, torch.quint8), 2)


def test_quantized_nms_keeps_equal_scores_in_input_order():
    b = torch.arange(40).float()[:, None] * 10
    dets = quantize(torch.cat([b, b, b + 5, b + 5], 1), 1.0, 0, torch.qint32)
    scores = quantize((torch.arange(40) % 3).float(), 1.0, 0, torch.qint32)
    expected = [i for s in (2, 1, 0) for i in range(40) if i % 3 == s]
    assert opforge_ops.nms(dets, scores, 0.5).tolist() == expected


def test_quantized_empty_inputs():
    empty = quantize(torch.zeros(0, 4), 0.5, 0, torch.quint8)
    assert opforge_ops.nms(empty, quantize(torch.zeros(0), 0.1, 0, torch.quint8), 0.5).shape == (0,)
    x = quantize(torch.rand(1, 2, 6, 6), 0.05, 3, torch.quint8)
    out = opforge_ops.roi_align(x, quantize(torch.zeros(0, 5), 0.25, 0, torch.quint8), 2)
    assert out.shape == (0, 2, 2, 2) and out.is_quantized


def test_quantized_kernels_are_registered():
    for op in ("nms", "roi_align"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"opforge::{op}", "QuantizedCPU"), op
