"""Fake and meta kernels refuse exactly what the eager kernels refuse, with the same error.

The same malformed call goes to the CPU kernel (eager), to meta tensors (the Meta kernel
registered by ``register_fake``) and through FakeTensorMode (what torch.compile and export
trace with); all three must raise the same exception with the same message, so a traced
graph never accepts a call that fails at run time. Valid calls must give the same shapes.
The rules live in csrc/common.h (deform_conv2d's too); the fake kernels' twins are
opforge_ops/ops/_checks.py and deform_conv2d.py's _check_shapes. Tensors whose storage is
smaller than their sizes are refused on all three paths (meta and fake twins keep the short
storage). What only data can tell (a roi's batch index or coordinates, argmax and
channel_mapping entries) is checked by the eager kernels alone and is not generated here.
"""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ops_table import OPS, recipes
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.utils._python_dispatch import TorchDispatchMode

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


# --- every op: a malformed-call table generated from the schemas ------------------------
#
# One valid call per op (below); every malformed call is derived from the op's schema: each
# Tensor argument with one dimension more, one less, none, each dimension 0 or one larger, in
# every other dtype, non-contiguous, or with a storage too short for its sizes; each int
# argument at -1, 0, 1, one more and 2^31; each float at NaN, +-inf, -1, 0 and 1e30; each bool
# flipped. Then random combinations of two or three of those (hypothesis, derandomized).
# Each call goes to the CPU kernel, to meta tensors and through FakeTensorMode; the three
# outcomes (exception type and first line, or output shapes) must be equal.


# Each fill gives data the eager value checks accept whatever the shape or dtype: rois have
# batch index 0 and finite coordinates, argmax -1 (no element), channel_mapping channel 0.
FILLS = {"rois": "rois", "argmax": "argmax", "channel_mapping": "mapping"}  # argument -> fill


def _spec(name, value):
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.dtype, FILLS.get(name, "rand"))
    return value


class _BackwardCalls(TorchDispatchMode):
    """Records the opforge backward ops autograd calls (op -> its arguments)."""

    def __init__(self):
        super().__init__()
        self.calls = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        namespace, _, name = func._schema.name.partition("::")
        if namespace == "opforge" and name.startswith("_"):
            self.calls[name] = [_spec(a.name, v) for a, v in zip(func._schema.arguments, args)]
        return func(*args, **(kwargs or {}))


def _valid_calls():
    """op -> {argument: spec}: every forward op called as its smoke recipe (extension/recipes.py)
    calls it, in float32, and every backward op as autograd calls it from there; a new op
    needs no entry here."""
    calls = {}
    for op, recipe in recipes().items():
        fn = getattr(torch.ops.opforge, op)
        args = recipe["inputs"](torch.float32)
        calls[op] = {a.name: _spec(a.name, v) for a, v in zip(fn.default._schema.arguments, args)}
        if recipe.get("grad"):
            leaves = [a.detach().clone().requires_grad_() if i in recipe["grad"] else a
                      for i, a in enumerate(args)]
            out = fn(*leaves)
            out = out[0] if isinstance(out, (tuple, list)) else out
            with _BackwardCalls() as recorder:
                out.sum().backward()
            for name, values in recorder.calls.items():
                schema = getattr(torch.ops.opforge, name).default._schema
                calls[name] = dict(zip([a.name for a in schema.arguments], values))
    return calls


VALID_CALLS = _valid_calls()
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
          torch.uint8, torch.bool, torch.complex64)
INTS = (-1, 0, 1, 2**31)
FLOATS = (float("nan"), float("inf"), float("-inf"), -1.0, 0.0, 1e30)


def test_the_table_holds_every_op():
    assert set(VALID_CALLS) == set(OPS), "a new op needs a smoke recipe (with grad) in extension/recipes.py"
    for op, call in VALID_CALLS.items():
        schema = getattr(torch.ops.opforge, op).default._schema
        assert list(call) == [a.name for a in schema.arguments], op


