"""nms on every backend (tests/backends.py) against its slow reference (below), batched_nms on
every device, then what only the CPU build exercises, and both functions' torchvision cases
(torchvision_compat/). A backend's own concerns (CUDA's 64-box tiles past 30k boxes, streams,
Metal's threadgroup geometry) stay beside it, in test_cuda.py / test_metal_emu.py."""

from __future__ import annotations

import functools
import itertools
import math

import pytest
import torch
from backends import ALL_FLOATS, BACKENDS, DEVICE_BACKENDS

import opforge_ops
from ops_inputs import random_boxes


# ------------------------------------------------------------ the slow reference
def box_iou(a, b):
    """IoU of two (x1, y1, x2, y2) boxes given as Python floats; NaN for two empty boxes."""
    inter_w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    inter_h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = inter_w * inter_h
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union != 0 else math.nan


def reference(boxes, scores, iou_threshold):
    """Visit boxes by decreasing score (ties: lower index first); keep a box unless its IoU
    with an already kept box exceeds the threshold."""
    box_list = boxes.double().tolist()
    score_list = scores.double().tolist()
    order = sorted(range(len(score_list)), key=lambda i: -score_list[i])
    kept = []
    for i in order:
        if not any(box_iou(box_list[i], box_list[k]) > iou_threshold for k in kept):
            kept.append(i)
    return torch.tensor(kept, dtype=torch.int64)


def reference_batched_nms(boxes, scores, idxs, iou_threshold):
    """NMS within each category, merged by decreasing score."""
    kept = []
    for category in sorted(set(idxs.tolist())):
        members = [i for i, c in enumerate(idxs.tolist()) if c == category]
        for k in reference(boxes[members], scores[members], iou_threshold).tolist():
            kept.append(members[k])
    kept.sort(key=lambda i: (-float(scores[i]), i))
    return torch.tensor(kept, dtype=torch.int64)


# (boxes, threshold): one 64-box tile, its edges, several tiles; thresholds that no IoU of
# small-integer boxes lands on exactly (a float and a double IoU could straddle it)
CASES = [(1, 0.5123), (63, 0.5123), (65, 0.3217), (129, 1.0), (300, 0.0), (300, 0.7089), (1000, 0.5123)]


def case_inputs(n, dtype, seed=0):
    g = torch.Generator().manual_seed(seed + n)
    xy = torch.rand(n, 2, generator=g) * 200
    wh = torch.rand(n, 2, generator=g) * 50 + 1
    return torch.cat([xy, xy + wh], 1).to(dtype), torch.rand(n, generator=g).to(dtype)


@functools.cache
def expected_keep(n, threshold, dtype):
    """The reference on the values the kernels see (rounded to dtype), computed once."""
    return reference(*case_inputs(n, dtype), threshold)


