"""Read an op extension's sources: its package, namespaces, ops and the kernels each op has.

What is recognised (``opforge init`` writes the configuration from it):

- C++ / CUDA / Objective-C++: ``TORCH_LIBRARY``, ``TORCH_LIBRARY_FRAGMENT`` and
  ``STABLE_TORCH_LIBRARY(_FRAGMENT)`` blocks with ``m.def("name(schema) -> ...")``
  (also through ``TORCH_SELECTIVE_SCHEMA``); ``TORCH_LIBRARY_IMPL(ns, KEY, m)`` and
  ``STABLE_TORCH_LIBRARY_IMPL`` blocks with ``m.impl("name", ...)``.
- Python: ``torch.library.custom_op("ns::name", ..., device_types=...)``, ``define``,
  ``Library(ns, ...)`` + ``lib.define`` / ``lib.impl``, ``register_fake`` / ``impl_abstract``,
  ``register_autograd``, ``register_kernel``, ``register_autocast``, ``impl`` — as calls or
  decorators, with the op named by a string literal.
- Old-style ``torch::RegisterOperators().op("ns::name(schema)" or "ns::name", &fn)`` chains
  (also ``RegisterOperators::options().schema(...).kernel(DispatchKey::X)``); a bare name's
  schema is inferred from the C++ signature of ``fn``, as torch infers it.
- ``PYBIND11_MODULE(name, m)`` with ``m.def("fn", &fn, py::arg(...))``: the module's import
  name comes from the build configuration (``TORCH_EXTENSION_NAME`` is the ``name=`` of the
  setup.py extension whose sources hold the file), and so does the backend it serves (named
  ``*_cuda`` or built only from ``.cu`` sources: CUDA). Libraries the package loads with
  ``torch.ops.load_library`` are the setup.py extensions that register ops but no module.
- The build configuration: ``[project] name`` in pyproject.toml, ``name=`` in setup.py or
  setup.cfg, the build backend, and the package directory.

For each file, what was found is kept (``Scan.found``), and what cannot be read statically
(a name built at run time, a module no build configuration names) is kept with what to write
in matrix.yaml by hand (``Scan.by_hand``).

Nothing is imported or executed: a name built at run time (an f-string, a variable) is not seen.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

from opforge.dispatch_keys import DEVICE_KEY as BACKEND_KEY_OF_DEVICE
from opforge.errors import UsageError
from opforge.files import read_head

SKIP_DIRS = {".git", ".nox", ".venv", "venv", "build", "dist", "node_modules", "__pycache__",
             ".tox", "third_party", "docs", ".github", ".eggs"}
CXX_SUFFIXES = (".cpp", ".cc", ".cxx", ".cu", ".mm", ".h", ".hpp", ".cuh")
# torch.library's device types as dispatch keys (a kernel for the meta device is a fake kernel)
DEVICE_KEY = {**BACKEND_KEY_OF_DEVICE, "meta": "Meta"}
# what a registration alias provides, in the terms matrix.yaml uses
ALIAS_KEYS = {"CompositeExplicitAutograd": ("CPU", "CUDA", "MPS"),
              "CompositeImplicitAutograd": ("CPU", "CUDA", "MPS", "Autograd"),
              "AutogradCPU": ("Autograd",), "AutogradCUDA": ("Autograd",),
              "AutogradMPS": ("Autograd",), "Autograd": ("Autograd",)}

_NOT_PACKAGES = {"tests", "test", "benchmarks", "examples", "docs", "scripts", "tools"}
_LIBRARY = re.compile(r"\b(?:STABLE_)?TORCH_LIBRARY(?:_FRAGMENT)?\s*\(\s*(\w+)\s*,\s*(\w+)\s*\)")
_LIBRARY_IMPL = re.compile(
    r"\b(?:STABLE_)?TORCH_LIBRARY_IMPL\s*\(\s*(\w+)\s*,\s*(\w+)\s*,\s*(\w+)\s*\)")
_STRING = r'"((?:[^"\\]|\\.)*)"'


_REGISTER_OPERATORS = re.compile(r"\b(?:torch|c10)::RegisterOperators\b\s*(?:\(|\{)")
_PYBIND_MODULE = re.compile(r"\bPYBIND11_MODULE\s*\(\s*(\w+)\s*,\s*(\w+)\s*\)")
_FUNCTION = re.compile(r"\b(\w+)\s*\(([^(){};]*)\)\s*(?:const\s*)?(?:noexcept\s*)?\{")
_NOT_FUNCTIONS = {"if", "for", "while", "switch", "catch", "return", "sizeof", "defined"}
_EXTENSION_CALLS = {"CppExtension", "CUDAExtension", "Extension", "Pybind11Extension",
                    "SyclExtension"}
BACKEND_SUFFIXES = (("cuda", ("_cuda", "cuda", "_gpu", "_cu")), ("mps", ("_mps", "_metal")),
                    ("cpu", ("_cpu", "cpu")))


@dataclass
class ScannedOp:
    name: str
    schema: str | None = None
    keys: set[str] = field(default_factory=set)
    mutating: bool = False
    where: str = ""
    inferred: bool = False   # schema inferred from a C++ or Python signature, not written
    hints: dict[str, dict] = field(default_factory=dict)  # argument -> {rank, dtype} checked
    pending_impl: str = ""   # the CPU kernel's registration, read for hints after the scan

    @property
    def backward_only(self) -> bool:
        return "backward" in self.name.lower()


@dataclass
class ScannedModule:
    """A compiled module of the package: a pybind11 module the package imports, or a library
    it loads with ``torch.ops.load_library`` (``load == "library"``), and the backend it serves."""

    name: str                                  # the dotted import name
    backend: str = "cpu"
    load: str = "import"
    functions: dict[str, str | None] = field(default_factory=dict)  # name -> signature
    hints: dict[str, dict[str, dict]] = field(default_factory=dict)  # name -> argument hints
    sources: list[str] = field(default_factory=list)
    where: str = ""


@dataclass
class BuiltExtension:
    """One extension module the build configuration compiles (setup.py or CMakeLists.txt)."""

    name: str
    sources: list[str] | None     # relative to the root; None when computed at build time
    kind: str
    where: str

    @property
    def backend(self) -> str:
        last = self.name.rsplit(".", 1)[-1].lower()
        for backend, suffixes in BACKEND_SUFFIXES:
            if last.endswith(suffixes):
                return backend
        if self.sources and all(s.endswith((".cu", ".cuh")) for s in self.sources):
            return "cuda"
        return "cpu"


@dataclass
class Scan:
    root: Path
    distribution: str | None = None
    package: str | None = None
    build_backend: str | None = None
    namespaces: dict[str, dict[str, ScannedOp]] = field(default_factory=dict)
    modules: dict[str, ScannedModule] = field(default_factory=dict)
    extensions: list[BuiltExtension] = field(default_factory=list)
    sources: dict[str, int] = field(default_factory=dict)   # suffix -> count
    notes: list[str] = field(default_factory=list)
    found: dict[str, list[str]] = field(default_factory=dict)   # file -> what it registers
    by_hand: list[str] = field(default_factory=list)  # what could not be read, and what to write
    cxx_functions: dict[str, tuple[str, str]] = field(default_factory=dict)  # -> params, body
    # file -> (PYBIND11_MODULE name, functions, hints) before the module's name is resolved
    pybind: dict[str, tuple[str, dict[str, str | None], dict]] = field(default_factory=dict)
    registers: dict[str, set[str]] = field(default_factory=dict)  # file -> qualified op names
    abi_kinds: set[str] = field(default_factory=set)  # "stable" / "legacy" registrations seen
    torch_floor: str | None = None   # from TORCH_TARGET_VERSION in the build configuration

    @property
    def stable_only(self) -> bool:
        return self.abi_kinds == {"stable"}

    def op(self, namespace: str, name: str, where: str) -> ScannedOp:
        ops = self.namespaces.setdefault(namespace, {})
        if name not in ops:
            ops[name] = ScannedOp(name=name, where=where)
        return ops[name]

    def saw(self, rel: str, what: str) -> None:
        self.found.setdefault(rel, []).append(what)

    @property
    def has_cuda(self) -> bool:
        return bool(self.sources.get(".cu") or self.sources.get(".cuh"))

    @property
    def has_mps(self) -> bool:
        return bool(self.sources.get(".mm") or self.sources.get(".metal"))


def _files(root: Path):
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if any(part in SKIP_DIRS or part.startswith(".") for part in rel.parts[:-1]):
            continue
        if path.is_file():
            yield path


def _closing(text: str, start: int, open_: str = "{", close: str = "}") -> int:
    """The index of the bracket that closes the one at ``start`` (or len(text))."""
    depth, i = 0, start
    while i < len(text):
        if text[i] == '"':  # skip string literals: a schema may hold brackets
            i += 1
            while i < len(text) and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif text[i] == open_:
            depth += 1
        elif text[i] == close:
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return i


def _blocks(text: str, pattern: re.Pattern):
    """(match, body) for each ``MACRO(...) { body }``, braces balanced."""
    for match in pattern.finditer(text):
        start = text.find("{", match.end())
        if start == -1:
            continue
        yield match, text[start + 1:_closing(text, start)]


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def _line(text: str, index: int) -> int:
    return text.count("\n", 0, index) + 1


def _schema_name(schema: str) -> tuple[str | None, str]:
    """'ns::name.overload(Tensor x) -> Tensor' -> ('ns', 'name')."""
    head = schema.split("(", 1)[0].strip()
    ns, _, name = head.rpartition("::")
    return (ns or None), name.split(".", 1)[0]


# --------------------------------------------------------------------------- C++ signatures

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
    for param in _split_top(params):
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


def _split_top(text: str) -> list[str]:
    """Split on commas outside <>, (), [] and {}."""
    parts, depth, current = [], 0, ""
    for ch in text:
        if ch in "<([{":
            depth += 1
        elif ch in ">)]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += ch
    if current.strip():
        parts.append(current.strip())
    return parts


def _index_functions(scan: Scan, text: str) -> None:
    for m in _FUNCTION.finditer(text):
        if m.group(1) not in _NOT_FUNCTIONS and m.group(1) not in scan.cxx_functions:
            body = text[m.end() - 1:_closing(text, m.end() - 1)][:6000]
            scan.cxx_functions[m.group(1)] = (m.group(2), body)


_DTYPES = {"Float": "float32", "Double": "float64", "Half": "float16", "BFloat16": "bfloat16",
           "Long": "int64", "Int": "int32", "Short": "int16", "Char": "int8", "Byte": "uint8",
           "Bool": "bool", "Int64": "int64", "Int32": "int32", "Float32": "float32",
           "Float64": "float64", "UInt8": "uint8"}


def tensor_hints(params: str | None, body: str) -> dict[str, dict]:
    """What a kernel checks of its tensor arguments: ``x.dim() == 2`` (rank), ``x.scalar_type()
    == at::kLong`` (dtype), ``x.size(1) == 4`` (a size)."""
    hints: dict[str, dict] = {}
    for part in _split_top(params or ""):
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
    for callee in dict.fromkeys(re.findall(r"\b(\w+)\s*\(", body)):
        if callee in scan.cxx_functions:
            for name, hint in tensor_hints(params, scan.cxx_functions[callee][1]).items():
                merged = hints.setdefault(name, {})
                for key, value in hint.items():
                    merged.setdefault(key, value)
    return hints


def kernel_hints(scan: Scan, schema: str | None, impl_args: str) -> dict[str, dict]:
    """Hints from the kernel an ``m.impl("op", &fn)`` names, by the schema's argument names
    (the C++ parameters are matched by position)."""
    name = _callee(_split_top(impl_args)[0] if impl_args.strip() else "")
    if name not in scan.cxx_functions or not schema or "(" not in schema:
        return {}
    raw, body = scan.cxx_functions[name]
    params = cxx_params(raw)
    if params is None:
        return {}
    cxx_names = [p.split("=")[0].split()[-1] for p in _split_top(params)]
    schema_args = _split_top(schema[schema.index("(") + 1:schema.rindex(")")]
                             if ")" in schema else "")
    schema_names = [a.split("=")[0].split()[-1] for a in schema_args if a.strip() != "*"]
    rename = dict(zip(cxx_names, schema_names))
    return {rename.get(k, k): v for k, v in _merged_hints(scan, params, body).items()}


def _signature(scan: Scan, fn_args: str) -> tuple[str | None, dict]:
    """The parameters of the function or lambda a registration passes, as schema arguments,
    and what its body checks of its tensors."""
    lam = re.search(r"\[[^\]]*\]\s*\(([^()]*)\)\s*(?:->\s*[\w:<>]+\s*)?\{", fn_args)
    if lam:
        params = cxx_params(lam.group(1))
        body = fn_args[lam.end() - 1:_closing(fn_args, lam.end() - 1)]
        return params, tensor_hints(params, body)
    head = _split_top(fn_args)[0] if fn_args.strip() else ""
    params, body = scan.cxx_functions.get(_callee(head) or "", (None, ""))
    params = cxx_params(params) if params is not None else None
    return params, _merged_hints(scan, params, body)


# --------------------------------------------------------------------------- reading sources

MAX_SOURCE_BYTES = 8 << 20  # more than any source file; a bigger one is read this far only


def _source(path: Path) -> str:
    """A source file's text, its first MAX_SOURCE_BYTES at most, read in chunks (a 3 GB or
    sparse file costs no more); a file that cannot be read (a FIFO, a device) reads as empty."""
    try:
        return read_head(path, MAX_SOURCE_BYTES).decode("utf-8", errors="replace")
    except UsageError:
        return ""


def _toml_table(scan: Scan, data: dict, *keys: str) -> dict:
    """``data[k1][k2]...``, or {} (with a note) where the file puts something else there."""
    node = data
    for depth, key in enumerate(keys):
        node = node.get(key, {})
        if not isinstance(node, dict):
            scan.notes.append(f"pyproject.toml: [{'.'.join(keys[:depth + 1])}] is "
                              f"{type(node).__name__}, not a table; ignored")
            return {}
    return node


def _toml_text(scan: Scan, data: dict, table: str, key: str) -> str | None:
    value = _toml_table(scan, data, table).get(key)
    if value is not None and not isinstance(value, str):
        scan.notes.append(f"pyproject.toml: [{table}] {key} is {type(value).__name__}, not "
                          "text; ignored")
        return None
    return value


# --------------------------------------------------------------------------- C++ registrations

def scan_cxx(scan: Scan, path: Path) -> None:
    raw = _source(path)
    text = _strip_comments(raw)
    rel = path.relative_to(scan.root).as_posix()
    registered = scan.registers.setdefault(rel, set())
    for match, body in _blocks(text, _LIBRARY):
        namespace = match.group(1)
        scan.namespaces.setdefault(namespace, {})
        names = []
        for d in re.finditer(r"\.def\s*\(\s*(?:TORCH_SELECTIVE_SCHEMA\s*\(\s*)?((?:" + _STRING
                             + r"\s*)+)", body):
            schema = "".join(re.findall(_STRING, d.group(1)))
            ns, name = _schema_name(schema)
            op = scan.op(ns or namespace, name, rel)
            registered.add(f"{ns or namespace}::{name}")
            names.append(name)
            op.where = rel  # where the op is defined, rather than first seen
            if "(" in schema:
                op.schema = schema
            op.mutating = op.mutating or "!)" in schema
            # m.def("schema", &fn): a catch-all kernel, used for every key
            rest = body[d.end():_closing(body, d.start() + body[d.start():].find("("), "(", ")")]
            if rest.lstrip().startswith(","):
                op.keys.update(ALIAS_KEYS["CompositeImplicitAutograd"])
                if "(" not in schema and op.schema is None:
                    _infer(op, scan, rest.lstrip()[1:])
        kind = match.group(0).split("(")[0].strip()
        scan.abi_kinds.add("stable" if kind.startswith("STABLE_") else "legacy")
        scan.saw(rel, f"{kind}({namespace}): " + (f"defines {', '.join(names)}" if names
                                                  else "no m.def"))
    for match, body in _blocks(text, _LIBRARY_IMPL):
        namespace, key = match.group(1), match.group(2)
        names = []
        for i in re.finditer(r"\.impl\s*\(\s*(?:TORCH_SELECTIVE_NAME\s*\(\s*)?" + _STRING, body):
            ns, name = _schema_name(i.group(1))
            op = scan.op(ns or namespace, name, rel)
            op.keys.update(ALIAS_KEYS.get(key, (key,)))
            if key in ("CPU", "CompositeExplicitAutograd", "CompositeImplicitAutograd") and \
                    not op.hints:
                impl = body[i.end():_closing(body, body.rfind("(", 0, i.start() + 6), "(", ")")]
                impl = impl.lstrip()[1:] if impl.lstrip().startswith(",") else impl
                op.pending_impl = impl
            registered.add(f"{ns or namespace}::{name}")
            names.append(name)
        scan.saw(rel, f"{match.group(0).split('(')[0].strip()}({namespace}, {key}): "
                      f"{', '.join(names) or 'no m.impl'}")
    _register_operators(scan, text, rel, registered)
    _pybind_modules(scan, text, rel)


def _infer(op: ScannedOp, scan: Scan, fn_args: str) -> None:
    params, op.hints = _signature(scan, fn_args)
    if params is not None:
        op.schema, op.inferred = f"{op.name}({params}) -> ...", True
        op.mutating = op.mutating or "!)" in params


def _register_operators(scan: Scan, text: str, rel: str, registered: set[str]) -> None:
    """``torch::RegisterOperators().op("ns::name", &fn).op(...)`` and the options() form."""
    for match in _REGISTER_OPERATORS.finditer(text):
        end = text.find(";", match.end())
        while end != -1 and text.count("(", match.start(), end) > text.count(")", match.start(), end):
            end = text.find(";", end + 1)
        chain = text[match.start():end if end != -1 else len(text)]
        calls = []  # the argument text of each .op(...) and of the constructor
        for c in re.finditer(r"(?:\.op\s*\(|RegisterOperators\s*[({])", chain):
            opened = c.end() - 1
            calls.append(chain[opened + 1:_closing(chain, opened, chain[opened],
                                                   ")" if chain[opened] == "(" else "}")])
        names = []
        for args in calls:
            strings = re.findall(_STRING, args)
            schema = next((s for s in strings if "::" in s), None)
            if schema is None:
                continue
            ns, name = _schema_name(schema)
            if ns is None:
                continue
            op = scan.op(ns, name, rel)
            op.where = rel
            registered.add(f"{ns}::{name}")
            names.append(name)
            if "(" in schema:
                op.schema = schema.split("::", 1)[1]
                op.mutating = op.mutating or "!)" in schema
            else:
                after = args[args.find('"' + schema + '"') + len(schema) + 2:].lstrip()
                _infer(op, scan, after[1:] if after.startswith(",") else after)
            keys = re.findall(r"DispatchKey::(\w+)", args)
            for key in keys or ["CompositeImplicitAutograd"]:  # no key: a catch-all kernel
                op.keys.update(ALIAS_KEYS.get(key, (key,)))
        scan.abi_kinds.add("legacy")
        if names:
            scan.saw(rel, f"RegisterOperators: {', '.join(names)}")
        else:
            scan.by_hand.append(f"{rel}:{_line(text, match.start())}: a RegisterOperators "
                                "chain whose op names are not string literals: list its ops "
                                "under extension.ops in matrix.yaml by hand")


def _pybind_modules(scan: Scan, text: str, rel: str) -> None:
    for match, body in _blocks(text, _PYBIND_MODULE):
        name, var = match.group(1), match.group(2)
        functions: dict[str, str | None] = {}
        hints: dict[str, dict] = {}
        for d in re.finditer(rf"\b{var}\s*\.\s*def\s*\(\s*{_STRING}", body):
            opened = body.rfind("(", 0, d.end())
            args = body[d.end():_closing(body, opened, "(", ")")].lstrip()
            args = args[1:] if args.startswith(",") else args
            params, hints[d.group(1)] = _signature(scan, args)
            if params is not None:
                params = _pybind_defaults(params, args)
            functions[d.group(1)] = params
        scan.pybind[rel] = (name, functions, hints)
        scan.abi_kinds.add("legacy")


def _pybind_defaults(params: str, args: str) -> str:
    """Apply ``py::arg("k") = 3`` defaults (and names) to the inferred parameters."""
    given = re.findall(r"(?:py|pybind11)::arg\s*\(\s*" + _STRING + r"\s*\)\s*(?:=\s*([^,)]+))?",
                       args)
    parts = _split_top(params)
    if not given or len(given) != len(parts):
        return params
    out = []
    for part, (name, default) in zip(parts, given):
        kind = part.split(" ", 1)[0]
        default = {"true": "True", "false": "False", "py::none()": "None"}.get(
            default.strip(), default.strip())
        out.append(f"{kind} {name}" + (f"={default}" if default else ""))
    return ", ".join(out)


# --------------------------------------------------------------------------- Python registrations

_PY_CALLS = {"custom_op", "define", "register_fake", "impl_abstract", "register_autograd",
             "register_kernel", "register_autocast", "impl", "triton_op"}


def python_schema_type(annotation: ast.expr | None) -> str | None:
    """A Python annotation as a schema type (``torch.Tensor`` -> 'Tensor'), or None."""
    if annotation is None:
        return None
    text = ast.unparse(annotation).replace("typing.", "").replace(" ", "")
    optional = re.fullmatch(r"Optional\[(.*)\]", text) or re.fullmatch(r"(.*)\|None", text) or \
        re.fullmatch(r"None\|(.*)", text)
    if optional:
        inner = python_schema_type(ast.parse(optional.group(1), mode="eval").body)
        return f"{inner}?" if inner else None
    text = text.replace("torch.", "")
    seq = re.fullmatch(r"(?:list|List|Sequence|tuple|Tuple)\[(\w+)(?:,\.\.\.)?\]", text)
    if seq:
        inner = {"Tensor": "Tensor", "int": "int", "float": "float", "bool": "bool"}.get(
            seq.group(1))
        return f"{inner}[]" if inner else None
    return {"Tensor": "Tensor", "int": "int", "float": "float", "bool": "bool", "str": "str",
            "SymInt": "int", "Number": "Scalar", "dtype": "ScalarType",
            "device": "Device"}.get(text)


def _python_params(func: ast.FunctionDef, mutated: set[str]) -> str | None:
    args = func.args
    positional = [*args.posonlyargs, *args.args]
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    pairs = list(zip(positional, defaults)) + list(zip(args.kwonlyargs, args.kw_defaults))
    out = []
    for arg, default in pairs:
        kind = python_schema_type(arg.annotation)
        if kind is None:
            return None
        if arg.arg in mutated and kind == "Tensor":
            kind = "Tensor(a!)"
        out.append(f"{kind} {arg.arg}" + (f"={ast.unparse(default)}" if default else ""))
    return ", ".join(out)


def scan_python(scan: Scan, path: Path) -> None:
    try:
        tree = ast.parse(_source(path))
    except SyntaxError:
        scan.notes.append(f"{path.relative_to(scan.root)}: not valid Python, skipped")
        return
    rel = path.relative_to(scan.root).as_posix()
    libraries: dict[str, str] = {}  # variable -> namespace of torch.library.Library(ns, kind)
    decorated: dict[int, ast.FunctionDef] = {}  # id(decorator call) -> the function
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and \
                _name(node.value.func) == "Library" and node.value.args and \
                isinstance(node.value.args[0], ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    libraries[target.id] = str(node.value.args[0].value)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for deco in node.decorator_list:
                decorated[id(deco)] = node
        if isinstance(node, ast.Call) and _name(node.func) == "load_library":
            scan.saw(rel, "torch.ops.load_library (libraries the package loads)")
    seen: dict[str, list[str]] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or _name(node.func) not in _PY_CALLS:
            continue
        kind = _name(node.func)
        args = [a.value if isinstance(a, ast.Constant) else None for a in node.args]
        kwargs = {k.arg: k.value for k in node.keywords}
        first = args[0] if args else _constant(kwargs.get("qualname") or kwargs.get("name"))
        owner = node.func.value.id if isinstance(node.func, ast.Attribute) and \
            isinstance(node.func.value, ast.Name) else None
        torch_call = owner in libraries or owner in ("library", "torch") or \
            ast.unparse(node.func).startswith("torch.library.")
        if not isinstance(first, str):
            if torch_call and kind in ("define", "custom_op", "register_kernel") and \
                    node.args and not set(Path(rel).parts[:-1]) & _NOT_PACKAGES:
                scan.by_hand.append(f"{rel}:{node.lineno}: {ast.unparse(node.func)}(...) names "
                                    "its op at run time: list the op under extension.ops in "
                                    "matrix.yaml by hand")
            continue
        if owner in libraries and "::" not in first:
            first = f"{libraries[owner]}::{first}"
        ns, name = _schema_name(first)
        if ns is None or not name.isidentifier():
            continue
        op = scan.op(ns, name, rel)
        seen.setdefault(kind, []).append(f"{ns}::{name}")
        if kind in ("define", "custom_op", "triton_op"):
            op.where = rel
        if kind == "define":
            # define("ns::op(Tensor x) -> Tensor") or define("ns::op", "(Tensor x) -> Tensor")
            schema = first.split("::", 1)[1] if "::" in first else first
            if "(" not in schema and len(args) > 1 and isinstance(args[1], str):
                schema += args[1]
            op.schema = schema if "(" in schema else op.schema
            op.mutating = op.mutating or "!)" in schema
        elif kind in ("custom_op", "triton_op"):
            devices = _device_types(kwargs.get("device_types"))
            op.keys.update({"Meta", "Autograd"})
            op.keys.update([DEVICE_KEY.get(d, d.upper()) for d in devices]
                           if devices else ALIAS_KEYS["CompositeExplicitAutograd"])
            mutates = kwargs.get("mutates_args")
            names = {e.value for e in getattr(mutates, "elts", []) if isinstance(e, ast.Constant)}
            op.mutating = op.mutating or bool(names) or \
                (isinstance(mutates, ast.Constant) and mutates.value == "unknown")
            func = decorated.get(id(node))
            if func is None and len(node.args) > 1 and isinstance(node.args[1], ast.Name):
                func = next((f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)
                             and f.name == node.args[1].id), None)
            params = _python_params(func, names) if func is not None else None
            if params is not None and not op.schema:
                op.schema, op.inferred = f"{name}({params}) -> ...", True
        elif kind in ("register_fake", "impl_abstract"):
            op.keys.add("Meta")
        elif kind == "register_autograd":
            op.keys.add("Autograd")
        elif kind in ("register_kernel", "register_autocast", "impl"):
            # impl("ns::op", "cpu"), register_kernel("ns::op", ("cpu", "cuda"), fn),
            # lib.impl("op", fn, "CPU")
            device = next((a for a in args[1:] if isinstance(a, str)), None) or \
                next((_device_types(a) for a in node.args[1:]
                      if isinstance(a, (ast.Tuple, ast.List))), None) or \
                _device_types(kwargs.get("device_types") or kwargs.get("dispatch_key")
                              or kwargs.get("types"))
            for d in _as_list(device):
                if kind == "register_autocast":
                    op.keys.add("Autocast" + DEVICE_KEY.get(d, d.upper()))
                else:
                    key = DEVICE_KEY.get(d, d)
                    op.keys.update(ALIAS_KEYS.get(key, (key,)))
            if device is None and kind == "register_kernel":
                op.keys.update(ALIAS_KEYS["CompositeExplicitAutograd"])
    for kind, names in seen.items():
        scan.saw(rel, f"{kind}: {', '.join(dict.fromkeys(names))}")


def _name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else None


def _constant(node):
    return node.value if isinstance(node, ast.Constant) else None


def _as_list(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    return [v for v in value or [] if isinstance(v, str)]


def _device_types(node) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List)):
        return [e.value for e in node.elts if isinstance(e, ast.Constant)]
    return []


# --------------------------------------------------------------------------- build configuration

def _evaluate(node: ast.expr, env: dict, root: Path):
    """A setup.py expression's value where it is made of literals, names bound to them, list
    concatenation, os.path.join and glob.glob; None for anything computed otherwise."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        return env.get(node.id)
    if isinstance(node, (ast.List, ast.Tuple)):
        items = [_evaluate(e, env, root) for e in node.elts]
        if any(i is None for i in items):
            return None
        return [x for i in items for x in (i if isinstance(i, list) else [i])]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _evaluate(node.left, env, root), _evaluate(node.right, env, root)
        if isinstance(left, list) and isinstance(right, list):
            return left + right
        if isinstance(left, str) and isinstance(right, str):
            return left + right
        return None
    if isinstance(node, ast.Call):
        func = ast.unparse(node.func)
        args = [_evaluate(a, env, root) for a in node.args]
        if any(not isinstance(a, str) for a in args):
            return None
        if func in ("os.path.join", "osp.join", "path.join", "join"):
            return "/".join(args)
        if func in ("glob.glob", "glob") and len(args) == 1:
            return sorted(p.relative_to(root).as_posix() for p in root.glob(args[0]))
    return None