def _mutations(op):
    """(name, argument, spec) for every single-argument malformation of op's valid call."""
    schema = getattr(torch.ops.opforge, op).default._schema
    for arg in schema.arguments:
        value = VALID_CALLS[op][arg.name]
        kind = str(arg.type)
        if kind == "Tensor":
            _, shape, dtype, fill = value
            variants = {"ndim+1": shape + (1,), "ndim-1": shape[:-1], "0-d": ()}
            for d, size in enumerate(shape):
                variants[f"dim{d}=0"] = shape[:d] + (0,) + shape[d + 1:]
                variants[f"dim{d}+1"] = shape[:d] + (size + 1,) + shape[d + 1:]
            for label, new in variants.items():
                yield f"{arg.name}:{label}", arg.name, ("tensor", new, dtype, fill)
            for other in DTYPES:
                if other != dtype:
                    yield f"{arg.name}:{other}", arg.name, ("tensor", shape, other, fill)
            yield f"{arg.name}:transposed", arg.name, ("tensor", shape, dtype, fill, "transposed")
            yield f"{arg.name}:short-storage", arg.name, ("tensor", shape, dtype, fill, "short")
        elif kind in ("int", "SymInt"):
            for v in sorted({*INTS, value + 1} - {value}):
                yield f"{arg.name}={v}", arg.name, v
        elif kind == "float":
            for v in FLOATS:
                yield f"{arg.name}={v}", arg.name, v
        elif kind == "bool":
            yield f"{arg.name}={not value}", arg.name, not value
        else:
            raise AssertionError(f"{op}: no mutations for argument type {kind}")


CASES = [(op, name, {arg: spec}) for op in VALID_CALLS for name, arg, spec in _mutations(op)]


def _fill(shape, dtype, fill):
    if fill == "argmax":
        return torch.full(shape, -1, dtype=dtype) if dtype != torch.bool else torch.zeros(shape, dtype=dtype)
    if fill == "mapping" or not (dtype.is_floating_point or dtype.is_complex):
        return torch.zeros(shape, dtype=dtype)
    t = torch.rand(shape, dtype=torch.float64) * 4
    if fill == "rois" and t.dim() > 0 and t.shape[-1] > 0:
        t[..., 0] = 0  # batch index 0: a value the eager checks accept
    return t.to(dtype)


