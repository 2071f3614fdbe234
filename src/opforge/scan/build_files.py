"""The build configuration: pyproject.toml, setup.py / setup.cfg and CMakeLists.txt (the
distribution, the package, the extension modules compiled), and which module each
``PYBIND11_MODULE`` or op library is."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from opforge.errors import UsageError
from opforge.files import read_head
from opforge.scan.model import (
    BACKEND_SUFFIXES,
    CXX_SUFFIXES,
    NOT_PACKAGES,
    SKIP_DIRS,
    BuiltExtension,
    Scan,
    ScannedModule,
)
from opforge.scan.python import call_name
from opforge.scan.text import MAX_SOURCE_BYTES, line_of, read_source

_EXTENSION_CALLS = {"CppExtension", "CUDAExtension", "Extension", "Pybind11Extension",
                    "SyclExtension"}


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
        tree = ast.parse(read_source(path))
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
        if not isinstance(node, ast.Call) or call_name(node.func) not in _EXTENSION_CALLS:
            continue
        kwargs = {k.arg: k.value for k in node.keywords}
        name_node = node.args[0] if node.args else kwargs.get("name")
        sources_node = node.args[1] if len(node.args) > 1 else kwargs.get("sources")
        name = _evaluate(name_node, env, scan.root) if name_node is not None else None
        sources = _evaluate(sources_node, env, scan.root) if sources_node is not None else None
        if not isinstance(name, str):
            shown = ast.unparse(name_node)[:80] if name_node is not None else "no name"
            scan.by_hand.append(f"setup.py:{node.lineno}: {call_name(node.func)}({shown}, ...) "
                                "names its module at build time (an f-string, a loop): list the "
                                "modules it builds under extension.modules in matrix.yaml by hand")
            continue
        if isinstance(sources, str):
            sources = [sources]
        sources = [str(Path(s).as_posix()).removeprefix("./") for s in sources] \
            if isinstance(sources, list) else None
        scan.extensions.append(BuiltExtension(name=name, sources=sources,
                                              kind=call_name(node.func) or "",
                                              where=f"setup.py:{node.lineno}"))
        scan.saw("setup.py", f"{call_name(node.func)}({name!r}"
                             + (f", {len(sources)} source(s))" if sources is not None
                                else ", sources computed at build time)"))


def scan_cmake(scan: Scan, path: Path) -> None:
    """``pybind11_add_module(name src...)`` / ``Python_add_library(name MODULE src...)``."""
    text = re.sub(r"#[^\n]*", "", read_source(path))
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
                                              kind=m.group(1), where=f"{rel}:{line_of(text, m.start())}"))
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
            text = read_source(path)
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
                    and not set(p.relative_to(root).parts[:-1]) & (SKIP_DIRS | NOT_PACKAGES)]
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
