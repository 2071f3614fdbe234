"""Hypothesis fuzzing of the kernels' contract (torch.ops.opforge, the CPU kernels).

Every test draws a valid input and must get a result that matches the reference (or the
operator's definition); its twin draws a valid input, breaks exactly one thing and must get
a RuntimeError naming that thing. A kernel that refused valid input, accepted invalid input,
crashed or computed wrong fails.
"""

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ops_table import FORWARD_OPS
from test_nms import box_iou

import ops_reference

ops = torch.ops.opforge

FUZZ = settings(
    max_examples=80,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
# Quarter pixels: exact in every float type, so the kernels and the double-precision
# reference put roi edges in the same place.
quarters = st.integers(-40, 120).map(lambda q: q / 4)


def _tensor(draw, shape, elements, dtype):
    count = math.prod(shape)
    values = draw(st.lists(elements, min_size=count, max_size=count))
    return torch.tensor(values, dtype=torch.float64).reshape(shape).to(dtype)


def tolerance(dtype):
    return {
        torch.float64: dict(rtol=1e-9, atol=1e-9),
        torch.float32: dict(rtol=1e-4, atol=1e-4),
        torch.float16: dict(rtol=2e-2, atol=3e-2),
        torch.bfloat16: dict(rtol=8e-2, atol=1e-1),
    }[dtype]


# ---------------------------------------------------------------------------- nms
@st.composite
def nms_case(draw):
    n = draw(st.integers(0, 30))
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    corners = _tensor(draw, (n, 2), quarters, dtype)
    sizes = _tensor(draw, (n, 2), st.integers(0, 40).map(lambda q: q / 4), dtype)
    boxes = torch.cat([corners, corners + sizes], dim=1)
    scores = _tensor(draw, (n,), st.floats(0, 1, width=32), dtype)
    return boxes, scores, draw(st.floats(0, 1))


def _iou(a, b):
    return box_iou(a, b)


@given(nms_case())
@FUZZ
def test_nms_of_valid_boxes_follows_its_definition(case):
    boxes, scores, threshold = case
    kept = ops.nms(boxes, scores, threshold).tolist()
    box_list, score_list = boxes.double().tolist(), scores.double().tolist()
    assert len(set(kept)) == len(kept)
    assert [score_list[i] for i in kept] == sorted((score_list[i] for i in kept), reverse=True)
    margin = 1e-4
    for a, i in enumerate(kept):  # no two kept boxes overlap past the threshold
        assert all(not (_iou(box_list[i], box_list[j]) > threshold + margin) for j in kept[a + 1 :])
    for i in set(range(len(box_list))) - set(kept):  # a dropped box overlaps a better kept one
        assert any(
            score_list[k] >= score_list[i] and _iou(box_list[k], box_list[i]) > threshold - margin
            for k in kept
        ), f"box {i} was dropped without a kept box overlapping it"


NMS_DEFECTS = {
    "three columns": (lambda b, s: (b[:, :3], s), r"nms: boxes \(dets\) must have shape \[N, 4\]"),
    "a score short": (lambda b, s: (b, s[:-1]), "must have the same length"),
    "scores in another dtype": (
        lambda b, s: (b, s.to(torch.float64 if s.dtype == torch.float32 else torch.float32)),
        "must have the same dtype",
    ),
    "integer boxes": (lambda b, s: (b.long(), s.long()), "must be a floating point tensor"),
}


@given(nms_case(), st.sampled_from(sorted(NMS_DEFECTS)))
@FUZZ
def test_nms_of_broken_input_names_the_problem(case, defect):
    boxes, scores, threshold = case
    if boxes.shape[0] == 0:
        boxes, scores = torch.zeros(1, 4, dtype=boxes.dtype), torch.zeros(1, dtype=scores.dtype)
    break_it, message = NMS_DEFECTS[defect]
    with pytest.raises(RuntimeError, match=message):
        ops.nms(*break_it(boxes, scores), threshold)


# ----------------------------------------------------------------------- roi ops
def _roi_call(fn, schema):
    """Call fn (the op or its reference, which take the schema's arguments in its order) with
    a drawn case; the first output of ops that return two."""
    names = [a.name for a in schema.arguments]

    def call(x, rois, scale, pooled, ratio, aligned):
        given = dict(input=x, rois=rois, spatial_scale=scale, pooled_height=pooled[0],
                     pooled_width=pooled[1], sampling_ratio=ratio, aligned=aligned)
        out = fn(*(given[name] for name in names))
        return out[0] if isinstance(out, (tuple, list)) else out

    return call


def _roi_ops():
    """name -> (op, reference, channels must be a multiple of the bins) for every op that pools
    rois, read from the schemas: position-sensitive ops take a channel_mapping in backward."""
    table = {}
    for name in FORWARD_OPS:
        schema = getattr(ops, name).default._schema
        if "rois" not in [a.name for a in schema.arguments]:
            continue
        backward = getattr(ops, f"_{name}_backward").default._schema
        position_sensitive = "channel_mapping" in [a.name for a in backward.arguments]
        table[name] = (_roi_call(getattr(ops, name), schema),
                       _roi_call(ops_reference.of(name), schema), position_sensitive)
    return table


ROI_OPS = _roi_ops()
PS_ROI_OPS = sorted(name for name, (_, _, position_sensitive) in ROI_OPS.items() if position_sensitive)


def test_the_roi_tables_hold_the_roi_ops():
    assert {"roi_align", "roi_pool"} <= set(ROI_OPS) and "nms" not in ROI_OPS
    assert PS_ROI_OPS and not set(PS_ROI_OPS) & {"roi_align", "roi_pool"}


@st.composite
def roi_case(draw, position_sensitive):
    """A valid call: batch indices in range, finite quarter-pixel coordinates (some past
    the border, some boxes inverted), positive output size, one dtype."""
    pooled = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    n, h, w = draw(st.integers(1, 2)), draw(st.integers(0, 6)), draw(st.integers(0, 6))
    c = draw(st.integers(0, 2)) * (pooled[0] * pooled[1] if position_sensitive else 1)
    if not position_sensitive:
        c = draw(st.integers(0, 3))
    dtype = draw(st.sampled_from(FLOATS))
    x = _tensor(draw, (n, c, h, w), st.integers(-64, 64).map(lambda v: v / 8), dtype)
    k = draw(st.integers(0, 4))
    coordinates = _tensor(draw, (k, 4), quarters.map(lambda v: v / 8), dtype)
    index = torch.tensor([draw(st.integers(0, n - 1)) for _ in range(k)], dtype=dtype).reshape(k, 1)
    rois = torch.cat([index, coordinates], dim=1)
    scale = draw(st.sampled_from([0.25, 0.5, 1.0, 2.0]))
    return x, rois, scale, pooled, draw(st.integers(-1, 3)), draw(st.booleans())


@pytest.mark.parametrize("name", sorted(ROI_OPS))
def test_roi_op_of_valid_input_matches_the_reference(name):
    op, ref, position_sensitive = ROI_OPS[name]

    @given(roi_case(position_sensitive))
    @FUZZ
    def check(case):
        x, rois, scale, pooled, ratio, aligned = case
        got = op(x, rois, scale, pooled, ratio, aligned)
        expected = ref(x.double(), rois, scale, pooled, ratio, aligned)
        assert got.shape == expected.shape and got.dtype == x.dtype
        torch.testing.assert_close(got.double(), expected.double(), equal_nan=True, **tolerance(x.dtype))

    check()


def _other_dtype(t):
    return t.to(torch.float64 if t.dtype != torch.float64 else torch.float32)


# defect -> (break (input, rois, pooled) -> the same, the message); a defect that only
# shows when the op has work to do needs a roi and a channel first (see below)
ROI_DEFECTS = {
    "3-D input": (lambda x, r, p: (x[0], r, p), r"input must be a 4-D tensor \[N, C, H, W\]"),
    "rois with 4 columns": (lambda x, r, p: (x, r[:, 1:], p), r"rois \(boxes\) must have shape \[K, 5\]"),
    "rois in another dtype": (lambda x, r, p: (x, _other_dtype(r), p), "input and rois must have the same dtype"),
    "integer input": (lambda x, r, p: (x.long(), r.long(), p), "input must be a floating point tensor"),
    "negative output height": (lambda x, r, p: (x, r, (-1, p[1])), "must not be negative"),
    "batch index past the batch": (
        lambda x, r, p: (x, torch.cat([r[:, :1] + x.shape[0], r[:, 1:]], 1), p),
        "is not a batch index of input",
    ),
    "infinite coordinate": (
        lambda x, r, p: (x, torch.cat([r[:, :3], torch.full_like(r[:, 3:4], math.inf), r[:, 4:]], 1), p),
        r"rois\[0, 3\] = inf is not finite",
    ),
}


@pytest.mark.parametrize("name", sorted(ROI_OPS))
@pytest.mark.parametrize("defect", sorted(ROI_DEFECTS))
def test_roi_op_of_broken_input_names_the_problem(name, defect):
    op, _, position_sensitive = ROI_OPS[name]
    break_it, message = ROI_DEFECTS[defect]

    @given(roi_case(position_sensitive))
    @settings(FUZZ, max_examples=15)
    def check(case):
        x, rois, scale, pooled, ratio, aligned = case
        if rois.shape[0] == 0 or x.shape[1] == 0:  # give the op work, so value checks run
            rois = torch.tensor([[0.0, 0, 0, 2, 2]], dtype=x.dtype)
            x = torch.ones(x.shape[0], pooled[0] * pooled[1], *x.shape[2:], dtype=x.dtype)
        x, rois, pooled = break_it(x, rois, pooled)
        with pytest.raises(RuntimeError, match=f"{name}: .*{message}|{name}: {message}"):
            op(x, rois, scale, pooled, ratio, aligned)

    check()


@pytest.mark.parametrize("name", PS_ROI_OPS)
def test_ps_roi_op_of_an_empty_output_size_names_the_problem(name):
    # roi_align / roi_pool give an empty output; C / (PH * PW) has no meaning for 0 bins
    op, _, _ = ROI_OPS[name]
    with pytest.raises(RuntimeError, match=rf"{name}: output_size \(pooled_height, pooled_width\) must be positive"):
        op(torch.zeros(1, 4, 5, 5), torch.tensor([[0.0, 0, 0, 2, 2]]), 1.0, (0, 2), 1, False)


@pytest.mark.parametrize("name", PS_ROI_OPS)
def test_ps_roi_op_of_channels_not_a_multiple_of_the_bins_names_the_problem(name):
    op, _, _ = ROI_OPS[name]

    @given(roi_case(True), st.integers(1, 3))
    @settings(FUZZ, max_examples=20)
    def check(case, extra):
        x, rois, scale, pooled, ratio, aligned = case
        bins = pooled[0] * pooled[1]
        channels = x.shape[1] + extra if bins > 1 else None
        if channels is None or channels % bins == 0:
            pooled, channels = (2, 2), 5
        x = torch.zeros(x.shape[0], channels, *x.shape[2:], dtype=x.dtype)
        with pytest.raises(RuntimeError, match=rf"{name}: input channels \({channels}\) must be a multiple"):
            op(x, rois, scale, pooled, ratio, aligned)

    check()


# ------------------------------------------------------------------ deform_conv2d
@st.composite
def deform_case(draw):
    """A valid call of the raw op: groups and offset groups dividing the channels, the
    dilated kernel fitting the padded input, values exact in every float type (eighths;
    offsets odd sixteenths, so no sample lands on a pixel row, where the gradient is
    one-sided), one dtype."""
    groups, offset_groups = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    channels = groups * offset_groups * draw(st.integers(1, 2))
    out_channels = groups * draw(st.integers(1, 2))
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    sh, sw, dh, dw = (draw(st.integers(1, 2)) for _ in range(4))
    ph, pw = draw(st.integers(0, 2)), draw(st.integers(0, 2))
    span_h, span_w = dh * (kh - 1) + 1, dw * (kw - 1) + 1
    h = draw(st.integers(max(span_h - 2 * ph, 1), max(span_h - 2 * ph, 1) + 2))
    w = draw(st.integers(max(span_w - 2 * pw, 1), max(span_w - 2 * pw, 1) + 2))
    out_h, out_w = (h + 2 * ph - span_h) // sh + 1, (w + 2 * pw - span_w) // sw + 1
    batch, use_mask = draw(st.integers(0, 2)), draw(st.booleans())
    dtype = draw(st.sampled_from(FLOATS))
    eighths = st.integers(-16, 16).map(lambda v: v / 8)
    odd_sixteenths = st.integers(-40, 40).map(lambda v: (2 * v + 1) / 16)
    tensors = (
        _tensor(draw, (batch, channels, h, w), eighths, dtype),
        _tensor(draw, (out_channels, channels // groups, kh, kw), eighths, dtype),
        _tensor(draw, (batch, 2 * offset_groups * kh * kw, out_h, out_w), odd_sixteenths, dtype),
        _tensor(draw, (batch, offset_groups * kh * kw, out_h, out_w), st.integers(0, 8).map(lambda v: v / 8), dtype),
        _tensor(draw, (out_channels,), eighths, dtype),
    )
    return tensors, (sh, sw, ph, pw, dh, dw, groups, offset_groups, use_mask)


def _deform_reference(tensors, ints):
    x, weight, offset, mask, bias = tensors
    sh, sw, ph, pw, dh, dw, _, _, use_mask = ints
    return ops_reference.of("deform_conv2d")(x, offset, weight, bias, (sh, sw), (ph, pw), (dh, dw), mask if use_mask else None)


@given(deform_case())
@settings(FUZZ, max_examples=25)
def test_deform_conv2d_of_valid_input_matches_the_reference(case):
    tensors, ints = case
    dtype = tensors[0].dtype
    out = ops.deform_conv2d(*tensors, *ints)
    leaves = [t.double().requires_grad_() for t in tensors]
    expected = _deform_reference(leaves, ints)
    assert out.shape == expected.shape and out.dtype == dtype
    scale = max(1.0, expected.abs().max().item()) if expected.numel() else 1.0
    tol = tolerance(dtype)
    torch.testing.assert_close(out.double(), expected.detach(), rtol=tol["rtol"], atol=tol["atol"] * scale)
    grad = torch.ones_like(out)
    got = ops._deform_conv2d_backward(grad, *tensors, *ints)
    used = [i for i in range(5) if i != 3 or ints[-1]]  # without use_mask, mask has no gradient
    want = torch.autograd.grad(expected, [leaves[i] for i in used], grad.double(), allow_unused=True)
    for i, g in zip(used, want):
        g = torch.zeros_like(leaves[i]) if g is None else g
        scale = max(1.0, g.abs().max().item()) if g.numel() else 1.0
        assert got[i].shape == g.shape and got[i].dtype == dtype
        torch.testing.assert_close(got[i].double(), g, rtol=tol["rtol"], atol=tol["atol"] * scale * 4)


def _with(tensors, ints, index, value):
    """The call with argument `index` (of the 14) replaced."""
    args = [*tensors, *ints]
    args[index] = value(args[index]) if callable(value) else value
    return args


def _kernel_of_13(tensors, ints):
    x, weight, offset, mask, bias = tensors
    og = ints[7]
    grown = (weight.new_zeros(*weight.shape[:2], 13, 13),
             offset.new_zeros(offset.shape[0], 2 * og * 169, *offset.shape[2:]),
             mask.new_zeros(mask.shape[0], og * 169, *mask.shape[2:]))
    return [x, *grown, bias, *ints]


# defect -> (break the 14 arguments, the message)
DEFORM_DEFECTS = {
    "3-D input": (lambda t, i: _with(t, i, 0, lambda x: x.flatten(0, 1)), r"input must be 4-D \(batch, channels"),
    "weight in another dtype": (lambda t, i: _with(t, i, 1, _other_dtype), "expected weight to have the same dtype as input"),
    "integer tensors": (lambda t, i: [a.long() if isinstance(a, torch.Tensor) else a for a in [*t, *i]],
                        "input must be a floating point tensor"),
    "offset one channel short": (lambda t, i: _with(t, i, 2, lambda o: o[:, :-1]),
                                 r"offset\.shape\[1\] is not valid: got: \d+ expected: \d+ \(2 \* offset_groups"),
    "mask one channel short": (lambda t, i: _with(t, (*i[:-1], True), 3, lambda m: m[:, :-1]),
                               r"mask\.shape\[1\] is not valid: got: \d+ expected: \d+ \(offset_groups"),
    # torchvision's test_wrong_sizes: a shape error is named before a dtype mismatch
    "mask one channel short, weight in another dtype": (
        lambda t, i: _with(_with(t, (*i[:-1], True), 3, lambda m: m[:, :-1])[:5], (*i[:-1], True), 1,
                           _other_dtype),
        r"mask\.shape\[1\] is not valid"),
    "offset one row short": (lambda t, i: _with(t, i, 2, lambda o: o[:, :, :-1]) if t[2].shape[2] > 1
                             else _with(t, i, 2, lambda o: torch.cat([o, o], 2)),
                             "offset spatial size must equal the output size"),
    "offset of another batch": (lambda t, i: _with(t, i, 2, lambda o: torch.cat([o, o.new_zeros(1, *o.shape[1:])])),
                                r"offset\.shape\[0\] \(\d+\) must equal the batch size"),
    "bias of another length": (lambda t, i: _with(t, i, 4, lambda b: torch.cat([b, b[:1]])), r"bias must have shape \(out_channels,\)"),
    "zero stride": (lambda t, i: _with(t, i, 5, 0), "stride_h must be a positive integer below 2"),
    "negative dilation": (lambda t, i: _with(t, i, 10, -1), "dilation_w must be a positive integer"),
    "negative padding": (lambda t, i: _with(t, i, 7, -1), r"padding \(pad_h, pad_w\) must be non-negative"),
    "groups not dividing the channels": (lambda t, i: _with(t, i, 11, t[0].shape[1] + 1),
                                         r"groups \(\d+\) must divide the input channels"),
    # a 13 x 13 kernel (offset and mask sized for it) outgrows every drawn input (at most 7 + 2 * 2 pixels)
    "kernel past the padded input": (lambda t, i: _kernel_of_13(t, i), "is larger than the padded input"),
}


@pytest.mark.parametrize("defect", sorted(DEFORM_DEFECTS))
def test_deform_conv2d_of_broken_input_names_the_problem(defect):
    break_it, message = DEFORM_DEFECTS[defect]

    @given(deform_case())
    @settings(FUZZ, max_examples=10)
    def check(case):
        tensors, ints = case
        with pytest.raises(RuntimeError, match=f"deform_conv2d: .*{message}"):
            ops.deform_conv2d(*break_it(tensors, ints))

    check()
