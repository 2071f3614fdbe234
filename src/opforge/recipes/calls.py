"""A call of an op as data: its parameters (from the schema), one value per parameter, and
the Python expressions a recipe's ``inputs`` is written with. Pure: no I/O, no torch.

A tensor value is a dtype, a shape and a fill: ``float`` (evenly spaced in [0.1, 1], in the
recipe's dtype unless another floating dtype is named), ``index`` (non-negative integers
below ``high``, sorted along the last dimension), ``ptr`` (CSR pointers: 0 to ``high``,
monotone), ``range`` (0, 1, 2, ...), ``const`` (every element ``high``) or ``bool``. Sizes
are 8 by default everywhere, so the sizes of different arguments agree unless the op needs
otherwise; an index stays below 4, within the size of any dimension it may index.

The first call comes from the schema, the scan's hints (``x.dim() == 2``) and the names:
``index``, ``idx``, ``batch``, ``col``, ``row``, ... are sorted int64 indices; ``ptr``,
``indptr``, ``rowptr`` ... CSR pointers over 8 elements; ``dim`` a dimension in range;
``dim_size``, ``num_nodes`` ... a size (8); ``reduce`` a reduction's name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from opforge.stubs import split_arguments

SIZE = 8     # every dimension's size unless the op needs another
HIGH = 4     # an index's values stay below this: within any dimension of SIZE
PTR_NAMES = re.compile(r"(?:^|_)(?:ptr|indptr|rowptr|colptr|crow_indices|ccol_indices"
                       r"|offsets?|cumsum)(?:$|_)|ptr$")
INDEX_NAMES = re.compile(r"(?:^|_)(?:index|indices|idx|batch|col|row|labels?|segment_ids|perm"
                         r"|cluster|assign(?:ment)?|ids?|node|nodes|start|seeds?|target)(?:$|_)")
DIM_NAMES = re.compile(r"^(?:dim|axis|dimension)$|_dim$|^dim_(?!size)")
SIZE_NAMES = re.compile(r"(?:^|_)(?:size|sizes|num_nodes|num_segments|dim_size|length|len|"
                        r"numel|count|n|m|N|M|num_rows|num_cols|num_node|max_num)(?:$|_)")
FLOATING = ("dtype", "float32", "float64", "float16", "bfloat16")
INTEGRAL = ("int64", "int32", "int16", "int8", "uint8")


@dataclass(frozen=True)
class Param:
    """One argument of the schema: ``Tensor(a!) out``, ``int dim=-1``, ``Tensor? ptr=None``."""

    name: str
    kind: str               # Tensor, Tensor[], int, float, bool, str, int[], float[], ...
    optional: bool = False
    mutable: bool = False
    default: str | None = None   # a Python literal
    cxx: str | None = None       # the kernel's C++ name at this position, where it differs

    @property
    def tensor(self) -> bool:
        return self.kind == "Tensor"


@dataclass(frozen=True)
class TensorValue:
    dtype: str = "dtype"     # "dtype": the recipe's floating dtype; else a torch dtype name
    shape: tuple[int, ...] = (SIZE, SIZE)
    fill: str = "float"      # float | index | ptr | range | const | bool
    high: int = HIGH

    @property
    def floating(self) -> bool:
        return self.dtype in FLOATING

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return count


@dataclass(frozen=True)
class Literal:
    """A value written as it is: ``0``, ``None``, ``0.5``, ``"sum"``, ``[8, 8]``."""

    text: str


@dataclass(frozen=True)
class TensorList:
    items: tuple[TensorValue, ...]


Value = TensorValue | Literal | TensorList
Call = tuple[Value, ...]


class Unsupported(ValueError):
    """An argument type no call can be made for (a custom class, ``Dimname``)."""


def parse_params(schema: str) -> list[Param]:
    """The parameters of ``name(Tensor x, *, int k=3) -> Tensor`` (raises Unsupported)."""
    params = []
    for i, arg in enumerate(split_arguments(schema) or []):
        decl, _, default = arg.partition("=")
        words = decl.split()
        if not words:
            raise Unsupported(f"argument {i} of {schema!r} has no type")
        kind, name = words[0], words[-1] if len(words) > 1 else f"arg{i}"
        mutable = "!" in kind
        base = re.sub(r"\(.*?\)", "", kind)
        optional = base.endswith("?")
        base = base.rstrip("?")
        base = re.sub(r"^SymInt", "int", base)
        base = re.sub(r"\[\d*\]$", "[]", base) if base.endswith("]") else base
        default = default.strip() or None
        if default is not None:
            default = {"true": "True", "false": "False"}.get(default, default)
        params.append(Param(name=name, kind=base, optional=optional, mutable=mutable,
                            default=default))
    return params


def _shape(rank: int, sizes: dict | None = None) -> tuple[int, ...]:
    sizes = sizes or {}
    return tuple(int(sizes.get(d, sizes.get(str(d), SIZE))) for d in range(rank))


def name_class(name: str) -> str:
    """What an argument's name says it holds: ptr, index, dim, size or other."""
    low = name.lower()
    if PTR_NAMES.search(low):
        return "ptr"
    if INDEX_NAMES.search(low):
        return "index"
    if DIM_NAMES.search(low):
        return "dim"
    if SIZE_NAMES.search(name):
        return "size"
    return "other"