def scan_setup_py(scan: Scan, path: Path) -> None:
    """The extension modules setup.py compiles: their names and sources, where literal."""
    try:
        tree = ast.parse(_source(path))
    except SyntaxError:
        scan.notes.append("setup.py: not valid Python, its extension modules are not read")
        return
    env: dict = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and \
                isinstance(node.targets[0], ast.Name):
            value = _evaluate(node.value, env, scan.root)
            if value is not None:
                env[node.targets[0].id] = value
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or _name(node.func) not in _EXTENSION_CALLS:
            continue
        kwargs = {k.arg: k.value for k in node.keywords}
        name_node = node.args[0] if node.args else kwargs.get("name")
        sources_node = node.args[1] if len(node.args) > 1 else kwargs.get("sources")
        name = _evaluate(name_node, env, scan.root) if name_node is not None else None
        sources = _evaluate(sources_node, env, scan.root) if sources_node is not None else None
        if not isinstance(name, str):
            shown = ast.unparse(name_node)[:80] if name_node is not None else "no name"
            scan.by_hand.append(f"setup.py:{node.lineno}: {_name(node.func)}({shown}, ...) names "
                                "its module at build time (an f-string, a loop): list the modules "
                                "it builds under extension.modules in matrix.yaml by hand")
            continue
        if isinstance(sources, str):
            sources = [sources]
        sources = [str(Path(s).as_posix()).removeprefix("./") for s in sources] \
            if isinstance(sources, list) else None
        scan.extensions.append(BuiltExtension(name=name, sources=sources,
                                              kind=_name(node.func) or "",
                                              where=f"setup.py:{node.lineno}"))
        scan.saw("setup.py", f"{_name(node.func)}({name!r}"
                             + (f", {len(sources)} source(s))" if sources is not None
                                else ", sources computed at build time)"))


