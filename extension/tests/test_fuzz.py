"""Hypothesis fuzzing: any shapes and values give a result or a clean Python error, never a crash."""

import math

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import opforge_ops

FUZZ = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
values = st.floats(allow_nan=True, allow_infinity=True, width=32)
small_values = st.floats(-40, 40, width=32)
dtypes = st.sampled_from([torch.float32, torch.float64, torch.float16, torch.bfloat16])


def _tensor(draw, shape, elements, dtype):
    count = math.prod(shape)
    return (
        torch.tensor(draw(st.lists(elements, min_size=count, max_size=count)), dtype=torch.float64)
        .reshape(shape)
        .to(dtype)
    )


@st.composite
def nms_inputs(draw):
    n = draw(st.integers(0, 30))
    dtype = draw(dtypes)
    width = draw(st.sampled_from([4, 4, 4, 3, 5]))
    boxes = _tensor(draw, (n, width), draw(st.sampled_from([values, small_values])), dtype)
    scores = _tensor(
        draw,
        (draw(st.sampled_from([n, n, n + 1])),),
        values,
        draw(st.sampled_from([dtype, dtype, torch.float32])),
    )
    return boxes, scores, draw(st.floats(-1, 2))


@given(nms_inputs())
@FUZZ
def test_nms_never_crashes(case):
    boxes, scores, threshold = case
    try:
        kept = opforge_ops.nms(boxes, scores, threshold)
    except RuntimeError:
        return
    assert kept.dtype == torch.int64 and kept.numel() <= boxes.shape[0]
    assert len(set(kept.tolist())) == kept.numel()


@st.composite
def roi_inputs(draw):
    n, c = draw(st.integers(0, 2)), draw(st.integers(0, 3))
    h, w = draw(st.integers(0, 6)), draw(st.integers(0, 6))
    dtype = draw(dtypes)
    input = _tensor(draw, (n, c, h, w), small_values, dtype)
    k = draw(st.integers(0, 4))
    columns = draw(st.sampled_from([5, 5, 5, 4]))
    coordinates = draw(st.sampled_from([small_values, values]))
    rois = _tensor(
        draw, (k, columns), coordinates, draw(st.sampled_from([dtype, dtype, torch.float64]))
    )
    if columns == 5 and draw(st.booleans()):
        rois[:, 0] = torch.randint(0, max(n, 1), (k,)).to(rois.dtype)
    pooled = (draw(st.integers(-1, 4)), draw(st.integers(-1, 4)))
    return (
        input,
        rois,
        pooled,
        draw(st.floats(-2, 2)),
        draw(st.integers(-2, 3)),
        draw(st.booleans()),
    )


# The exception types torchvision.ops raises for malformed boxes (AssertionError, IndexError)
# and for everything its kernels check (RuntimeError).
ROI_ERRORS = (RuntimeError, ValueError, AssertionError, IndexError)


@given(roi_inputs())
@FUZZ
def test_roi_align_never_crashes(case):
    input, rois, pooled, scale, sampling_ratio, aligned = case
    input.requires_grad_(True)
    try:
        out = opforge_ops.roi_align(input, rois, pooled, scale, sampling_ratio, aligned)
    except ROI_ERRORS:
        return
    assert out.shape == (rois.shape[0], input.shape[1], *pooled)
    out.sum().backward()
    assert input.grad.shape == input.shape


@given(roi_inputs())
@FUZZ
def test_roi_pool_never_crashes(case):
    input, rois, pooled, scale, _, _ = case
    input.requires_grad_(True)
    try:
        out = opforge_ops.roi_pool(input, rois, pooled, scale)
    except ROI_ERRORS:
        return
    assert out.shape == (rois.shape[0], input.shape[1], *pooled)
    out.sum().backward()
    assert input.grad.shape == input.shape
