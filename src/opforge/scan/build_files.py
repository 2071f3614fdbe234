"""The build configuration: pyproject.toml, setup.py / setup.cfg and CMakeLists.txt (the
distribution, the package, the extension modules compiled), and which module each
``PYBIND11_MODULE`` or op library is."""

from __future__ import annotations

import ast
import re
import string
from pathlib import Path

from opforge import platforms
from opforge.errors import UsageError
from opforge.files import read_head
from opforge.platforms import toolchain
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

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

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
    if isinstance(node, ast.IfExp):  # ["a.cu"] if WITH_CUDA else []: what either build has
        body, orelse = _evaluate(node.body, env, root), _evaluate(node.orelse, env, root)
        if isinstance(body, list) and isinstance(orelse, list):
            return body + [x for x in orelse if x not in body]
        return body if body == orelse else None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _evaluate(node.left, env, root), _evaluate(node.right, env, root)
        if isinstance(left, list) and isinstance(right, list):
            return left + right
        if isinstance(left, str) and isinstance(right, str):
            return left + right
        return None
    if isinstance(node, ast.JoinedStr):  # f"{library_name}._C": every field a known text
        parts = [v.value if isinstance(v, ast.Constant) else
                 _evaluate(v.value, env, root) if v.conversion == -1 and v.format_spec is None
                 else None for v in node.values]
        return "".join(parts) if all(isinstance(x, str) for x in parts) else None
    if isinstance(node, ast.Call):
        func = ast.unparse(node.func)
        args = [_evaluate(a, env, root) for a in node.args]
        if any(not isinstance(a, str) for a in args):
            return None
        if isinstance(node.func, ast.Attribute) and node.func.attr == "format" and \
                isinstance(node.func.value, ast.Constant) and \
                isinstance(node.func.value.value, str) and not node.keywords:
            return _format(node.func.value.value, args)
        if func in ("os.path.join", "osp.join", "path.join", "join"):
            return "/".join(args)
        if func in ("glob.glob", "glob") and len(args) == 1:
            return sorted(p.relative_to(root).as_posix() for p in root.glob(args[0]))
    return None


def _format(template: str, args: list[str]) -> str | None:
    """``"{}/src/*.cpp".format(root)``: positional fields only ({} or {0}), no attribute,
    index, conversion or format spec; None otherwise."""
    try:
        fields = list(string.Formatter().parse(template))
        if any(f is not None and (f not in ("",) and not f.isdigit() or c or spec)
               for _, f, spec, c in fields):
            return None
        return template.format(*args)
    except (ValueError, IndexError):
        return None


