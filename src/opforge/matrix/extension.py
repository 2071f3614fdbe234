"""matrix.yaml's ``extension:`` section -> ``Extension``: the package, its namespace, its ops
(``keys``/``add``/``remove``/``no_kernel``...), its compiled modules and its ABI fields, with
file:line:key errors. ``abi_fields`` and ``key_list`` serve the variants too (``parser``)."""

from __future__ import annotations

import re

import yaml
from packaging.version import InvalidVersion, Version

from opforge import fields as field_checks
from opforge.dispatch_keys import DEVICE_TYPE_KEY, DISPATCH_KEYS, NO_KERNEL_DEVICES
from opforge.matrix.model import (
    COMPAT_WORDS,
    MODULE_BACKENDS,
    MODULE_LOADS,
    Extension,
    Module,
    Op,
)
from opforge.matrix.nodes import Reader, kind


def extension_section(r: Reader, node: yaml.Node) -> Extension:
    m = r.mapping(node, "extension", {"path": True, "package": True, "distribution": False,
                                      "namespace": True, "ops": False, "internal_ops": False,
                                      "recipes": False, "max_slowdown": False,
                                      "abi": False, "torch_floor": False,
                                      "compat_torch": False, "modules": False})
    package = r.scalar(m["package"], "extension.package")
    r.check(m["package"], "extension.package", field_checks.identifier(package, "an import name"))
    namespace = r.scalar(m["namespace"], "extension.namespace")
    r.check(m["namespace"], "extension.namespace",
            field_checks.identifier(namespace, "a torch.ops namespace"))
    if "ops" not in m and "modules" not in m:
        raise r.fail(node, "extension.ops", "required key missing from extension (a package "
                     "with no dispatcher ops lists its compiled modules under extension.modules)")
    specs = _ops(r, m["ops"], "extension.ops") if "ops" in m else []
    modules = _modules(r, m["modules"]) if "modules" in m else ()
    if "internal_ops" in m:  # the older spelling of `backward: true`
        for i, (op, item) in enumerate(r.str_list(m["internal_ops"], "extension.internal_ops")):
            r.check(item, f"extension.internal_ops[{i}]",
                    field_checks.identifier(op, "an operator name"))
            if any(s.name == op for s in specs):
                raise r.fail(item, f"extension.internal_ops[{i}]", f"{op!r} is also in ops")
            specs.append(Op(name=op, backward=True))
    distribution = (r.scalar(m["distribution"], "extension.distribution")
                    if "distribution" in m else package.replace("_", "-"))
    r.check(m.get("distribution"), "extension.distribution",
            field_checks.distribution(distribution))
    path = r.scalar(m["path"], "extension.path")
    r.check(m["path"], "extension.path", field_checks.repository_path(path))
    recipes = r.scalar(m["recipes"], "extension.recipes") if "recipes" in m else None
    if recipes is not None:
        r.check(m["recipes"], "extension.recipes", field_checks.repository_path(recipes))
    if recipes is not None and not recipes.endswith(".py"):
        raise r.fail(m["recipes"], "extension.recipes",
                     f"{recipes!r}: the recipes file is a Python file (.py)")
    max_slowdown = _factor(r, m["max_slowdown"], "extension.max_slowdown") \
        if "max_slowdown" in m else 10.0
    abi, floor, compat = abi_fields(r, m, "extension", Extension.abi, None, ())
    return Extension(path=path, package=package,
                     distribution=distribution, namespace=namespace, op_specs=tuple(specs),
                     recipes=recipes, max_slowdown=max_slowdown, abi=abi, torch_floor=floor,
                     compat_torch=compat, modules=modules)


_MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*\Z")


def _modules(r: Reader, node: yaml.Node) -> tuple[Module, ...]:
    """``{mypkg._ext_cuda: {backend: cuda, functions: [nms]}}``."""
    if not isinstance(node, yaml.MappingNode) or not node.value:
        raise r.fail(node, "extension.modules", "expected a mapping of module import names to "
                     "{backend, load, functions}, e.g. `mypkg._ext_cuda: {backend: cuda, "
                     "functions: [nms]}`")
    fields = r.mapping(node, "extension.modules", {
        (k.value if isinstance(k, yaml.ScalarNode) else ""): False for k, _ in node.value})
    out = []
    for name, value in fields.items():
        key = f"extension.modules.{name}"
        if not _MODULE_NAME.match(name):
            raise r.fail(value, key, f"{name!r} is not a dotted import name (mypkg._ext)")
        m = r.mapping(value, key, {"backend": False, "load": False, "functions": False})
        backend = r.scalar(m["backend"], f"{key}.backend") if "backend" in m else "cpu"
        if backend not in MODULE_BACKENDS:
            raise r.fail(m["backend"], f"{key}.backend",
                         f"{backend!r} is not one of {', '.join(MODULE_BACKENDS)}")
        load = r.scalar(m["load"], f"{key}.load") if "load" in m else "import"
        if load not in MODULE_LOADS:
            raise r.fail(m["load"], f"{key}.load", f"{load!r} is not one of "
                         f"{', '.join(MODULE_LOADS)} (import: a Python module; library: loaded "
                         "with torch.ops.load_library)")
        functions = []
        if "functions" in m:
            for i, (fn, item) in enumerate(r.str_list(m["functions"], f"{key}.functions")):
                r.check(item, f"{key}.functions[{i}]", field_checks.identifier(fn, "a name"))
                functions.append(fn)
        out.append(Module(name=name, backend=backend, load=load, functions=tuple(functions)))
    return tuple(out)