def scan_cmake(scan: Scan, path: Path) -> None:
    """``pybind11_add_module(name src...)`` / ``Python_add_library(name MODULE src...)``."""
    text = re.sub(r"#[^\n]*", "", _source(path))
    rel = path.relative_to(scan.root).as_posix()
    for m in re.finditer(r"\b(pybind11_add_module|python_add_library|Python_add_library|"
                         r"Python3_add_library)\s*\(([^)]*)\)", text, re.I):
        words = m.group(2).split()
        if not words or "$" in words[0]:
            continue
        base = path.parent.relative_to(scan.root)
        sources = [(base / w).as_posix().removeprefix("./") for w in words[1:]
                   if w.endswith(CXX_SUFFIXES)]
        scan.extensions.append(BuiltExtension(name=words[0], sources=sources or None,
                                              kind=m.group(1), where=f"{rel}:{_line(text, m.start())}"))
        scan.saw(rel, f"{m.group(1)}({words[0]})")


def scan_build_config(scan: Scan) -> None:
    root = scan.root
    pyproject = root / "pyproject.toml"
    data: dict = {}
    if pyproject.is_file():
        try:
            import tomllib
        except ModuleNotFoundError:  # Python 3.10
            import tomli as tomllib  # type: ignore[no-redef]
        try:
            data = tomllib.loads(read_head(pyproject, MAX_SOURCE_BYTES).decode("utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError, UsageError) as exc:
            scan.notes.append(f"pyproject.toml: not valid TOML ({exc}), ignored")
            data = {}
        scan.distribution = _toml_text(scan, data, "project", "name")
        scan.build_backend = _toml_text(scan, data, "build-system", "build-backend")
    for name in ("setup.py", "setup.cfg"):
        path = root / name
        if scan.distribution is None and path.is_file():
            text = _source(path)
            m = re.search(r"""\bname\s*=\s*["']([A-Za-z0-9._-]+)["']""", text) if \
                name == "setup.py" else re.search(r"^name\s*=\s*([A-Za-z0-9._-]+)\s*$", text, re.M)
            if m:
                scan.distribution = m.group(1)
    declared = _toml_table(scan, data, "tool", "scikit-build", "wheel").get("packages")
    if not isinstance(declared, list):
        declared = None
    packages = [root / d for d in declared or []
                if isinstance(d, str) and (root / d / "__init__.py").is_file()]
    if not packages:  # top-level packages: __init__.py in a directory whose parent has none
        packages = [p.parent for depth in ("*", "*/*", "*/*/*")
                    for p in sorted(root.glob(f"{depth}/__init__.py"))
                    if not (p.parent.parent / "__init__.py").is_file()
                    and not set(p.relative_to(root).parts[:-1]) & (SKIP_DIRS | _NOT_PACKAGES)]
    wanted = (scan.distribution or "").replace("-", "_").lower()
    chosen = [p for p in packages if p.name.lower() == wanted] or packages
    if chosen:
        scan.package = chosen[0].name
        if len(chosen) > 1:
            scan.notes.append(f"several packages ({', '.join(p.name for p in chosen)}); "
                              f"chose {scan.package}")
    if scan.distribution is None and scan.package:
        scan.distribution = scan.package.replace("_", "-")
    if (root / "setup.py").is_file():
        scan_setup_py(scan, root / "setup.py")


def resolve_modules(scan: Scan) -> None:
    """Name each PYBIND11_MODULE by the extension module that compiles it, and list the
    per-backend libraries (two or more compiled modules that register ops, no pybind11)."""
    exts = scan.extensions

    def full(ext: BuiltExtension) -> str:
        cmake = not ext.where.startswith("setup.py")
        return f"{scan.package}.{ext.name}" if cmake and scan.package else ext.name

    for rel, (name, functions, hints) in sorted(scan.pybind.items()):
        if name == "TORCH_EXTENSION_NAME":
            owners = [e for e in exts if e.sources is not None and rel in e.sources]
            if not owners and len(exts) == 1:
                owners = exts
        else:
            owners = [e for e in exts if e.name.rsplit(".", 1)[-1] == name]
        fns = ", ".join(functions) or "no m.def"
        if not owners:
            guess = f"{scan.package}.{name}" if name != "TORCH_EXTENSION_NAME" and scan.package \
                else "<package>.<module>"
            scan.saw(rel, f"PYBIND11_MODULE({name}): {fns}")
            scan.by_hand.append(
                f"{rel}: PYBIND11_MODULE({name}) is compiled by no extension module the build "
                "configuration names literally: add it to matrix.yaml by hand, under "
                f"extension.modules: `{guess}: {{backend: cpu, functions: [{', '.join(functions)}]}}`"
                " (backend cuda for the module only a CUDA build compiles)")
            continue
        for ext in owners:
            module = scan.modules.setdefault(full(ext), ScannedModule(
                name=full(ext), backend=ext.backend, where=ext.where))
            module.functions.update(functions)
            module.hints.update(hints)
            module.sources.append(rel)
            scan.saw(rel, f"PYBIND11_MODULE({name}) = {module.name} ({module.backend}): {fns}")
    libraries = []
    for ext in exts:
        if full(ext) in scan.modules or not ext.sources:
            continue
        ops = sorted({op for s in ext.sources for op in scan.registers.get(s, ())})
        if ops:
            libraries.append((ext, ops))
    if len(libraries) > 1:  # one library per backend: each is loaded and checked on its own
        for ext, ops in libraries:
            scan.modules[full(ext)] = ScannedModule(
                name=full(ext), backend=ext.backend, load="library", where=ext.where,
                functions={op.split("::", 1)[1]: None for op in ops}, sources=list(ext.sources))
            scan.saw(ext.where.split(":")[0], f"library {full(ext)} ({ext.backend}, loaded with "
                                              f"torch.ops.load_library): {', '.join(ops)}")
    order = {b: i for i, (b, _) in enumerate(reversed(BACKEND_SUFFIXES))}
    scan.modules = dict(sorted(scan.modules.items(),
                               key=lambda item: (order.get(item[1].backend, 9), item[0])))


def scan_extension(root: Path) -> Scan:
    scan = Scan(root=root.resolve())
    scan_build_config(scan)
    files = list(_files(scan.root))
    cxx = [p for p in files if p.suffix in CXX_SUFFIXES]
    for path in cxx:  # every C++ function first: a registration may name one from another file
        _index_functions(scan, _strip_comments(_source(path)))
    for path in files:
        suffix = path.suffix
        if suffix in (*CXX_SUFFIXES, ".metal", ".py"):
            scan.sources[suffix] = scan.sources.get(suffix, 0) + 1
        if suffix in CXX_SUFFIXES:
            scan_cxx(scan, path)
        elif suffix == ".py" and path.name not in ("setup.py", "noxfile.py"):
            scan_python(scan, path)
        elif path.name == "CMakeLists.txt":
            scan_cmake(scan, path)
    resolve_modules(scan)
    for ops in scan.namespaces.values():  # schemas and kernels may sit in different files
        for op in ops.values():
            if op.pending_impl and not op.hints:
                op.hints = kernel_hints(scan, op.schema, op.pending_impl)
    for path in (scan.root / "setup.py", scan.root / "CMakeLists.txt", scan.root / "pyproject.toml"):
        if path.is_file():  # 0x020a000000000000: torch 2.10
            m = re.search(r"TORCH_TARGET_VERSION\W+0x([0-9a-fA-F]{2})([0-9a-fA-F]{2})",
                          _source(path))
            if m:
                scan.torch_floor = f"{int(m.group(1), 16)}.{int(m.group(2), 16)}"
    return scan
