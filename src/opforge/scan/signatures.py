"""C++ signatures as schema arguments, and what a kernel checks of its tensors (the hints
a recipe stub is written from)."""

from __future__ import annotations

import re

from opforge.scan.model import Scan
from opforge.scan.text import closing, split_top

_FUNCTION = re.compile(r"\b(\w+)\s*\(([^(){};]*)\)\s*(?:const\s*)?(?:noexcept\s*)?\{")
_NOT_FUNCTIONS = {"if", "for", "while", "switch", "catch", "return", "sizeof", "defined"}

_INT_TYPES = {"int64_t", "int32_t", "int", "long", "size_t", "int16_t", "int8_t", "uint8_t",
              "unsigned", "SymInt", "c10::SymInt", "longlong"}


def schema_type(ctype: str) -> str | None:
    """A C++ parameter type as a schema type ('const at::Tensor&' -> 'Tensor'), or None."""
    mutable = ctype.rstrip().endswith("&") and not re.search(r"\bconst\b", ctype)
    t = re.sub(r"\b(?:const|volatile|struct|typename)\b", "", ctype).replace(" ", "")
    t = t.rstrip("&")
    optional = re.fullmatch(r"(?:std::|c10::|torch::|at::)?optional<(.*)>", t)
    if optional:
        inner = schema_type(optional.group(1))
        return f"{inner}?" if inner and not inner.endswith("?") else inner
    bare = re.sub(r"^(?:at|torch|c10|std|torch::stable|torch::headeronly)::", "", t)
    bare = re.sub(r"^(?:at|torch|c10|std|stable)::", "", bare)
    if bare == "Tensor":
        return "Tensor(a!)" if mutable else "Tensor"
    if bare in ("TensorList", "ITensorListRef") or re.fullmatch(
            r"vector<(?:at::|torch::)?Tensor>", bare):
        return "Tensor[]"
    if bare in ("double", "float"):
        return "float"
    if bare in _INT_TYPES or bare.replace("unsigned", "") in _INT_TYPES:
        return "int"
    if bare == "bool":
        return "bool"
    if bare in ("IntArrayRef", "SymIntArrayRef", "OptionalIntArrayRef") or re.fullmatch(
            r"(?:vector|ArrayRef|HeaderOnlyArrayRef)<(?:int64_t|int|long)>", bare):
        return "int[]"
    if bare in ("string", "string_view"):
        return "str"
    if bare in ("Scalar", "ScalarType", "Device", "Layout", "MemoryFormat"):
        return bare
    return None


def cxx_params(params: str) -> str | None:
    """'const at::Tensor& x, double a = 1.0' -> 'Tensor x, float a=1.0' (None if unreadable)."""
    out = []
    for param in split_top(params):
        if not param or param == "void":
            continue
        decl, _, default = param.partition("=")
        m = re.fullmatch(r"(.*?[\s&*>])(\w+)", decl.strip())
        ctype, name = (m.group(1), m.group(2)) if m else (decl, f"arg{len(out)}")
        kind = schema_type(ctype)
        if kind is None:
            return None
        default = default.strip()
        default = {"true": "True", "false": "False", "nullptr": "None", "{}": "None",
                   "c10::nullopt": "None", "std::nullopt": "None"}.get(default, default)
        out.append(f"{kind} {name}" + (f"={default}" if default else ""))
    return ", ".join(out)


def index_functions(scan: Scan, text: str) -> None:
    for m in _FUNCTION.finditer(text):
        if m.group(1) not in _NOT_FUNCTIONS and m.group(1) not in scan.cxx_functions:
            body = text[m.end() - 1:closing(text, m.end() - 1)][:6000]
            scan.cxx_functions[m.group(1)] = (m.group(2), body)


_DTYPES = {"Float": "float32", "Double": "float64", "Half": "float16", "BFloat16": "bfloat16",
           "Long": "int64", "Int": "int32", "Short": "int16", "Char": "int8", "Byte": "uint8",
           "Bool": "bool", "Int64": "int64", "Int32": "int32", "Float32": "float32",
           "Float64": "float64", "UInt8": "uint8"}