ABIS = ("legacy", "stable")
DEFAULT_COMPAT = ("floor", "matrix", "latest")
# the LibTorch stable ABI (the C shim with TORCH_TARGET_VERSION) starts with torch 2.9
STABLE_ABI_SINCE = Version("2.9")


def abi_fields(r: Reader, m: dict[str, yaml.Node], key: str, abi: str, floor: str | None,
                compat: tuple[str, ...]) -> tuple[str, str | None, tuple[str, ...]]:
    """``abi`` / ``torch_floor`` / ``compat_torch`` of a mapping, defaulting to the given
    values (the extension block's, for a variant)."""
    if "abi" in m:
        abi = r.scalar(m["abi"], f"{key}.abi")
        if abi not in ABIS:
            raise r.fail(m["abi"], f"{key}.abi", f"{abi!r} is not one of {', '.join(ABIS)}")
    if "torch_floor" in m:
        floor = r.scalar(m["torch_floor"], f"{key}.torch_floor")
        try:
            parsed = Version(floor)
        except InvalidVersion:
            raise r.fail(m["torch_floor"], f"{key}.torch_floor",
                         f"{floor!r} is not a torch release like \"2.10\"") from None
        if parsed.is_prerelease or parsed.is_devrelease or parsed.is_postrelease \
                or parsed.local or parsed.epoch or len(parsed.release) > 3:
            raise r.fail(m["torch_floor"], f"{key}.torch_floor",
                         f"{floor!r}: the floor is a torch release like \"2.10\" (no "
                         "pre-release, nightly or local part)")
        if parsed < STABLE_ABI_SINCE:
            raise r.fail(m["torch_floor"], f"{key}.torch_floor",
                         f"{floor!r}: the LibTorch stable ABI starts with torch "
                         f"{STABLE_ABI_SINCE}; a floor below it cannot be built")
    if "compat_torch" in m:
        entries = []
        for i, (entry, node) in enumerate(r.str_list(m["compat_torch"], f"{key}.compat_torch")):
            if entry not in COMPAT_WORDS:
                _compat_version(r, node, f"{key}.compat_torch[{i}]", entry)
            entries.append(entry)
        compat = tuple(entries)
    if abi == "stable":
        if floor is None:
            raise r.fail(m.get("abi") or next(iter(m.values()), None), f"{key}.torch_floor",
                         "abi: stable needs torch_floor, the oldest torch release the wheel "
                         "loads on (e.g. torch_floor: \"2.10\")")
        low = [e for e in compat if e not in COMPAT_WORDS and Version(e) < Version(floor)]
        if low:
            raise r.fail(m.get("compat_torch") or m.get("torch_floor"), f"{key}.compat_torch",
                         f"torch {low[0]} is below torch_floor {floor}: the wheel does not "
                         "claim to load there")
        compat = compat or DEFAULT_COMPAT
        return abi, floor, compat
    for name in ("torch_floor", "compat_torch"):
        if name in m:
            raise r.fail(m[name], f"{key}.{name}",
                         f"{name} applies to abi: stable (this is abi: {abi})")
    return abi, None, ()


def _compat_version(r: Reader, node: yaml.Node, key: str, entry: str) -> None:
    try:
        parsed = Version(entry)
    except InvalidVersion:
        raise r.fail(node, key, f"{entry!r} is not a torch release (\"2.13.0\") nor one of "
                                f"{', '.join(COMPAT_WORDS)}") from None
    if parsed.local or parsed.is_devrelease or len(parsed.release) != 3:
        raise r.fail(node, key, f"{entry!r}: list a full release like \"2.13.0\" "
                                "(no local part; nightlies: the word nightly)")


def _factor(r: Reader, node: yaml.Node, key: str) -> float:
    """A slowdown factor: a number greater than 1 (``10`` = ten times the CPU's time)."""
    value = r.scalar(node, key, float)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 1 < value < float("inf"):
        raise r.fail(node, key, f"{value!r}: a factor is a finite number greater than 1 "
                                "(10 = ten times the CPU's time)")
    return float(value)


