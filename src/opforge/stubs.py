"""Recipe stubs that run: arguments for an op or function from its schema or signature.

``opforge init`` writes one recipe per op (RECIPES) and per compiled module's function
(FUNCTIONS), each marked ``"stub": True``: tensors of the rank, sizes and dtype the kernel
checks where the scan saw the check (``x.dim() == 2``, ``x.scalar_type() == at::kLong``),
else 8x8 floating tensors of the recipe's dtype; a scalar's default, else a small value. An
index-like tensor (``index``, ``idx``, ``ptr``, ``batch``, ...) gets int64 values below 4.
Values are fixed (no random numbers): every check compares with the first CPU run.
"""

from __future__ import annotations

import ast
import json
import re

INDEX_NAMES = re.compile(r"(?:^|_)(?:index|indices|idx|ptr|indptr|batch|offsets?|rowptr|col|row"
                         r"|labels?|segment_ids)(?:$|_)")
_SCALARS = {"int": "1", "SymInt": "1", "float": "0.5", "bool": "False", "str": '""',
            "Scalar": "1.0", "ScalarType": "dtype", "Device": '"cpu"', "Layout": "None",
            "MemoryFormat": "None", "Generator": "None"}


def split_arguments(schema: str | None) -> list[str] | None:
    """The arguments of 'name(Tensor x, *, int k=3) -> Tensor' (or of 'Tensor x, int k')."""
    if schema is None:
        return None
    text = schema
    if "(" in schema:
        start = schema.index("(")
        depth = 0
        for end in range(start, len(schema)):
            depth += {"(": 1, ")": -1}.get(schema[end], 0)
            if depth == 0:
                break
        text = schema[start + 1:end]
    parts, depth, current = [], 0, ""
    for ch in text:
        depth += 1 if ch in "([" else -1 if ch in ")]" else 0
        if ch == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += ch
    parts.append(current.strip())
    return [p for p in parts if p and p != "*"]


def _python_default(default: str) -> str | None:
    default = {"true": "True", "false": "False"}.get(default, default)
    try:
        ast.literal_eval(default)
    except (ValueError, SyntaxError):
        return None
    return default


def _tensor(name: str, hint: dict) -> str:
    """A tensor expression with the same values on every call (the fake, compile and device
    checks compare with the first CPU run): evenly spaced floats in [0.1, 1], which also make
    valid [x1, y1, x2, y2] boxes row by row; an index counts 0, 1, 2, 3, 0, ..."""
    rank = hint.get("rank", max(1 if INDEX_NAMES.search(name.lower()) else 2,
                                int(hint.get("min_rank", 0))))
    sizes = [hint.get("sizes", {}).get(d, 8) for d in range(rank)]
    count = 1
    for size in sizes:
        count *= size
    shape = ", ".join(str(size) for size in sizes)
    dtype = hint.get("dtype")
    if dtype is None and INDEX_NAMES.search(name.lower()):
        dtype = "int64"
    if dtype in ("int64", "int32", "int16", "int8", "uint8"):
        cast = "" if dtype == "int64" else f".to(torch.{dtype})"
        return f"(torch.arange({count}) % 4).reshape({shape}){cast}"
    if dtype == "bool":
        return f"(torch.arange({count}) % 2 == 0).reshape({shape})"
    if dtype in ("float64", "float16", "bfloat16"):
        return f"torch.linspace(0.1, 1, {count}).reshape({shape}).to(torch.{dtype})"
    return f"torch.linspace(0.1, 1, {count}, dtype=dtype).reshape({shape})"


def stub_arguments(schema: str | None, hints: dict | None = None) \
        -> tuple[list[str], list[int]] | None:
    """(argument expressions, indices of mutated tensors), or None when a type is unknown."""
    args = split_arguments(schema)
    if args is None:
        return None
    hints = hints or {}
    exprs, mutated = [], []
    for i, arg in enumerate(args):
        decl, _, default = arg.partition("=")
        words = decl.split()
        if not words:
            return None
        kind, name = words[0], words[-1] if len(words) > 1 else f"arg{i}"
        default = _python_default(default.strip()) if default else None
        base = re.sub(r"\(.*?\)", "", kind)
        if base.endswith("?"):  # optional: its default, else None (an out= or size left out)
            exprs.append(default if default is not None else "None")
            continue
        if base == "Tensor":
            if "!" in kind:
                mutated.append(i)
                exprs.append(f"torch.zeros_like({_tensor(name, hints.get(name, {}))})")
            else:
                exprs.append(_tensor(name, hints.get(name, {})))
        elif base.startswith("Tensor["):
            exprs.append(f"[{_tensor(name, hints.get(name, {}))}, "
                         f"{_tensor(name, hints.get(name, {}))}]")
        elif re.fullmatch(r"(?:int|SymInt|float|bool)\[\d*\]", base):
            count = int(re.search(r"\[(\d*)\]", base).group(1) or 2)
            one = "1" if base.startswith(("int", "SymInt")) else "1.0" if \
                base.startswith("float") else "False"
            exprs.append(default or f"[{', '.join([one] * count)}]")
        elif base in _SCALARS:
            exprs.append(default or _SCALARS[base])
        else:
            return None
    return exprs, mutated


def recipe_entry(key: str, schema: str | None, hints: dict | None, *, fake: bool,
                 devices: list[str] | None = None, indent: str = "    ") -> list[str]:
    """The lines of one stub recipe (a comment where the schema is not known)."""
    made = stub_arguments(schema, hints)
    if made is None:
        what = f"# {schema}" if schema else "# (signature not known)"
        return [f"{indent}{what}",
                f'{indent}# "{key}": {{"inputs": lambda dtype: [torch.rand(8, 8, '
                'dtype=dtype)]},']
    exprs, mutated = made
    inputs = f"lambda dtype: [{', '.join(exprs)}]"
    fields = [("inputs", inputs)]
    if mutated:
        fields.append(("mutates", str(mutated)))
    if devices:
        fields.append(("devices", json.dumps(devices)))
    if not fake and devices is None:
        reason = '"init found no fake kernel"'
        fields.append(("skip", f'{{"fake": {reason}, "compile": {reason}}}'))
    fields.append(("stub", "True"))
    lines = [f"{indent}# {schema}"]
    entry = f'{indent}"{key}": {{{", ".join(f"{k!r}: {v}" for k, v in fields)}}},'
    entry = entry.replace("'", '"') if "'" not in key else entry
    if len(entry) <= 99:
        return lines + [entry]
    lines.append(f'{indent}"{key}": {{')
    inner = indent + "    "
    for name, value in fields:
        line = f'{inner}"{name}": {value},'
        if name == "inputs" and len(line) > 99:
            lines.append(f'{inner}"inputs": lambda dtype: [')
            lines += [f"{inner}    {e}," for e in exprs]
            lines.append(f"{inner}],")
        else:
            lines.append(line)
    return lines + [f"{indent}}},"]