def tensor_hints(params: str | None, body: str) -> dict[str, dict]:
    """What a kernel checks of its tensor arguments: ``x.dim() == 2`` (rank), ``x.scalar_type()
    == at::kLong`` (dtype), ``x.size(1) == 4`` (a size)."""
    hints: dict[str, dict] = {}
    for part in split_top(params or ""):
        if not part.startswith("Tensor"):
            continue
        name = part.split("=")[0].split()[-1]
        entry: dict = {}
        n = re.escape(name)
        rank = re.search(rf"\b{n}\s*(?:\.|->)\s*(?:dim|ndimension)\s*\(\s*\)\s*==\s*(\d+)", body)
        if rank:
            entry["rank"] = int(rank.group(1))
        dtype = re.search(rf"\b{n}\s*\.\s*(?:scalar_type|dtype)\s*\(\s*\)\s*==\s*"
                          r"(?:at::|torch::|c10::|ScalarType::|headeronly::)*k?(\w+)", body)
        if dtype and dtype.group(1) in _DTYPES:
            entry["dtype"] = _DTYPES[dtype.group(1)]
        sizes = {int(d): int(v) for d, v in re.findall(
            rf"\b{n}\s*\.\s*(?:size|sizes\(\)\s*\[)\s*\(?\s*(\d+)\s*[\])]?\s*==\s*(\d+)", body)}
        if sizes:
            entry["sizes"] = sizes
        if entry:
            hints[name] = entry
    return hints


def _callee(args: str) -> str | None:
    """The C++ function a registration names: '&ns::scatter_sum' -> 'scatter_sum', also
    through TORCH_FN(...) / TORCH_BOX(&...)."""
    m = re.search(r"&?\s*(?:\w+::)*(\w+)\s*$", args.strip()) or \
        re.search(r"\b(?:TORCH_FN|TORCH_BOX|TORCH_FN_TYPE)\s*\(\s*&?\s*(?:\w+::)*(\w+)", args)
    return m.group(1) if m else None


def _merged_hints(scan: Scan, params: str | None, body: str) -> dict[str, dict]:
    """What the function checks of its tensors, and what the functions it calls check of
    parameters of the same name (a wrapper that dispatches to per-device kernels)."""
    hints = tensor_hints(params, body)
    # a call may name template arguments: scan_cpu<scalar_t>(input, ...) in an AT_DISPATCH
    for callee in dict.fromkeys(re.findall(r"\b(\w+)\s*(?:<[^<>(){};]*>)?\s*\(", body)):
        if callee in scan.cxx_functions:
            for name, hint in tensor_hints(params, scan.cxx_functions[callee][1]).items():
                merged = hints.setdefault(name, {})
                for key, value in hint.items():
                    merged.setdefault(key, value)
    return hints


def kernel_hints(scan: Scan, schema: str | None, impl_args: str) -> dict[str, dict]:
    """Hints from the kernel an ``m.impl("op", &fn)`` names, by the schema's argument names
    (the C++ parameters are matched by position)."""
    name = _callee(split_top(impl_args)[0] if impl_args.strip() else "")
    if name not in scan.cxx_functions or not schema or "(" not in schema:
        return {}
    raw, body = scan.cxx_functions[name]
    params = cxx_params(raw)
    if params is None:
        return {}
    cxx_names = [p.split("=")[0].split()[-1] for p in split_top(params)]
    schema_args = split_top(schema[schema.index("(") + 1:schema.rindex(")")]
                             if ")" in schema else "")
    schema_names = [a.split("=")[0].split()[-1] for a in schema_args if a.strip() != "*"]
    rename = dict(zip(cxx_names, schema_names))
    hints = {rename.get(k, k): v for k, v in _merged_hints(scan, params, body).items()}
    if len(cxx_names) == len(schema_names):
        # the kernel's own names, which its error messages and checks use ("Initials must
        # be 1D" for the schema's c): the derive search reads them by position
        for cxx, schema_name in zip(cxx_names, schema_names):
            if cxx != schema_name:
                hints.setdefault(schema_name, {})["cxx"] = cxx
    return hints


def signature(scan: Scan, fn_args: str) -> tuple[str | None, dict]:
    """The parameters of the function or lambda a registration passes, as schema arguments,
    and what its body checks of its tensors."""
    lam = re.search(r"\[[^\]]*\]\s*\(([^()]*)\)\s*(?:->\s*[\w:<>]+\s*)?\{", fn_args)
    if lam:
        params = cxx_params(lam.group(1))
        body = fn_args[lam.end() - 1:closing(fn_args, lam.end() - 1)]
        return params, tensor_hints(params, body)
    head = split_top(fn_args)[0] if fn_args.strip() else ""
    params, body = scan.cxx_functions.get(_callee(head) or "", (None, ""))
    params = cxx_params(params) if params is not None else None
    return params, _merged_hints(scan, params, body)