def _env_read(node: ast.AST) -> tuple[str, object] | None:
    """(variable, its value while unset) for ``os.environ.get("X"[, d])``, ``os.getenv("X"[, d])``,
    ``environ.get``; None for anything else."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    func = ast.unparse(node.func)
    if func not in ("os.environ.get", "environ.get", "os.getenv", "getenv"):
        return None
    name = node.args[0]
    if not isinstance(name, ast.Constant) or not isinstance(name.value, str):
        return None
    default = node.args[1] if len(node.args) > 1 else None
    if default is not None and not isinstance(default, ast.Constant):
        return None
    return name.value, default.value if default is not None else None


_UNKNOWN = object()
_COMPARE = {ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b,
            ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b,
            ast.Is: lambda a, b: a is b, ast.IsNot: lambda a, b: a is not b}


def _unset_value(node: ast.AST, names: set[str]):
    """A condition's value with every variable of the package's own unset (``names``
    collects those it reads); _UNKNOWN where it reads anything else (torch, a file, a
    variable opforge sets)."""
    read = _env_read(node)
    if read is not None:
        if read[0] in _managed_variables():
            return _UNKNOWN
        names.add(read[0])
        return read[1]
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, (ast.Tuple, ast.List)):
        items = [_unset_value(e, names) for e in node.elts]
        return _UNKNOWN if _UNKNOWN in items else tuple(items)
    if isinstance(node, ast.Compare) and "environ" in ast.unparse(node) and \
            len(node.ops) == 1 and isinstance(node.ops[0], (ast.In, ast.NotIn)) and \
            isinstance(node.left, ast.Constant) and ast.unparse(node.comparators[0]) in \
            ("os.environ", "environ"):
        if node.left.value in _managed_variables():
            return _UNKNOWN
        names.add(str(node.left.value))
        return isinstance(node.ops[0], ast.NotIn)
    if isinstance(node, ast.Call) and ast.unparse(node.func) in ("bool", "int") and \
            len(node.args) == 1:
        value = _unset_value(node.args[0], names)
        try:
            return _UNKNOWN if value is _UNKNOWN else (bool if ast.unparse(node.func) == "bool"
                                                       else int)(value)
        except (TypeError, ValueError):
            return _UNKNOWN
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
            node.func.attr in ("lower", "upper", "strip") and not node.args:
        value = _unset_value(node.func.value, names)
        return getattr(value, node.func.attr)() if isinstance(value, str) else _UNKNOWN
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        value = _unset_value(node.operand, names)
        return _UNKNOWN if value is _UNKNOWN else not value
    if isinstance(node, ast.BoolOp):
        values = [_unset_value(v, names) for v in node.values]
        if _UNKNOWN in values:
            return _UNKNOWN
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _COMPARE:
        left = _unset_value(node.left, names)
        right = _unset_value(node.comparators[0], names)
        if _UNKNOWN in (left, right):
            return _UNKNOWN
        try:
            return _COMPARE[type(node.ops[0])](left, right)
        except TypeError:
            return _UNKNOWN
    return _UNKNOWN


def _managed_variables() -> frozenset[str]:
    """The variables opforge itself sets or takes away in a build (a gate on them is the
    variant's business: FORCE_CUDA decides a CUDA module, not an opt-in)."""
    names = {"MAX_JOBS", "DIST_EXTRA_CONFIG", "SKBUILD_BUILD_DIR"}
    for backend in platforms.names():
        b = platforms.get(backend)
        names.update(b.variables, b.toolkit_variables)

    names.update(toolchain.CUDA_VARIABLES)
    return frozenset(n for n in names) | {n for n in names if n.startswith("OPFORGE_")}


def _opt_in_gate(tree: ast.Module, call: ast.Call) -> str | None:
    """How a setup.py extension call is built only on request: it sits in a branch that is
    not taken, or after an early return that is, while the package's own variables are unset
    ('TLA_BUILD_LEGACY_CUDA'); None when it is built by default or cannot be told."""
    parents: dict[ast.AST, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[child] = node
    node: ast.AST = call
    while node in parents:
        parent = parents[node]
        if isinstance(parent, (ast.If, ast.IfExp)) and node is not parent.test:
            names: set[str] = set()
            value = _unset_value(parent.test, names)
            in_body = node in (parent.body if isinstance(parent, ast.If) else [parent.body])
            if value is not _UNKNOWN and names and bool(value) != in_body:
                return ", ".join(sorted(names))
        if isinstance(parent, (ast.FunctionDef, ast.Module)):
            body = parent.body
            stop = body.index(node) if node in body else len(body)
            for stmt in body[:stop]:
                if isinstance(stmt, ast.If) and any(isinstance(s, ast.Return) for s in stmt.body):
                    names = set()
                    if _unset_value(stmt.test, names) is True and names:
                        return ", ".join(sorted(names))
        node = parent
    return None


def _extension_aliases(tree: ast.Module) -> dict[str, str]:
    """The names setup.py calls to make an extension module -> what they are:
    CppExtension itself, and ``Ext = CUDAExtension if WITH_CUDA else CppExtension`` (picked
    at build time: "CUDAExtension|CppExtension")."""
    kinds = {name: name for name in _EXTENSION_CALLS}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)):
            continue
        value = node.value
        options = [value.body, value.orelse] if isinstance(value, ast.IfExp) else [value]
        names = [call_name(o) if isinstance(o, (ast.Name, ast.Attribute)) else None
                 for o in options]
        if names and all(n in _EXTENSION_CALLS for n in names):
            kinds[node.targets[0].id] = "|".join(dict.fromkeys(names))
    return kinds


def _enclosing_functions(tree: ast.Module) -> dict[ast.AST, ast.FunctionDef]:
    """Each node inside a function of setup.py -> the innermost function it is in."""
    scopes: dict[ast.AST, ast.FunctionDef] = {}
    for func in ast.walk(tree):
        if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for inner in ast.walk(func):
                if inner is not func:
                    scopes[inner] = func  # a nested function's own walk comes later: it wins
    return scopes


