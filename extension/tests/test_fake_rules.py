"""Fake and meta kernels refuse exactly what the eager kernels refuse, with the same error.

The same malformed call goes to the CPU kernel (eager), to meta tensors (the Meta kernel
registered by ``register_fake``) and through FakeTensorMode (what torch.compile and export
trace with); all three must raise the same exception with the same message, so a traced
graph never accepts a call that fails at run time. Valid calls must give the same shapes.
Tensors whose storage is smaller than their sizes are refused by the eager kernels.
"""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import opforge_ops  # noqa: F401  (registers the ops)

OP = torch.ops.opforge.deform_conv2d.default
PARAMS = dict(stride_h=1, stride_w=1, pad_h=0, pad_w=0, dilation_h=1, dilation_w=1, groups=1,
              offset_groups=1, use_mask=True)
SHAPES = dict(input=(1, 2, 5, 5), weight=(4, 2, 3, 3), offset=(1, 18, 3, 3),
              mask=(1, 9, 3, 3), bias=(4,))


def _call(shapes=None, dtypes=None, **params):
    shapes = {**SHAPES, **(shapes or {})}
    dtypes = dtypes or {}
    tensors = {name: torch.rand(shape, dtype=dtypes.get(name, torch.float32))
               if dtypes.get(name, torch.float32).is_floating_point
               else torch.zeros(shape, dtype=dtypes[name])
               for name, shape in shapes.items()}
    return tensors, {**PARAMS, **params}


def _args(tensors, params):
    return (tensors["input"], tensors["weight"], tensors["offset"], tensors["mask"],
            tensors["bias"], params["stride_h"], params["stride_w"], params["pad_h"],
            params["pad_w"], params["dilation_h"], params["dilation_w"], params["groups"],
            params["offset_groups"], params["use_mask"])


def _outcome(fn):
    try:
        out = fn()
    except Exception as exc:  # noqa: BLE001 - the point is to compare what is raised
        return type(exc).__name__, str(exc).splitlines()[0]
    return "ok", tuple(out.shape)


def _three_ways(tensors, params):
    eager = _outcome(lambda: OP(*_args(tensors, params)))
    meta = _outcome(lambda: OP(*_args({k: v.to("meta") for k, v in tensors.items()}, params)))
    with FakeTensorMode() as mode:
        fakes = {k: mode.from_tensor(v) for k, v in tensors.items()}
        fake = _outcome(lambda: OP(*_args(fakes, params)))
    return eager, meta, fake


MALFORMED = {
    "offset-spatial-size": dict(shapes=dict(offset=(1, 18, 4, 4))),
    "mask-spatial-size": dict(shapes=dict(mask=(1, 9, 2, 3))),
    "stride-zero": dict(stride_h=0),
    "stride-negative": dict(stride_w=-2),
    "dilation-zero": dict(dilation_w=0),
    "padding-negative": dict(pad_h=-1),
    "bias-wrong-size": dict(shapes=dict(bias=(3,))),
    "bias-2d": dict(shapes=dict(bias=(4, 1))),
    "kernel-larger-than-input": dict(shapes=dict(weight=(4, 2, 7, 7), offset=(1, 98, 1, 1),
                                                 mask=(1, 49, 1, 1))),
    "groups-zero": dict(groups=0),
    "groups-not-dividing-channels": dict(groups=3),
    "offset-groups-zero": dict(offset_groups=0),
    "weight-in-channels": dict(shapes=dict(weight=(4, 1, 3, 3))),
    "out-channels-not-divisible": dict(groups=2, shapes=dict(weight=(3, 1, 3, 3), bias=(3,))),
    "offset-channels": dict(shapes=dict(offset=(1, 17, 3, 3))),
    "mask-channels": dict(shapes=dict(mask=(1, 8, 3, 3))),
    "offset-batch": dict(shapes=dict(offset=(2, 18, 3, 3))),
    "mask-batch": dict(shapes=dict(mask=(2, 9, 3, 3))),
    "input-3d": dict(shapes=dict(input=(2, 5, 5))),
    "weight-3d": dict(shapes=dict(weight=(4, 2, 3))),
    "offset-3d": dict(shapes=dict(offset=(18, 3, 3))),
    "mask-3d": dict(shapes=dict(mask=(9, 3, 3))),
    "empty-kernel": dict(shapes=dict(weight=(4, 2, 0, 3), offset=(1, 0, 3, 3),
                                     mask=(1, 0, 3, 3))),
    "weight-dtype": dict(dtypes=dict(weight=torch.float64)),
    "integer-input": dict(dtypes={k: torch.int64 for k in SHAPES}),
}


@pytest.mark.parametrize("case", list(MALFORMED), ids=list(MALFORMED))
def test_deform_conv2d_fake_and_meta_refuse_what_eager_refuses(case):
    spec = dict(MALFORMED[case])
    tensors, params = _call(spec.pop("shapes", None), spec.pop("dtypes", None), **spec)
    eager, meta, fake = _three_ways(tensors, params)
    assert eager[0] != "ok", f"the CPU kernel accepted {case}"
    assert meta == eager, f"meta: {meta}\neager: {eager}"
    assert fake == eager, f"fake: {fake}\neager: {eager}"


VALID = {
    "plain": dict(),
    "no-mask": dict(use_mask=False, shapes=dict(mask=(1, 1))),
    "stride-pad-dilation": dict(stride_h=2, stride_w=1, pad_h=1, pad_w=2, dilation_h=2,
                                shapes=dict(offset=(1, 18, 2, 7), mask=(1, 9, 2, 7))),
    "groups": dict(groups=2, offset_groups=2, shapes=dict(
        weight=(4, 1, 3, 3), offset=(1, 36, 3, 3), mask=(1, 18, 3, 3))),
    "empty-batch": dict(shapes=dict(input=(0, 2, 5, 5), offset=(0, 18, 3, 3),
                                    mask=(0, 9, 3, 3))),
}


@pytest.mark.parametrize("case", list(VALID), ids=list(VALID))
def test_deform_conv2d_fake_and_meta_give_the_eager_shape(case):
    spec = dict(VALID[case])
    tensors, params = _call(spec.pop("shapes", None), None, **spec)
    eager, meta, fake = _three_ways(tensors, params)
    assert eager[0] == "ok", eager
    assert meta == eager and fake == eager


def _short_storage(shape, keep_bytes):
    t = torch.rand(shape)
    t.untyped_storage().resize_(keep_bytes)  # the tensor keeps its sizes: a hostile view
    return t


@pytest.mark.parametrize("which", ["boxes", "scores"])
def test_nms_refuses_a_tensor_whose_storage_cannot_hold_its_sizes(which):
    boxes = torch.rand(1000, 4) * 100
    boxes[:, 2:] += boxes[:, :2]
    scores = torch.rand(1000)
    if which == "boxes":
        boxes = _short_storage((1000, 4), 64)
    else:
        scores = _short_storage((1000,), 16)
    with pytest.raises(RuntimeError, match="storage"):
        torch.ops.opforge.nms(boxes, scores, 0.5)


def test_roi_align_refuses_a_tensor_whose_storage_cannot_hold_its_sizes():
    features = _short_storage((1, 3, 64, 64), 256)
    rois = torch.tensor([[0, 0.0, 0.0, 10.0, 10.0]])
    with pytest.raises(RuntimeError, match="storage"):
        torch.ops.opforge.roi_align(features, rois, 1.0, 7, 7, 2, False)