_OP_FIELDS = {"keys": False, "add": False, "remove": False, "backward": False,
              "max_slowdown": False, "no_kernel": False}


def _ops(r: Reader, node: yaml.Node, key: str) -> list[Op]:
    """``[nms, roi_align, {my_op: {remove: [Autograd]}}]``: a name, or a name with its fields."""
    if not isinstance(node, yaml.SequenceNode):
        raise r.fail(node, key, f"expected a list, got {kind(node)}")
    if not node.value:
        raise r.fail(node, key, "must not be empty")
    ops: list[Op] = []
    for i, item in enumerate(node.value):
        where = f"{key}[{i}]"
        fields: dict[str, yaml.Node] = {}
        if isinstance(item, yaml.MappingNode):
            if len(item.value) != 1:
                raise r.fail(item, where, "an op with fields is one mapping: "
                                          "`- my_op: {remove: [Autograd]}`")
            name_node, value = item.value[0]
            name = r.scalar(name_node, where)
            where = f"{key}.{name}"
            fields = r.mapping(value, where, _OP_FIELDS)
        else:
            name_node = item
            name = r.scalar(item, where)
        r.check(name_node, where, field_checks.identifier(name, "an operator name"))
        if any(op.name == name for op in ops):
            raise r.fail(name_node, where, f"{name!r} is listed twice")
        lists = {f: tuple(key_list(r, fields[f], f"{where}.{f}")) for f in ("keys", "add", "remove")
                 if f in fields}
        backward = r.scalar(fields["backward"], f"{where}.backward", bool) \
            if "backward" in fields else False
        factor = _factor(r, fields["max_slowdown"], f"{where}.max_slowdown") \
            if "max_slowdown" in fields else None
        no_kernel = tuple(_devices(r, fields["no_kernel"], f"{where}.no_kernel")) \
            if "no_kernel" in fields else ()
        ops.append(Op(name=name, backward=backward, max_slowdown=factor, no_kernel=no_kernel,
                      **lists))
    return ops


def _devices(r: Reader, node: yaml.Node, key: str) -> list[str]:
    """``no_kernel: [cpu]``: devices (not dispatch keys) the op has no kernel for by design."""
    devices = []
    for j, (d, dnode) in enumerate(r.str_list(node, key)):
        if d not in NO_KERNEL_DEVICES:
            word = next((dev for dev, k in NO_KERNEL_DEVICES.items()
                         if d.lower() in (dev, k.lower())), None)
            hint = f" (did you mean {word}?)" if word else ""
            raise r.fail(dnode, f"{key}[{j}]", f"{d!r} is not a device{hint}: no_kernel names "
                                              f"devices, one of {', '.join(NO_KERNEL_DEVICES)}")
        devices.append(d)
    return devices


def key_list(r: Reader, node: yaml.Node, key: str) -> list[str]:
    """Dispatch key names (c10::DispatchKey: CPU, AutocastCUDA); a torch device type is read
    as its key, the way torch.library reads it (``hpu`` is HPU, ``privateuseone``
    PrivateUse1), so the matrix keeps the key names."""
    keys: list[str] = []
    for j, (k, knode) in enumerate(r.str_list(node, key)):
        if k in DEVICE_TYPE_KEY:
            spelled, k = k, DEVICE_TYPE_KEY[k]
            if k not in DISPATCH_KEYS:
                raise r.fail(knode, f"{key}[{j}]", f"device type {spelled!r} registers under "
                             f"{k}, a key torch's Python API does not list "
                             "(torch._C.DispatchKey), so no smoke census can check it")
            if k in keys:
                raise r.fail(knode, f"{key}[{j}]", f"{spelled!r} is {k}, listed twice")
        elif k not in DISPATCH_KEYS:
            close = sorted(d for d in DISPATCH_KEYS if d.lower() == k.lower()
                           or d.lower().startswith(k.lower()[:4]))[:6]
            hint = f" (did you mean {', '.join(close)}?)" if close else \
                " (a c10::DispatchKey name, e.g. CPU, CUDA, Meta, Autograd, AutocastCUDA)"
            if re.fullmatch(r"[a-z_]+", k) and not close:
                hint = (" (nor a torch device type: a device renamed from PrivateUse1 with "
                        f"torch.utils.rename_privateuse1_backend({k!r}) registers under "
                        "PrivateUse1)")
            raise r.fail(knode, f"{key}[{j}]", f"unknown dispatch key {k!r}{hint}")
        elif k in keys:
            raise r.fail(knode, f"{key}[{j}]", f"{k!r} is listed twice")
        keys.append(k)
    return keys
