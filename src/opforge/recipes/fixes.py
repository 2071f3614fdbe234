"""The calls a failure suggests: ``fixes`` (each clue of ``clues.read`` gives targeted
changes: the dtype the message asks for, the rank, sizes made to agree, ``dim`` moved into
range, an index tensor in range, sorted, grown, given its peer's shape after a crash) and
``variations`` (the plain space around a call, one change each)."""

from __future__ import annotations

import re
from dataclasses import replace

from opforge.recipes import clues as C
from opforge.recipes.calls import (
    HIGH,
    SIZE,
    Call,
    Literal,
    Param,
    TensorValue,
    name_class,
    prior_tensor,
    tensor_positions,
    with_arg,
    with_dtype,
    with_rank,
    with_size,
)
from opforge.recipes.conditions import condition_fixes, resolve

_RANDOM_NAMES = re.compile(r"random|shuffle|train|stochastic|sample|drop", re.I)


def _named_first(indices: list[int], params: list[Param], integral: bool) -> list[int]:
    """Index-like names first when an integer tensor is wanted, the others first otherwise."""
    def order(i: int) -> tuple[int, int]:
        like = name_class(params[i].name) in ("index", "ptr")
        return (0 if like == integral else 1, i)
    return sorted(indices, key=order)


def _dtype_fixes(clue: C.Dtype, params: list[Param], call: Call) -> list[Call]:
    def dtype_of(v: TensorValue) -> str:
        return "float32" if v.dtype == "dtype" else v.dtype

    named = resolve(clue.arg, params)
    targets = [named] if named is not None and isinstance(call[named], TensorValue) else \
        [i for i in tensor_positions(call) if clue.found is None or dtype_of(call[i]) == clue.found]
    if clue.want is not None:
        targets = [i for i in targets if dtype_of(call[i]) != clue.want]
        wants = [clue.want]
    elif clue.found in ("float32", "float64", "float16", "bfloat16"):
        wants = ["int64", "float64"]
    else:
        wants = ["float32", "int32"]
    out = []
    for want in wants:
        integral = not want.startswith(("float", "bfloat"))
        ordered = _named_first(targets, params, integral)
        for i in ordered:
            out.append(with_arg(call, i, with_dtype(call[i], want)))
        if len(ordered) > 1:
            every = call
            for i in ordered:
                every = with_arg(every, i, with_dtype(every[i], want))
            out.append(every)
    return out


def _rank_fixes(clue: C.Rank, params: list[Param], call: Call) -> list[Call]:
    named = resolve(clue.arg, params)
    targets = [named] if named is not None and isinstance(call[named], TensorValue) else \
        tensor_positions(call)
    return [with_arg(call, i, with_rank(call[i], rank)) for rank in clue.ranks for i in targets
            if call[i].rank != rank]


def _same_rank_fixes(params: list[Param], call: Call) -> list[Call]:
    tensors = tensor_positions(call)
    if not tensors:
        return []
    top = max(call[i].rank for i in tensors)
    out, every = [], call
    for i in tensors:
        if call[i].rank != top:
            out.append(with_arg(call, i, with_rank(call[i], top)))
            every = with_arg(every, i, with_rank(every[i], top))
    return out + ([every] if len(out) > 1 else [])


def _size_fixes(clue: C.Sizes, call: Call) -> list[Call]:
    out = []
    for have, want in ((clue.a, clue.b), (clue.b, clue.a)):
        for i in tensor_positions(call):
            for d, size in enumerate(call[i].shape):
                if size == have:
                    out.append(with_arg(call, i, with_size(call[i], d, want)))
        for i, v in enumerate(call):
            if isinstance(v, Literal) and v.text == str(have):
                out.append(with_arg(call, i, Literal(str(want))))
    return out


def _dim_fixes(clue: C.DimRange, params: list[Param], call: Call) -> list[Call]:
    out = []
    ints = [i for i, v in enumerate(call) if isinstance(v, Literal) and v.text == str(clue.got)]
    ints.sort(key=lambda i: (name_class(params[i].name) != "dim", i))
    for i in ints:
        for value in dict.fromkeys((clue.high, clue.low, 0)):
            out.append(with_arg(call, i, Literal(str(value))))
    for i in tensor_positions(call):
        if call[i].rank == clue.high + 1 and clue.got >= 0:
            out.append(with_arg(call, i, with_rank(call[i], clue.got + 1)))
    return out


def _index_fixes(clue: C.IndexRange, call: Call) -> list[Call]:
    out, every = [], call
    for i in tensor_positions(call):
        v = call[i]
        if v.fill in ("index", "range", "const") and not v.floating:
            high = min(v.high, clue.size) if clue.size else 1
            high = 1 if high >= v.high else max(1, high)
            new = replace(v, fill="index", high=high) if v.fill == "range" else \
                replace(v, high=high)
            out.append(with_arg(call, i, new))
            every = with_arg(every, i, new)
    return ([every] if len(out) > 1 else []) + out


def _same_dtype_fixes(clue: C.SameDtype, params: list[Param], call: Call) -> list[Call]:
    """One side given the other's dtype, the named one first; unnamed: every tensor given
    the first tensor's dtype."""
    a, b = resolve(clue.a, params), resolve(clue.b, params)
    pairs = [(a, b), (b, a)] if a is not None and b is not None else []
    if not pairs:
        tensors = tensor_positions(call)
        pairs = [(i, tensors[0]) for i in tensors[1:]]
    out = []
    for i, j in pairs:
        if isinstance(call[i], TensorValue) and isinstance(call[j], TensorValue) and \
                call[i].dtype != call[j].dtype:
            out.append(with_arg(call, i, with_dtype(call[i], call[j].dtype)))
    return out