class TestNms:
    # ------------------------------------------------------ every backend
    @pytest.mark.parametrize("backend", BACKENDS, ids=str)
    @pytest.mark.parametrize("dtype", ALL_FLOATS, ids=str)
    @pytest.mark.parametrize("n,threshold", CASES, ids=[f"{n}boxes-iou{t}" for n, t in CASES])
    def test_matches_reference(self, backend, dtype, n, threshold):
        backend.skip_unless_runs(dtype, "nms")
        boxes, scores = case_inputs(n, dtype)
        kept = backend.call("nms", boxes, scores, threshold)
        assert kept.dtype == torch.int64
        torch.testing.assert_close(kept, expected_keep(n, threshold, dtype), rtol=0, atol=0)

    @pytest.mark.parametrize("backend", BACKENDS, ids=str)
    def test_equal_scores_keep_input_order(self, backend):
        # every backend sorts the scores stably: ties go to the lower index, as the reference
        backend.skip_unless_runs(torch.float32, "nms")
        boxes, _ = case_inputs(500, torch.float32, seed=5)
        scores = torch.full((500,), 0.5)
        scores[::7] = 0.9
        expected = reference(boxes, scores, 0.4)
        torch.testing.assert_close(backend.call("nms", boxes, scores, 0.4), expected, rtol=0, atol=0)

    @pytest.mark.parametrize("backend", BACKENDS, ids=str)
    def test_identical_and_zero_area_boxes(self, backend):
        backend.skip_unless_runs(torch.float32, "nms")
        identical = torch.tensor([[1.0, 1, 5, 5]] * 5), torch.tensor([0.1, 0.9, 0.3, 0.8, 0.2])
        assert backend.call("nms", *identical, 0.5).tolist() == [1]
        # IoU of two empty boxes is 0/0: never above the threshold, so nothing is suppressed
        empty = torch.tensor([[1.0, 1, 1, 1], [1.0, 1, 1, 1], [0, 0, 4, 4], [2, 2, 2, 6]])
        scores = torch.tensor([0.9, 0.8, 0.7, 0.6])
        assert backend.call("nms", empty, scores, 0.1).tolist() == [0, 1, 2, 3]

    @pytest.mark.parametrize("backend", BACKENDS, ids=str)
    def test_no_boxes(self, backend):
        backend.skip_unless_runs(torch.float32, "nms")
        kept = backend.call("nms", torch.zeros(0, 4), torch.zeros(0), 0.5)
        assert kept.shape == (0,) and kept.dtype == torch.int64

    @pytest.mark.parametrize("backend", BACKENDS, ids=str)
    def test_non_contiguous_inputs(self, backend):
        backend.skip_unless_runs(torch.float32, "nms")
        boxes, scores = case_inputs(300, torch.float32, seed=7)
        wide = torch.zeros(300, 8)
        wide[:, ::2] = boxes
        strided_scores = torch.stack([scores, scores], 1)[:, 0]
        expected = reference(boxes, scores, 0.5)
        # the device backends copy to the device keeping the strides (backends._to_device)
        got = backend.call("nms", wide[:, ::2], strided_scores, 0.5)
        torch.testing.assert_close(got, expected, rtol=0, atol=0)

    @pytest.mark.parametrize("backend", BACKENDS, ids=str)
    @pytest.mark.parametrize(
        "boxes, scores, message",
        [
            (torch.zeros(3, 3), torch.zeros(3), r"nms: boxes \(dets\) must have shape \[N, 4\]"),
            (torch.zeros(3, 4, 1), torch.zeros(3), r"nms: boxes \(dets\) must have shape \[N, 4\]"),
            (torch.zeros(3, 4), torch.zeros(4), "must have the same length"),
            (torch.zeros(3, 4), torch.zeros(3, 1), "scores"),
            (torch.zeros(3, 4), torch.zeros(3, dtype=torch.float16), "must have the same dtype"),
            (torch.zeros(3, 4, dtype=torch.int32), torch.zeros(3, dtype=torch.int32), "floating point"),
        ],
        ids=["three-columns", "3-D", "length", "2-D-scores", "dtypes", "integer"],
    )
    def test_bad_input_names_the_argument(self, backend, boxes, scores, message):
        backend.skip_unless_runs(None, "nms")
        with pytest.raises(RuntimeError, match=message):
            backend.call("nms", boxes, scores, 0.5)

    @pytest.mark.parametrize("backend", DEVICE_BACKENDS, ids=str)
    @pytest.mark.parametrize("n", [50, 2000])  # the CPU's coordinate trick, then one nms per category
    def test_batched_nms_matches_reference(self, backend, n):
        backend.skip_unless_runs(torch.float32)
        boxes, scores = case_inputs(n, torch.float32, seed=11)
        idxs = torch.randint(0, 5, (n,), generator=torch.Generator().manual_seed(n))
        kept = backend.call_function(opforge_ops.batched_nms, boxes, scores, idxs, 0.5)
        torch.testing.assert_close(kept, reference_batched_nms(boxes, scores, idxs, 0.5), rtol=0, atol=0)

    # -------------------------------------------------- the CPU build only
    def test_threshold_is_exclusive(self):
        boxes = torch.tensor([[0.0, 0, 2, 2], [1, 0, 3, 2]], dtype=torch.float64)  # IoU exactly 1/3
        scores = torch.tensor([0.9, 0.8], dtype=torch.float64)
        assert opforge_ops.nms(boxes, scores, 1 / 3).tolist() == [0, 1]
        assert opforge_ops.nms(boxes, scores, 0.33).tolist() == [0]

    def test_float32_iou_is_compared_with_the_double_threshold(self):
        # as torchvision's CPU kernel compares: IoU 1/5 in float32 is above 0.2 the double (and
        # equal to 0.2 the float), so the second box is suppressed
        boxes = torch.tensor([[0.0, 0, 10, 10], [0, 0, 10, 50]])
        scores = torch.tensor([1.0, 0.5])
        assert opforge_ops.nms(boxes, scores, 0.2).tolist() == [0]
        assert opforge_ops.nms(boxes.double(), scores.double(), 0.2).tolist() == [0, 1]

    def test_inputs_that_require_grad(self):
        boxes = random_boxes(30).requires_grad_()
        scores = torch.rand(30, requires_grad=True)
        kept = opforge_ops.nms(boxes, scores, 0.5)
        assert not kept.requires_grad
        assert torch.equal(kept, reference(boxes.detach(), scores.detach(), 0.5))

    def test_batched_nms_never_suppresses_across_categories(self):
        boxes = torch.tensor([[0.0, 0, 10, 10]] * 3)
        scores = torch.tensor([0.9, 0.8, 0.7])
        assert opforge_ops.batched_nms(boxes, scores, torch.tensor([0, 1, 0]), 0.5).tolist() == [0, 1]

    def test_batched_nms_of_zero_boxes_is_empty(self):
        kept = opforge_ops.batched_nms(torch.zeros(0, 4), torch.zeros(0), torch.zeros(0, dtype=torch.int64), 0.5)
        assert kept.shape == (0,) and kept.dtype == torch.int64

    def test_batched_nms_of_zero_boxes_looks_at_nothing_else(self):
        # torchvision returns before reading scores or idxs (its own test passes None for both)
        empty = torch.empty((0,), dtype=torch.int64)
        kept = opforge_ops.batched_nms(empty, None, None, None)
        assert kept.shape == (0,) and kept.dtype == torch.int64

    def test_batched_nms_bad_idxs_names_the_argument(self):
        with pytest.raises(RuntimeError, match="idxs"):
            opforge_ops.batched_nms(random_boxes(4), torch.rand(4), torch.zeros(3, dtype=torch.int64), 0.5)