def prior_tensor(name: str, hint: dict | None = None) -> TensorValue:
    """The first tensor tried for an argument: what the scan saw checked, else its name."""
    hint = hint or {}
    cls = name_class(name)
    dtype = hint.get("dtype")
    if cls == "ptr":
        value = TensorValue("int64", (SIZE + 1,), "ptr", SIZE)
    elif cls == "index":
        value = TensorValue("int64", (SIZE,), "index", HIGH)
    else:
        value = TensorValue()
    if "rank" in hint:
        value = replace(value, shape=_shape(int(hint["rank"]), hint.get("sizes")))
    elif int(hint.get("min_rank", 0)) > value.rank:
        value = replace(value, shape=_shape(int(hint["min_rank"]), hint.get("sizes")))
    elif hint.get("sizes"):
        value = replace(value, shape=_shape(max(value.rank, max(map(int, hint["sizes"])) + 1),
                                            hint["sizes"]))
    if dtype is not None:
        value = with_dtype(value, dtype)
    return value


def with_dtype(value: TensorValue, dtype: str) -> TensorValue:
    """The value in another dtype; the fill follows (floats <-> sorted indices, bool)."""
    dtype = "dtype" if dtype == "float32" else dtype
    if dtype == "bool":
        return replace(value, dtype="bool", fill="bool")
    if dtype in FLOATING:
        return replace(value, dtype=dtype, fill="float")
    fill = value.fill if value.fill in ("index", "ptr", "range", "const") else "index"
    return replace(value, dtype=dtype, fill=fill, high=value.high if fill != "index"
                   else min(value.high, HIGH))


def with_rank(value: TensorValue, rank: int) -> TensorValue:
    if value.fill == "ptr" and rank >= 1:
        return replace(value, shape=(SIZE,) * (rank - 1) + (value.shape[-1],))
    shape = tuple(value.shape[:rank]) + (SIZE,) * max(0, rank - value.rank)
    return replace(value, shape=shape)


def with_size(value: TensorValue, dim: int, size: int) -> TensorValue | None:
    """The value with dimension ``dim`` (negative from the end) of ``size``, or None."""
    if not -value.rank <= dim < value.rank or size < 0:
        return None
    shape = list(value.shape)
    shape[dim] = size
    return replace(value, shape=tuple(shape))  # pointers still run 0..high over a new length


def prior_literal(param: Param) -> Literal:
    """A scalar's default, else a value its name and type make likely."""
    if param.default is not None:
        return Literal(param.default)
    if param.optional:
        return Literal("None")
    cls = name_class(param.name)
    kind = param.kind
    if kind == "int":
        return Literal({"dim": "0", "size": str(SIZE)}.get(cls, "1"))
    if kind == "float":
        return Literal("0.5")
    if kind == "bool":
        return Literal("False")
    if kind == "str":
        return Literal('"sum"' if "reduce" in param.name.lower() else '""')
    if kind in ("int[]", "float[]", "bool[]"):
        one = {"int[]": "1", "float[]": "1.0", "bool[]": "False"}[kind]
        return Literal(f"[{one}, {one}]")
    simple = {"Scalar": "1.0", "ScalarType": "dtype", "Device": '"cpu"', "Layout": "None",
              "MemoryFormat": "None", "Generator": "None"}
    if kind in simple:
        return Literal(simple[kind])
    raise Unsupported(f"no value of type {kind} ({param.name})")


