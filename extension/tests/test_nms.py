import pytest
import torch

import opforge_ops
import ops_reference as reference
from ops_inputs import random_boxes


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("threshold", [0.0, 0.3, 0.5, 0.9])
def test_nms_matches_reference_on_random_boxes(dtype, threshold):
    boxes = random_boxes(200, dtype)
    scores = torch.rand(200, dtype=dtype)
    kept = opforge_ops.nms(boxes, scores, threshold)
    assert kept.dtype == torch.int64
    assert torch.equal(kept, reference.nms(boxes, scores, threshold))


def test_nms_of_zero_boxes_is_empty_int64():
    kept = opforge_ops.nms(torch.zeros(0, 4), torch.zeros(0), 0.5)
    assert kept.shape == (0,) and kept.dtype == torch.int64


def test_nms_keeps_a_single_box():
    assert opforge_ops.nms(torch.tensor([[0.0, 0, 1, 1]]), torch.tensor([0.3]), 0.5).tolist() == [0]


def test_equal_scores_keep_input_order():
    boxes = torch.tensor([[0.0, 0, 10, 10], [20, 20, 30, 30], [0, 0, 10, 9], [40, 40, 50, 50]])
    scores = torch.full((4,), 0.5)
    kept = opforge_ops.nms(boxes, scores, 0.5)
    assert kept.tolist() == [0, 1, 3] == reference.nms(boxes, scores, 0.5).tolist()


def test_identical_boxes_keep_only_the_best_scoring():
    boxes = torch.tensor([[1.0, 1, 5, 5]] * 5)
    scores = torch.tensor([0.1, 0.9, 0.3, 0.9, 0.2])
    assert opforge_ops.nms(boxes, scores, 0.5).tolist() == [1]


def test_zero_area_boxes_are_never_suppressed():
    boxes = torch.tensor([[1.0, 1, 1, 1], [1.0, 1, 1, 1], [0, 0, 4, 4], [2, 2, 2, 6]])
    scores = torch.tensor([0.9, 0.8, 0.7, 0.6])
    kept = opforge_ops.nms(boxes, scores, 0.1)
    assert kept.tolist() == [0, 1, 2, 3] == reference.nms(boxes, scores, 0.1).tolist()


def test_threshold_is_exclusive():
    boxes = torch.tensor([[0.0, 0, 2, 2], [1, 0, 3, 2]], dtype=torch.float64)  # IoU exactly 1/3
    scores = torch.tensor([0.9, 0.8], dtype=torch.float64)
    assert opforge_ops.nms(boxes, scores, 1 / 3).tolist() == [0, 1]
    assert opforge_ops.nms(boxes, scores, 0.33).tolist() == [0]


def test_nms_accepts_non_contiguous_inputs():
    boxes = random_boxes(60)
    scores = torch.rand(120)[::2]
    strided_boxes = boxes.t().contiguous().t()
    assert not strided_boxes.is_contiguous() and not scores.is_contiguous()
    assert torch.equal(
        opforge_ops.nms(strided_boxes, scores, 0.4), reference.nms(boxes, scores, 0.4)
    )


def test_nms_runs_on_inputs_that_require_grad():
    boxes = random_boxes(30).requires_grad_()
    scores = torch.rand(30, requires_grad=True)
    kept = opforge_ops.nms(boxes, scores, 0.5)
    assert not kept.requires_grad
    assert torch.equal(kept, reference.nms(boxes.detach(), scores.detach(), 0.5))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_nms_half_types_match_reference_on_the_rounded_values(dtype):
    boxes = random_boxes(80).to(dtype)
    scores = torch.rand(80).to(dtype)
    assert torch.equal(opforge_ops.nms(boxes, scores, 0.5), reference.nms(boxes, scores, 0.5))


@pytest.mark.parametrize("num_boxes", [50, 2000])  # below and above the per-class-loop switch
def test_batched_nms_matches_reference(num_boxes):
    boxes = random_boxes(num_boxes)
    scores = torch.rand(num_boxes)
    idxs = torch.randint(0, 5, (num_boxes,))
    kept = opforge_ops.batched_nms(boxes, scores, idxs, 0.5)
    assert torch.equal(kept, reference.batched_nms(boxes, scores, idxs, 0.5))


def test_batched_nms_never_suppresses_across_categories():
    boxes = torch.tensor([[0.0, 0, 10, 10]] * 3)
    scores = torch.tensor([0.9, 0.8, 0.7])
    assert opforge_ops.batched_nms(boxes, scores, torch.tensor([0, 1, 0]), 0.5).tolist() == [0, 1]


def test_batched_nms_of_zero_boxes_is_empty():
    kept = opforge_ops.batched_nms(
        torch.zeros(0, 4), torch.zeros(0), torch.zeros(0, dtype=torch.int64), 0.5
    )
    assert kept.shape == (0,) and kept.dtype == torch.int64


@pytest.mark.parametrize(
    "boxes, scores, message",
    [
        (torch.zeros(3, 3), torch.zeros(3), "boxes"),
        (torch.zeros(3, 4, 1), torch.zeros(3), "boxes"),
        (torch.zeros(3, 4), torch.zeros(3, 1), "scores"),
        (torch.zeros(3, 4), torch.zeros(4), "same length"),
        (torch.zeros(3, 4), torch.zeros(3, dtype=torch.float64), "same dtype"),
        (torch.zeros(3, 4, dtype=torch.int64), torch.zeros(3, dtype=torch.int64), "floating point"),
    ],
)
def test_nms_bad_input_names_the_argument(boxes, scores, message):
    with pytest.raises(RuntimeError, match=message):
        opforge_ops.nms(boxes, scores, 0.5)


def test_batched_nms_bad_idxs_names_the_argument():
    with pytest.raises(RuntimeError, match="idxs"):
        opforge_ops.batched_nms(
            random_boxes(4), torch.rand(4), torch.zeros(3, dtype=torch.int64), 0.5
        )
