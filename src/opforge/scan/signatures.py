"""C++ signatures as schema arguments, and what a kernel checks of its tensors (the hints
a recipe stub is written from)."""

from __future__ import annotations

import re

from opforge.scan.model import Scan
from opforge.scan.text import closing, split_top

_FUNCTION = re.compile(r"\b(\w+)\s*\(([^(){};]*)\)\s*(?:const\s*)?(?:noexcept\s*)?\{")
_NOT_FUNCTIONS = {"if", "for", "while", "switch", "catch", "return", "sizeof", "defined"}
MAX_BODY = 6000  # a function body is kept this far (its opening brace included)

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


_AUTOGRAD_CLASS = re.compile(r"\b(?:class|struct)\s+(\w+)\s*(?:final\s*)?:\s*public\s+"
                             r"(?:torch::autograd::|autograd::)?Function\s*<")


def index_functions(scan: Scan, text: str, rel: str = "") -> None:
    """Every C++ function definition of ``text``: the first one of each name (params, body),
    where each definition's body starts (``cxx_sites``: a name defined twice is seen), and an
    autograd Function's ``forward`` also as ``Name::forward`` (what ``Name::apply`` runs)."""
    classes = [(m.start(), m.group(1)) for m in _AUTOGRAD_CLASS.finditer(text)]
    for m in _FUNCTION.finditer(text):
        if m.group(1) in _NOT_FUNCTIONS:
            continue
        scan.cxx_sites.setdefault(m.group(1), []).append(
            (rel, text.count("\n", 0, m.end() - 1) + 1))
        body = text[m.end() - 1:closing(text, m.end() - 1)][:MAX_BODY]
        if m.group(1) == "forward" and classes:
            owner = [name for start, name in classes if start < m.start()]
            if owner:
                scan.cxx_functions.setdefault(f"{owner[-1]}::forward", (m.group(2), body))
        if m.group(1) not in scan.cxx_functions:
            scan.cxx_functions[m.group(1)] = (m.group(2), body)


_DTYPES = {"Float": "float32", "Double": "float64", "Half": "float16", "BFloat16": "bfloat16",
           "Long": "int64", "Int": "int32", "Short": "int16", "Char": "int8", "Byte": "uint8",
           "Bool": "bool", "Int64": "int64", "Int32": "int32", "Float32": "float32",
           "Float64": "float64", "UInt8": "uint8"}


_CTYPES = {"int64_t": "int64", "long": "int64", "int32_t": "int32", "int": "int32",
           "float": "float32", "double": "float64", "bool": "bool", "uint8_t": "uint8",
           "int8_t": "int8", "int16_t": "int16", "Half": "float16", "BFloat16": "bfloat16"}


_BRANCH = re.compile(r"\bif\s*\(|\bwhile\s*\(|\?|\|\||\belse\b")


def _required(pattern: str, body: str) -> list[re.Match]:
    """The matches that state a requirement (inside a check, an assignment), not a branch:
    ``if (src.dim() == 1)`` or ``a == 1 || b`` says what the kernel handles, not needs."""
    out = []
    for m in re.finditer(pattern, body):
        start = max(body.rfind(c, 0, m.start()) for c in ";{}")
        prefix = body[start + 1:m.start()]
        after = body[m.end():m.end() + 4].lstrip()
        if not _BRANCH.search(prefix) and not after.startswith("||"):
            out.append(m)
    return out


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
        rank = _required(rf"\b{n}\s*(?:\.|->)\s*(?:dim|ndimension)\s*\(\s*\)\s*==\s*(\d+)", body)
        if rank:
            entry["rank"] = int(rank[0].group(1))
        dtype = _required(rf"\b{n}\s*\.\s*(?:scalar_type|dtype)\s*\(\s*\)\s*==\s*"
                          r"(?:at::|torch::|c10::|ScalarType::|headeronly::)*k?(\w+)", body)
        if dtype and dtype[0].group(1) in _DTYPES:
            entry["dtype"] = _DTYPES[dtype[0].group(1)]
        sizes = {int(m.group(1)): int(m.group(2)) for m in _required(
            rf"\b{n}\s*\.\s*(?:size|sizes\(\)\s*\[)\s*\(?\s*(\d+)\s*[\])]?\s*==\s*(\d+)", body)}
        if sizes:
            entry["sizes"] = sizes
        # what the kernel reads it as: x.accessor<int64_t, 2>() is a 2-D int64 tensor,
        # x.data_ptr<int64_t>() an int64 one, x.size(2) / x.stride(2) one of 3 dims at least
        access = re.search(rf"\b{n}\s*\.\s*(?:packed_)?accessor\s*<\s*([\w:]+)\s*,\s*(\d)", body)
        if access and "rank" not in entry:
            entry["rank"] = int(access.group(2))
        pointer = re.search(rf"\b{n}\s*\.\s*(?:data_ptr|data|const_data_ptr|mutable_data_ptr)"
                            r"\s*<\s*([\w:]+)\s*>", body)
        for found in (access, pointer):
            ctype = found.group(1).split("::")[-1] if found else ""
            if ctype in _CTYPES and "dtype" not in entry:
                entry["dtype"] = _CTYPES[ctype]
        used = [int(d) for d in re.findall(rf"\b{n}\s*\.\s*(?:size|stride)\s*\(\s*(\d)\s*\)",
                                           body)]
        if used and "rank" not in entry and max(used) >= 1:
            entry["min_rank"] = max(used) + 1
        if entry:
            hints[name] = entry
    return hints


def _callee(args: str) -> str | None:
    """The C++ function a registration names: '&ns::scatter_sum' -> 'scatter_sum', also
    through TORCH_FN(...) / TORCH_BOX(&...)."""
    m = re.search(r"&?\s*(?:\w+::)*(\w+)\s*$", args.strip()) or \
        re.search(r"\b(?:TORCH_FN|TORCH_BOX|TORCH_FN_TYPE)\s*\(\s*&?\s*(?:\w+::)*(\w+)", args)
    return m.group(1) if m else None


_CALL = re.compile(r"\b(\w+)\s*(?:<[^<>(){};]*>)?\s*\(")   # also scan_cpu<scalar_t>(...)
_APPLY = re.compile(r"\b(\w+)\s*::\s*apply\s*\(")           # an autograd Function run
_DEPTH = 4


def _callees(text: str) -> list[str]:
    return list(dict.fromkeys([f"{c}::forward" for c in _APPLY.findall(text)]
                              + _CALL.findall(text)))


def _merged_hints(scan: Scan, params: str | None, body: str) -> dict[str, dict]:
    """What the function checks of its tensors, and what the functions it calls (to four
    levels: a wrapper, its autograd Function's forward, a device switch, the device kernel)
    check of parameters of the same name. The nearest check wins; a minimum rank yields to
    an exact one."""
    hints = tensor_hints(params, body)
    seen: set[str] = set()
    level = [body]
    for _ in range(_DEPTH):
        following = []
        for text in level:
            for callee in _callees(text):
                if callee in scan.cxx_functions and callee not in seen:
                    seen.add(callee)
                    inner = scan.cxx_functions[callee][1]
                    following.append(inner)
                    for name, hint in tensor_hints(params, inner).items():
                        merged = hints.setdefault(name, {})
                        for key, value in hint.items():
                            merged.setdefault(key, value)
        level = following
    for hint in hints.values():
        if "rank" in hint:
            hint.pop("min_rank", None)
        elif "min_rank" in hint and hint.get("sizes"):
            hint["min_rank"] = max(hint["min_rank"], max(map(int, hint["sizes"])) + 1)
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