def _local_env(func: ast.FunctionDef | None, call: ast.Call, module_env: dict, root: Path) -> dict:
    """The names a call inside a function sees: the module's, then the function's own plain
    assignments above the call, in order (``root = "cpu"; srcs = glob.glob(root + "/*.cpp")``).
    A name last assigned anything not evaluable is unknown there."""
    if func is None:
        return module_env
    env = dict(module_env)
    for node in sorted((n for n in ast.walk(func) if isinstance(n, (ast.Assign, ast.AugAssign,
                                                                     ast.AnnAssign))),
                       key=lambda n: (n.lineno, n.col_offset)):
        if node.lineno >= call.lineno:
            break
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        names = [t.id for t in targets if isinstance(t, ast.Name)]
        value = _evaluate(node.value, env, root) if isinstance(node, ast.Assign) and \
            len(names) == len(targets) == 1 else None
        for name in names:
            env.pop(name, None)
            if value is not None:
                env[name] = value
    return env


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
    kinds = _extension_aliases(tree)
    scopes = _enclosing_functions(tree)
    module_env = env
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or call_name(node.func) not in kinds:
            continue
        env = _local_env(scopes.get(node), node, module_env, scan.root)
        kind = kinds[call_name(node.func)]
        kwargs = {k.arg: k.value for k in node.keywords}
        name_node = node.args[0] if node.args else kwargs.get("name")
        sources_node = node.args[1] if len(node.args) > 1 else kwargs.get("sources")
        name = _evaluate(name_node, env, scan.root) if name_node is not None else None
        sources = _evaluate(sources_node, env, scan.root) if sources_node is not None else None
        if not isinstance(name, str):
            shown = ast.unparse(name_node)[:80] if name_node is not None else "no name"
            scan.by_hand.append(f"setup.py:{node.lineno}: {kind}({shown}, ...) "
                                "names its module at build time (an f-string, a loop): list the "
                                "modules it builds under extension.modules in matrix.yaml by hand")
            continue
        if isinstance(sources, str):
            sources = [sources]
        sources = [str(Path(s).as_posix()).removeprefix("./") for s in sources] \
            if isinstance(sources, list) else None
        gate = _opt_in_gate(tree, node)
        scan.extensions.append(BuiltExtension(name=name, sources=sources, kind=kind,
                                              where=f"setup.py:{node.lineno}", opt_in=gate))
        scan.saw("setup.py", f"{kind}({name!r}"
                             + (f", {len(sources)} source(s))" if sources is not None
                                else ", sources computed at build time)")
                             + (f", only when {gate} is set" if gate else ""))
        if gate:
            scan.notes.append(
                f"setup.py:{node.lineno}: {name} is built only when {gate} is set (an opt-in "
                "of the package's own, which no variant sets): not promised; to build and check "
                f"it, give a variant build_env {{{gate.split(', ')[0]}: ...}} and list the module "
                "under extension.modules")


def _setup_name(text: str, root: Path) -> str | None:
    """The ``name=`` of setup.py's ``setup(...)`` call (a literal, or a module-level name bound
    to one), not the first ``name=`` of the file: an ``Extension(name="pkg._C")`` above the
    ``setup`` call names a module, not the distribution."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    env: dict = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and \
                isinstance(node.targets[0], ast.Name):
            value = _evaluate(node.value, env, root)
            if value is not None:
                env[node.targets[0].id] = value
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and call_name(node.func) in ("setup", "setuptools.setup"):
            for keyword in node.keywords:
                if keyword.arg == "name":
                    value = _evaluate(keyword.value, env, root)
                    if isinstance(value, str) and re.fullmatch(r"[A-Za-z0-9._-]+", value):
                        return value
    return None


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
            if name == "setup.py":
                scan.distribution = _setup_name(text, root)
                continue
            m = re.search(r"^name\s*=\s*([A-Za-z0-9._-]+)\s*$", text, re.M)
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
        if owners and all(e.opt_in for e in owners):
            scan.saw(rel, f"PYBIND11_MODULE({name}) = {full(owners[0])} (built only when "
                          f"{owners[0].opt_in} is set; not promised): {fns}")
            continue
        owners = [e for e in owners if not e.opt_in]
        # one name built by a CUDAExtension or a CppExtension (picked at build time): a module
        # every build has
        backend = "cpu" if any(e.backend == "cpu" for e in owners) else owners[0].backend
        for ext in owners:
            module = scan.modules.setdefault(full(ext), ScannedModule(
                name=full(ext), backend=backend, where=ext.where))
            module.functions.update(functions)
            module.hints.update(hints)
            module.sources.append(rel)
            scan.saw(rel, f"PYBIND11_MODULE({name}) = {module.name} ({module.backend}): {fns}")
    libraries = []
    for ext in exts:
        if full(ext) in scan.modules or not ext.sources or ext.opt_in:
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
