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
- The build configuration: ``[project] name`` in pyproject.toml, ``name=`` in setup.py or
  setup.cfg, the build backend, and the package directory.

Nothing is imported or executed: a name built at run time (an f-string, a variable) is not seen.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

SKIP_DIRS = {".git", ".nox", ".venv", "venv", "build", "dist", "node_modules", "__pycache__",
             ".tox", "third_party", "docs", ".github", ".eggs"}
CXX_SUFFIXES = (".cpp", ".cc", ".cxx", ".cu", ".mm", ".h", ".hpp", ".cuh")
DEVICE_KEY = {"cpu": "CPU", "cuda": "CUDA", "mps": "MPS", "xpu": "XPU", "meta": "Meta"}
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


@dataclass
class ScannedOp:
    name: str
    schema: str | None = None
    keys: set[str] = field(default_factory=set)
    mutating: bool = False
    where: str = ""

    @property
    def backward_only(self) -> bool:
        return "backward" in self.name.lower()


@dataclass
class Scan:
    root: Path
    distribution: str | None = None
    package: str | None = None
    build_backend: str | None = None
    namespaces: dict[str, dict[str, ScannedOp]] = field(default_factory=dict)
    sources: dict[str, int] = field(default_factory=dict)   # suffix -> count
    notes: list[str] = field(default_factory=list)

    def op(self, namespace: str, name: str, where: str) -> ScannedOp:
        ops = self.namespaces.setdefault(namespace, {})
        if name not in ops:
            ops[name] = ScannedOp(name=name, where=where)
        return ops[name]

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


def _blocks(text: str, pattern: re.Pattern):
    """(match, body) for each ``MACRO(...) { body }``, braces balanced."""
    for match in pattern.finditer(text):
        start = text.find("{", match.end())
        if start == -1:
            continue
        depth, i = 0, start
        while i < len(text):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    break
            i += 1
        yield match, text[start + 1:i]


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def _schema_name(schema: str) -> tuple[str | None, str]:
    """'ns::name.overload(Tensor x) -> Tensor' -> ('ns', 'name')."""
    head = schema.split("(", 1)[0].strip()
    ns, _, name = head.rpartition("::")
    return (ns or None), name.split(".", 1)[0]


def scan_cxx(scan: Scan, path: Path) -> None:
    text = _strip_comments(path.read_text(encoding="utf-8", errors="replace"))
    rel = str(path.relative_to(scan.root))
    for match, body in _blocks(text, _LIBRARY):
        namespace = match.group(1)
        scan.namespaces.setdefault(namespace, {})
        for d in re.finditer(r"\.def\s*\(\s*(?:TORCH_SELECTIVE_SCHEMA\s*\(\s*)?((?:" + _STRING
                             + r"\s*)+)", body):
            schema = "".join(re.findall(_STRING, d.group(1)))
            ns, name = _schema_name(schema)
            op = scan.op(ns or namespace, name, rel)
            op.schema = schema if "(" in schema else op.schema
            op.where = rel  # where the op is defined, rather than first seen
            op.mutating = op.mutating or "!)" in schema
            # m.def("schema", &fn): a catch-all kernel, used for every key
            rest = body[d.end():d.end() + 4]
            if rest.lstrip().startswith(","):
                op.keys.update(ALIAS_KEYS["CompositeImplicitAutograd"])
    for match, body in _blocks(text, _LIBRARY_IMPL):
        namespace, key = match.group(1), match.group(2)
        for i in re.finditer(r"\.impl\s*\(\s*(?:TORCH_SELECTIVE_NAME\s*\(\s*)?" + _STRING, body):
            ns, name = _schema_name(i.group(1))
            scan.op(ns or namespace, name, rel).keys.update(ALIAS_KEYS.get(key, (key,)))


_PY_CALLS = {"custom_op", "define", "register_fake", "impl_abstract", "register_autograd",
             "register_kernel", "register_autocast", "impl", "triton_op"}