def _make(spec):
    _, shape, dtype, fill, *layout = spec
    t = _fill(shape, dtype, fill)
    if layout == ["transposed"] and t.dim() >= 2:
        t = t.transpose(0, 1).contiguous().transpose(0, 1)
    if layout == ["short"] and t.numel() > 1:
        t.untyped_storage().resize_(t.untyped_storage().nbytes() // 2)
    return t


def _same_storage(fake_or_meta, real):
    """Give a meta or fake twin the storage size of the real tensor (a short one stays short)."""
    nbytes = real.untyped_storage().nbytes()
    if fake_or_meta.untyped_storage().nbytes() != nbytes:
        fake_or_meta.untyped_storage().resize_(nbytes)
    return fake_or_meta


def _to_meta(t):
    reach = t.storage_offset() + sum((s - 1) * st for s, st in zip(t.shape, t.stride())) + 1
    base = torch.empty(max(reach, t.untyped_storage().nbytes() // t.itemsize), dtype=t.dtype,
                       device="meta")
    return _same_storage(base.as_strided(t.shape, t.stride(), t.storage_offset()), t)


def _on_cpu(outcome):
    """A meta call's outcome with its device named as the eager call's (messages that name a
    tensor's device name meta there)."""
    return outcome[0], re.sub(r"\bmeta\b", "cpu", outcome[1]) if isinstance(outcome[1], str) else outcome[1]


def _result(op, fn):
    try:
        out = fn()
    except Exception as exc:  # noqa: BLE001 - the point is to compare what is raised
        return type(exc).__name__, str(exc).splitlines()[0] if str(exc) else ""
    outs = out if isinstance(out, tuple) else (out,)
    if op == "nms":  # the kept count is data-dependent: a 1-D int64 tensor is the shape
        return "ok", tuple((o.dim(), o.dtype) for o in outs)
    return "ok", tuple((tuple(o.shape), o.dtype) for o in outs)


def _op_three_ways(op, overrides):
    call = {**VALID_CALLS[op], **overrides}
    real = {k: _make(v) if isinstance(v, tuple) else v for k, v in call.items()}
    fn = getattr(torch.ops.opforge, op)
    eager = _result(op, lambda: fn(*real.values()))
    metas = {k: _to_meta(v) if isinstance(v, torch.Tensor) else v for k, v in real.items()}
    meta = _on_cpu(_result(op, lambda: fn(*metas.values())))
    with FakeTensorMode(shape_env=ShapeEnv()) as mode:  # a ShapeEnv sizes nms' output
        fakes = {k: _same_storage(mode.from_tensor(v, static_shapes=True), v) if isinstance(v, torch.Tensor) else v
                 for k, v in real.items()}
        fake = _result(op, lambda: fn(*fakes.values()))
    return eager, meta, fake


def _out_of_memory(outcome):
    return outcome[0] == "RuntimeError" and ("allocate" in outcome[1] or "memory" in outcome[1])


def _assert_same(op, eager, meta, fake, label):
    if _out_of_memory(eager):
        # A size the shape rules allow but this machine cannot allocate: tracing accepts it.
        assert fake[0] == "ok", f"{op} {label}: eager ran out of memory, fake {fake}"
        return
    if eager[0] != "ok" and eager[1].startswith("setStorage:"):
        # torch itself refused the short storage before the kernel ran (a view the autograd
        # layer takes of the backward's grad): the kernels' own storage check must refuse it too
        for outcome in (meta, fake):
            assert outcome[0] == "RuntimeError" and "storage" in outcome[1], (op, label, outcome)
        return
    if op == "nms" and eager[0] == "ok":
        # meta tensors cannot size nms' data-dependent output: only FakeTensorMode traces it
        assert fake == eager, f"{op} {label}\nfake:  {fake}\neager: {eager}"
        return
    assert meta == eager, f"{op} {label}\nmeta:  {meta}\neager: {eager}"
    assert fake == eager, f"{op} {label}\nfake:  {fake}\neager: {eager}"


@pytest.mark.parametrize("op", list(VALID_CALLS))
def test_the_valid_call_runs_everywhere(op):
    eager, meta, fake = _op_three_ways(op, {})
    assert eager[0] == "ok", eager
    _assert_same(op, eager, meta, fake, "valid call")


@pytest.mark.parametrize(("op", "label", "overrides"), CASES,
                         ids=[f"{op}-{label}" for op, label, _ in CASES])
def test_fake_and_meta_refuse_what_eager_refuses(op, label, overrides):
    eager, meta, fake = _op_three_ways(op, overrides)
    _assert_same(op, eager, meta, fake, label)


def test_the_table_is_not_all_accepted_or_all_refused():
    # The cases must exercise the rules: most are refused, some (layouts, edge floats) pass.
    outcomes = [_op_three_ways(op, o)[0][0] for op, _, o in CASES]
    refused = sum(o != "ok" for o in outcomes)
    assert 0.3 * len(CASES) < refused < len(CASES), (refused, len(CASES))


_MUTATIONS = {op: [(arg, spec) for _, arg, spec in _mutations(op)] for op in VALID_CALLS}


@settings(max_examples=150, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_combined_malformations_agree(data):
    op = data.draw(st.sampled_from(sorted(VALID_CALLS)), label="op")
    picks = data.draw(st.lists(st.sampled_from(_MUTATIONS[op]), min_size=2, max_size=3),
                      label="mutations")
    overrides = dict(picks)
    eager, meta, fake = _op_three_ways(op, overrides)
    _assert_same(op, eager, meta, fake, repr(overrides))


def test_torch_compile_refuses_what_eager_refuses():
    # Traced with fake tensors: the compiled call fails with the eager kernel's message.
    real = {k: _make(v) if isinstance(v, tuple) else v
            for k, v in {**VALID_CALLS["roi_align"], "sampling_ratio": 2**31}.items()}
    eager = _result("roi_align", lambda: torch.ops.opforge.roi_align(*real.values()))
    assert eager[0] == "RuntimeError"

    @torch.compile(backend="eager", fullgraph=True, dynamic=False)
    def compiled(*args):
        return torch.ops.opforge.roi_align(*args)

    with pytest.raises(Exception, match=re.escape(eager[1])):
        compiled(*real.values())