# ---------------------------------------------------- torchvision-compatibility cases
def _nms(ns, a):
    return ns.nms(*a)


def _batched_nms(ns, a):
    return ns.batched_nms(*a)


def torchvision_cases():
    """nms's and batched_nms's cases (float and quantized) for the torchvision differential
    suite; torchvision_compat/tv_cases.py calls this, with its helpers imported."""
    from tv_cases import FLOAT_DTYPES, QUANTIZED_DTYPES, Case, boxes, quantize

    for dtype, n, threshold in itertools.product(FLOAT_DTYPES, (0, 1, 7, 60), (0.0, 0.3, 0.7, 1.0)):
        yield Case("nms", f"{dtype}-n{n}-iou{threshold}",
                   lambda dtype=dtype, n=n, t=threshold: (boxes(n, dtype), torch.rand(n, dtype=dtype), t), _nms)
    yield Case("nms", "ties-keep-input-order",
               lambda: (boxes(30).round(), torch.randint(0, 3, (30,)).float(), 0.5), _nms)
    yield Case("nms", "duplicate-boxes", lambda: (boxes(1).repeat(5, 1), torch.rand(5), 0.5), _nms)
    yield Case("nms", "zero-area-boxes", lambda: (torch.zeros(4, 4), torch.rand(4), 0.5), _nms)
    yield Case("nms", "non-contiguous",
               lambda: (boxes(20).t().contiguous().t(), torch.rand(40)[::2], 0.5), _nms)
    yield Case("nms", "large", lambda: (boxes(1500, spread=300), torch.rand(1500), 0.5), _nms)
    malformed = {
        "boxes-1d": lambda: (torch.rand(4), torch.rand(4), 0.5),
        "boxes-3-columns": lambda: (torch.rand(4, 3), torch.rand(4), 0.5),
        "boxes-3d": lambda: (torch.rand(4, 4, 1), torch.rand(4), 0.5),
        "scores-2d": lambda: (boxes(4), torch.rand(4, 1), 0.5),
        "length-mismatch": lambda: (boxes(4), torch.rand(3), 0.5),
        "dtype-mismatch": lambda: (boxes(4), torch.rand(4, dtype=torch.float64), 0.5),
        "integer-scores": lambda: (boxes(4), torch.arange(4), 0.5),
        "integer-boxes": lambda: (boxes(4).int(), torch.rand(4), 0.5),
        "empty-1d": lambda: (torch.zeros(0), torch.zeros(0), 0.5),
    }
    for name, make in malformed.items():
        yield Case("nms", name, make, _nms)

    # 4000 box coordinates is where torchvision (and opforge) switch to one nms per category.
    for dtype, n, categories in itertools.product(FLOAT_DTYPES, (0, 1, 9, 200, 1001), (1, 3, 50)):
        yield Case("batched_nms", f"{dtype}-n{n}-c{categories}",
                   lambda dtype=dtype, n=n, c=categories: (
                       boxes(n, dtype, spread=200), torch.rand(n, dtype=dtype),
                       torch.randint(0, c, (n,)), 0.5), _batched_nms)
    yield Case("batched_nms", "empty-over-threshold-strategy",
               lambda: (torch.zeros(0, 4), torch.zeros(0), torch.zeros(0, dtype=torch.int64), 0.5), _batched_nms)
    yield Case("batched_nms", "float-idxs",
               lambda: (boxes(30), torch.rand(30), torch.randint(0, 3, (30,)).float(), 0.5), _batched_nms)
    yield Case("batched_nms", "one-idx-for-all",
               lambda: (boxes(30), torch.rand(30), torch.zeros(1, dtype=torch.int64), 0.5), _batched_nms)
    yield Case("batched_nms", "negative-categories",
               lambda: (boxes(40), torch.rand(40), torch.randint(-3, 3, (40,)), 0.5), _batched_nms)
    malformed = {
        "idxs-length": lambda: (boxes(5), torch.rand(5), torch.zeros(3, dtype=torch.int64), 0.5),
        "idxs-0d": lambda: (boxes(5), torch.rand(5), torch.tensor(1), 0.5),
        "idxs-2d": lambda: (boxes(5), torch.rand(5), torch.zeros(5, 1, dtype=torch.int64), 0.5),
        "boxes-3-columns": lambda: (torch.rand(5, 3), torch.rand(5), torch.zeros(5, dtype=torch.int64), 0.5),
        "scores-length": lambda: (boxes(5), torch.rand(4), torch.zeros(5, dtype=torch.int64), 0.5),
    }
    for name, make in malformed.items():
        yield Case("batched_nms", name, make, _batched_nms)

    # the QuantizedCPU kernel
    for dtype, n in itertools.product(QUANTIZED_DTYPES, (0, 1, 12, 80)):
        yield Case("nms", f"quantized-{dtype}-n{n}", lambda dtype=dtype, n=n: (
            quantize(boxes(n, spread=40).clamp(max=60), 0.5, 2, dtype), quantize(torch.rand(n), 0.01, 0, dtype), 0.4),
            _nms)