def scan_python(scan: Scan, path: Path) -> None:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
    except SyntaxError:
        scan.notes.append(f"{path.relative_to(scan.root)}: not valid Python, skipped")
        return
    rel = str(path.relative_to(scan.root))
    libraries: dict[str, str] = {}  # variable -> namespace of torch.library.Library(ns, kind)
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and \
                _name(node.value.func) == "Library" and node.value.args and \
                isinstance(node.value.args[0], ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    libraries[target.id] = str(node.value.args[0].value)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or _name(node.func) not in _PY_CALLS:
            continue
        kind = _name(node.func)
        args = [a.value if isinstance(a, ast.Constant) else None for a in node.args]
        kwargs = {k.arg: k.value for k in node.keywords}
        first = args[0] if args else None
        if not isinstance(first, str):
            continue
        owner = node.func.value.id if isinstance(node.func, ast.Attribute) and \
            isinstance(node.func.value, ast.Name) else None
        if owner in libraries and "::" not in first:
            first = f"{libraries[owner]}::{first}"
        ns, name = _schema_name(first)
        if ns is None:
            continue
        op = scan.op(ns, name, rel)
        if kind in ("define", "custom_op", "triton_op"):
            op.where = rel
        if kind == "define":
            op.schema = first.split("::", 1)[1]
            op.mutating = op.mutating or "!)" in first
        elif kind in ("custom_op", "triton_op"):
            devices = _device_types(kwargs.get("device_types"))
            op.keys.update({"Meta", "Autograd"})
            op.keys.update([DEVICE_KEY.get(d, d.upper()) for d in devices]
                           if devices else ALIAS_KEYS["CompositeExplicitAutograd"])
            mutates = kwargs.get("mutates_args")
            op.mutating = op.mutating or (isinstance(mutates, (ast.Tuple, ast.List))
                                          and bool(mutates.elts)) or \
                (isinstance(mutates, ast.Constant) and mutates.value == "unknown")
        elif kind in ("register_fake", "impl_abstract"):
            op.keys.add("Meta")
        elif kind == "register_autograd":
            op.keys.add("Autograd")
        elif kind in ("register_kernel", "register_autocast", "impl"):
            # impl("ns::op", "cpu"), register_kernel("ns::op", "cpu", fn), lib.impl("op", fn, "CPU")
            device = next((a for a in args[1:] if isinstance(a, str)), None) or \
                _constant(kwargs.get("device_types") or kwargs.get("dispatch_key")
                          or kwargs.get("types"))
            for d in _as_list(device):
                if kind == "register_autocast":
                    op.keys.add("Autocast" + DEVICE_KEY.get(d, d.upper()))
                else:
                    key = DEVICE_KEY.get(d, d)
                    op.keys.update(ALIAS_KEYS.get(key, (key,)))


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
            data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            scan.notes.append(f"pyproject.toml: not valid TOML ({exc}), ignored")
            data = {}
        scan.distribution = data.get("project", {}).get("name")
        scan.build_backend = data.get("build-system", {}).get("build-backend")
    for name in ("setup.py", "setup.cfg"):
        path = root / name
        if scan.distribution is None and path.is_file():
            text = path.read_text(encoding="utf-8", errors="replace")
            m = re.search(r"""\bname\s*=\s*["']([A-Za-z0-9._-]+)["']""", text) if \
                name == "setup.py" else re.search(r"^name\s*=\s*([A-Za-z0-9._-]+)\s*$", text, re.M)
            if m:
                scan.distribution = m.group(1)
    declared = data.get("tool", {}).get("scikit-build", {}).get("wheel", {}).get("packages") \
        if pyproject.is_file() else None
    packages = [root / d for d in declared or [] if (root / d / "__init__.py").is_file()]
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


def scan_extension(root: Path) -> Scan:
    scan = Scan(root=root.resolve())
    scan_build_config(scan)
    for path in _files(scan.root):
        suffix = path.suffix
        if suffix in (*CXX_SUFFIXES, ".metal", ".py"):
            scan.sources[suffix] = scan.sources.get(suffix, 0) + 1
        if suffix in CXX_SUFFIXES:
            scan_cxx(scan, path)
        elif suffix == ".py" and path.name not in ("setup.py", "noxfile.py"):
            scan_python(scan, path)
    return scan