def first_call(params: list[Param], hints: dict | None = None) -> Call:
    hints = hints or {}
    values: list[Value] = []
    for p in params:
        if p.tensor and not (p.optional and p.default in (None, "None") and not p.mutable):
            values.append(prior_tensor(p.name, hints.get(p.name)))
        elif p.tensor:
            values.append(Literal("None"))
        elif p.kind == "Tensor[]":
            one = prior_tensor(p.name, hints.get(p.name))
            values.append(TensorList((one, one)))
        else:
            values.append(prior_literal(p))
    return tuple(values)


def tensor_of(param: Param, hint: dict | None = None) -> TensorValue:
    """A tensor for an optional tensor argument that is None in the call."""
    return prior_tensor(param.name, hint)


# --------------------------------------------------------------------------- rendering

def _dims(shape: tuple[int, ...]) -> str:
    return ", ".join(str(s) for s in shape)


def render_tensor(v: TensorValue) -> str:
    """A torch expression with the same values on every call (no random numbers)."""
    n = v.numel
    reshape = "" if v.rank == 1 else f".reshape({_dims(v.shape)})" if v.rank else ".reshape(())"
    cast = "" if v.dtype in ("int64", "dtype") else f".to(torch.{v.dtype})"
    if v.fill == "float":
        dtype = "dtype" if v.dtype == "dtype" else f"torch.{v.dtype}"
        return f"torch.linspace(0.1, 1, {n}, dtype={dtype}){reshape}"
    if v.fill == "bool":
        return f"(torch.arange({n}) % 2 == 0){reshape}"
    if v.fill == "const":
        return f"torch.full(({_dims(v.shape)}{',' if v.rank == 1 else ''}), {v.high}){cast}"
    if v.fill == "range":
        return f"torch.arange({n}){reshape}{cast}"
    if v.fill == "ptr":
        last = v.shape[-1] if v.shape else 1
        if last <= 1:
            return f"torch.zeros({_dims(v.shape) or 1}, dtype=torch.long){cast}"
        values = f"torch.arange({last}) * {v.high} // {last - 1}"
        if v.rank <= 1:
            return f"({values}){cast}" if cast else values
        return f"({values}).repeat({_dims(v.shape[:-1])}, 1){cast}"
    # index: sorted along the last dimension, below high
    if v.rank == 0:
        return f"torch.tensor({max(0, v.high - 1)}){cast}"
    last = v.shape[-1]
    if last <= 1:
        return f"torch.zeros({_dims(v.shape)}, dtype=torch.long){cast}"
    if v.rank == 1:
        values = f"torch.arange({n}) * {v.high} // {n}"
        return f"({values}){cast}" if cast else values
    return f"(torch.arange({n}) % {last} * {v.high} // {last}){reshape}{cast}"


def render(value: Value) -> str:
    if isinstance(value, TensorValue):
        return render_tensor(value)
    if isinstance(value, TensorList):
        return "[" + ", ".join(render_tensor(v) for v in value.items) + "]"
    return value.text


def render_call(call: Call) -> list[str]:
    return [render(v) for v in call]


def describe(params: list[Param], call: Call) -> str:
    """A short account of a call: ``src float32[8, 8], index int64[8] sorted < 4, dim=0``."""
    parts = []
    for p, v in zip(params, call):
        if isinstance(v, TensorValue):
            what = {"index": f" sorted < {v.high}", "ptr": f" ptr 0..{v.high}",
                    "const": f" = {v.high}"}.get(v.fill, "")
            dtype = "float32" if v.dtype == "dtype" else v.dtype
            parts.append(f"{p.name} {dtype}[{_dims(v.shape)}]{what}")
        elif isinstance(v, TensorList):
            parts.append(f"{p.name} [{len(v.items)} tensors]")
        else:
            parts.append(f"{p.name}={v.text}")
    return ", ".join(parts)


def with_arg(call: Call | None, i: int, value) -> Call | None:
    if call is None or value is None:
        return None
    return call[:i] + (value,) + call[i + 1:]


def tensor_positions(call: Call) -> list[int]:
    return [i for i, v in enumerate(call) if isinstance(v, TensorValue)]
