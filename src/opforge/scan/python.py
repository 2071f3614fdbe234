"""Python registrations: ``torch.library`` calls and decorators (``custom_op``, ``define``,
``Library`` + ``lib.impl``, ``register_fake`` / ``register_autograd`` / ``register_kernel`` ...)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from opforge.dispatch_keys import DISPATCH_KEYS, NO_KERNEL_DEVICES, kernel_key, renamed_backend
from opforge.scan.model import ALIAS_KEYS, NOT_PACKAGES, Kernel, Scan, ScannedOp
from opforge.scan.no_kernel import python_raises
from opforge.scan.text import read_source, schema_name

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
        tree = ast.parse(read_source(path))
    except SyntaxError:
        scan.notes.append(f"{path.relative_to(scan.root)}: not valid Python, skipped")
        return
    rel = path.relative_to(scan.root).as_posix()
    libraries, decorated = _libraries_and_decorators(scan, tree, rel)
    seen: dict[str, list[str]] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or call_name(node.func) not in _PY_CALLS:
            continue
        kind = call_name(node.func)
        args = [a.value if isinstance(a, ast.Constant) else None for a in node.args]
        kwargs = {k.arg: k.value for k in node.keywords}
        first = args[0] if args else _constant(kwargs.get("qualname") or kwargs.get("name"))
        owner = node.func.value.id if isinstance(node.func, ast.Attribute) and \
            isinstance(node.func.value, ast.Name) else None
        torch_call = owner in libraries or owner in ("library", "torch") or \
            ast.unparse(node.func).startswith("torch.library.")
        if not isinstance(first, str):
            if torch_call and kind in ("define", "custom_op", "register_kernel") and \
                    node.args and not set(Path(rel).parts[:-1]) & NOT_PACKAGES:
                scan.by_hand.append(f"{rel}:{node.lineno}: {ast.unparse(node.func)}(...) names "
                                    "its op at run time: list the op under extension.ops in "
                                    "matrix.yaml by hand")
            continue
        if owner in libraries and "::" not in first:
            first = f"{libraries[owner]}::{first}"
        ns, name = schema_name(first)
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
            _custom_op(scan, op, name, node, kwargs, decorated, tree, rel)
        elif kind in ("register_fake", "impl_abstract"):
            op.keys.add("Meta")
        elif kind == "register_autograd":
            op.keys.add("Autograd")
        elif kind in ("register_kernel", "register_autocast", "impl"):
            _registration(scan, op, kind, node, args, kwargs, owner, libraries, decorated,
                          tree, rel)
    for kind, names in seen.items():
        scan.saw(rel, f"{kind}: {', '.join(dict.fromkeys(names))}")


def _libraries_and_decorators(scan: Scan, tree: ast.AST, rel: str) -> tuple[dict[str, str],
                                                                    dict[int, ast.FunctionDef]]:
    """The file's torch.library.Library variables (-> their namespace) and each decorator
    call's function; a load_library call is noted."""
    libraries: dict[str, str] = {}  # variable -> namespace of torch.library.Library(ns, kind)
    decorated: dict[int, ast.FunctionDef] = {}  # id(decorator call) -> the function
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and \
                call_name(node.value.func) == "Library" and node.value.args and \
                isinstance(node.value.args[0], ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    libraries[target.id] = str(node.value.args[0].value)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for deco in node.decorator_list:
                decorated[id(deco)] = node
        if isinstance(node, ast.Call) and call_name(node.func) == "load_library":
            scan.saw(rel, "torch.ops.load_library (libraries the package loads)")
    return libraries, decorated


def _custom_op(scan: Scan, op: ScannedOp, name: str, node: ast.Call, kwargs: dict,
               decorated: dict[int, ast.FunctionDef], tree: ast.AST, rel: str) -> None:
    """``@torch.library.custom_op`` / ``triton_op``: its keys, mutation, schema and kernels."""
    devices = _device_types(kwargs.get("device_types"))
    op.keys.update({"Meta", "Autograd"})
    keys = _register(scan, op, f"{rel}:{node.lineno}", devices or
                     ["CompositeExplicitAutograd"])
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
    _kernels(op, keys, f"{rel}:{node.lineno}", func, rel)


def _registration(scan: Scan, op: ScannedOp, kind: str, node: ast.Call, args: list,
                  kwargs: dict, owner: str | None, libraries: dict[str, str],
                  decorated: dict[int, ast.FunctionDef], tree: ast.AST, rel: str) -> None:
    """``register_kernel`` / ``register_autocast`` / ``impl``: the keys it registers and its
    kernel."""
    # impl("ns::op", "cpu"), register_kernel("ns::op", ("cpu", "cuda"), fn),
    # lib.impl("op", fn, "CPU")
    device = next((a for a in args[1:] if isinstance(a, str)), None) or \
        next((_device_types(a) for a in node.args[1:]
              if isinstance(a, (ast.Tuple, ast.List))), None) or \
        _device_types(kwargs.get("device_types") or kwargs.get("dispatch_key")
                      or kwargs.get("types"))
    where = f"{rel}:{node.lineno}"
    read = "autocast" if kind == "register_autocast" else \
        "key" if owner in libraries else "any"
    keys = _register(scan, op, where, _as_list(device), read)
    if device is None and kind == "register_kernel":
        op.keys.update(ALIAS_KEYS["CompositeExplicitAutograd"])
        keys = ["CompositeExplicitAutograd"]
    if kind != "register_autocast":
        fn = decorated.get(id(node)) or _named_function(
            tree, (node.args[1:2] if owner in libraries else node.args[2:3])
            + [v for k, v in kwargs.items() if k in ("func", "fn")])
        _kernels(op, keys, where, fn, rel)


def _kernels(op: ScannedOp, keys: list[str], where: str, func: ast.FunctionDef | None,
             rel: str) -> None:
    """Remember the kernels one registration gives ``op`` and what each raises "no kernel"
    for (opforge.scan.no_kernel; None where the function is not known)."""
    for key in keys:
        device = next((d for d, k in NO_KERNEL_DEVICES.items() if k == key), None)
        composite = key in ("CompositeExplicitAutograd", "CompositeImplicitAutograd")
        op.kernels.append(Kernel(key=key, where=where, raises=python_raises(
            func, rel, None if composite else [device] if device else [])))


def _named_function(tree: ast.Module, refs: list[ast.expr]) -> ast.FunctionDef | None:
    """The function a registration passes by name, when the file defines it once."""
    ref = next((r for r in refs if isinstance(r, ast.Name)), None)
    if ref is None:
        return None
    found = [f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name == ref.id]
    return found[0] if len(found) == 1 else None


def _register(scan: Scan, op: ScannedOp, where: str, names: list[str],
              read: str = "any") -> list[str]:
    """Kernels of ``op`` registered for ``names``, each read as torch reads it
    (opforge.dispatch_keys.kernel_key); ``read``: "key" for ``Library.impl`` (a dispatch key
    only), "autocast" for ``register_autocast`` (a device type, whose Autocast key it takes).
    A name torch refuses is a note, never an error: the package's import would say it.
    Returns the keys registered."""
    keys: list[str] = []
    for name in names:
        key, how = kernel_key(name)
        if key is not None and read == "key" and how not in ("key", "renamed key"):
            key, how = None, f"Library.impl takes a dispatch key, not {name!r} (did you mean " \
                             f"{key!r}?)"
        if key is not None and read == "autocast":
            if how not in ("device", "renamed") or f"Autocast{key}" not in DISPATCH_KEYS:
                key, how = None, f"{name!r} is not a device type torch has autocast for"
            else:
                key = f"Autocast{key}"
        if key is None:
            scan.notes.append(f"{where}: {how}, so torch.library refuses it (no key counted)")
            continue
        if how.startswith("renamed") and renamed_backend(name) not in scan.renamed_backends:
            device = renamed_backend(name)
            scan.renamed_backends.add(device)
            scan.notes.append(f"{where}: {name!r} is not one of torch's device types nor "
                              "dispatch keys: read as the PrivateUse1 backend renamed "
                              f"{device!r} (torch accepts it once torch.utils."
                              f"rename_privateuse1_backend({device!r}) ran), so its kernels "
                              f"are {key}'s")
        op.register(key)
        keys.append(key)
    return keys


def call_name(func: ast.expr) -> str | None:
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