def _sorted_fixes(call: Call) -> list[Call]:
    return [with_arg(call, i, replace(call[i], fill="index", high=min(call[i].high, HIGH)))
            for i in tensor_positions(call) if call[i].fill in ("range", "const")
            and not call[i].floating]


def _crash_fixes(clue: C.Crash, call: Call) -> list[Call]:
    """A division by zero: integer tensors without zeros (all ``HIGH``); an index past the
    end of something: smaller indices too."""
    out, every = [], call
    for i in tensor_positions(call):
        v = call[i]
        if not v.floating and v.fill in ("index", "range", "ptr", "bool"):
            new = replace(v, fill="const", high=HIGH)
            out.append(with_arg(call, i, new))
            every = with_arg(every, i, new)
    out = ([every] if len(out) > 1 else []) + out
    if clue.how != "SIGFPE":
        out = _index_fixes(C.IndexRange(), call) + out + _peer_shapes(call)
    return out


def _peer_shapes(call: Call) -> list[Call]:
    """A tensor the kernel read past the end of: an integer tensor given the shape of a
    larger one (``weight_index`` read as ``basis``'s E x S)."""
    out = []
    tensors = tensor_positions(call)
    for i in tensors:
        if call[i].floating:
            continue
        for j in tensors:
            if j != i and call[j].numel > call[i].numel:
                out.append(with_arg(call, i, replace(call[i], shape=call[j].shape)))
    return out


def _random_fixes(params: list[Param], call: Call) -> list[Call]:
    """A flag that asks for randomness turned off; else the op read memory it was not given
    (results that differ between two identical calls): a dimension of size 1 that its
    checks let through but its loop reads in full (``gamma.size(0) == 1 || ==
    x.size(0)``) made full size, or indices made smaller."""
    out: list[Call | None] = []
    for i, p in enumerate(params):
        if p.kind == "bool" and _RANDOM_NAMES.search(p.name):
            flipped = "False" if call[i] == Literal("True") else "True"
            out.append(with_arg(call, i, Literal(flipped)))
    for i in tensor_positions(call):
        for d, size in enumerate(call[i].shape):
            if size == 1:
                out.append(with_arg(call, i, with_size(call[i], d, SIZE)))
    out += _index_fixes(C.IndexRange(), call)
    return [c for c in out if c is not None]


def fixes(params: list[Param], call: Call, found: list[C.Clue]) -> list[Call]:
    """The calls each clue of a failure suggests, in the clues' order."""
    out: list[Call | None] = []
    for clue in found:
        if isinstance(clue, C.Dtype):
            out += _dtype_fixes(clue, params, call)
        elif isinstance(clue, C.Rank):
            out += _rank_fixes(clue, params, call)
        elif isinstance(clue, C.SameDtype):
            out += _same_dtype_fixes(clue, params, call)
        elif isinstance(clue, C.SameRank):
            out += _same_rank_fixes(params, call)
        elif isinstance(clue, C.Sizes):
            out += _size_fixes(clue, call)
        elif isinstance(clue, C.Condition):
            out += condition_fixes(clue.text, params, call)
        elif isinstance(clue, C.DimRange):
            out += _dim_fixes(clue, params, call)
        elif isinstance(clue, C.IndexRange):
            out += _index_fixes(clue, call)
        elif isinstance(clue, C.Unsorted):
            out += _sorted_fixes(call)
        elif isinstance(clue, C.Random):
            out += _random_fixes(params, call)
        elif isinstance(clue, C.Crash):
            out += _crash_fixes(clue, call)
    return [c for c in out if c is not None]


def variations(params: list[Param], call: Call, hints: dict | None = None) -> list[Call]:
    """The plain space around a call, one change each: tensors' dtype and rank, an absent
    optional tensor given, scalars' values."""
    hints = hints or {}
    out: list[Call | None] = []
    for i in tensor_positions(call):
        v = call[i]
        out.append(with_arg(call, i, with_dtype(v, "int64" if v.floating else "float32")))
    for i in tensor_positions(call):
        for rank in (1, 2, 3):
            if rank != call[i].rank:
                out.append(with_arg(call, i, with_rank(call[i], rank)))
    for i, (p, v) in enumerate(zip(params, call)):
        if p.tensor and v == Literal("None"):
            out.append(with_arg(call, i, prior_tensor(p.name, hints.get(p.name))))
    for i, (p, v) in enumerate(zip(params, call)):
        if not isinstance(v, Literal):
            continue
        if p.kind == "int":
            choices = ("0", "-1", "1") if name_class(p.name) == "dim" else ("0", "2", str(SIZE))
        elif p.kind == "bool":
            choices = ("True", "False")
        elif p.kind == "float":
            choices = ("1.0", "2.0")
        elif p.kind == "str":
            choices = ('"sum"', '"mean"', '"max"')
        else:
            choices = ()
        out += [with_arg(call, i, Literal(c)) for c in choices if Literal(c) != v]
    for i in tensor_positions(call):
        if call[i].floating and call[i].dtype != "float64":
            out.append(with_arg(call, i, with_dtype(call[i], "float64")))
    return [c for c in out if c is not None]

