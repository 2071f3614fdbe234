"""matrix.yaml -> ``Matrix``: parsed once, validated with file:line:key errors.

Working on composed YAML nodes (not loaded dicts) gives every error its line and catches
duplicate keys. A malformed file raises ``MatrixError`` (a UsageError: exit 2) whose message
is one line: ``matrix.yaml:12: variants[2].cuda: CUDA variant 'cu130' cannot target
macos-arm64``.
"""

from __future__ import annotations

import os
import re
from dataclasses import replace
from pathlib import Path

import yaml
from packaging.version import InvalidVersion, Version

from opforge import fields as field_checks
from opforge import platforms
from opforge.dispatch_keys import DEVICE_TYPE_KEY, DISPATCH_KEYS, NO_KERNEL_DEVICES, device_of
from opforge.errors import UsageError
from opforge.files import read_text
from opforge.matrix.model import (
    CHANNELS,
    COMPAT_WORDS,
    MODULE_BACKENDS,
    MODULE_LOADS,
    Extension,
    Matrix,
    MatrixError,
    Module,
    Op,
    Platform,
    TorchChannel,
    Variant,
)
from opforge.matrix.nodes import Reader, compose, kind
from opforge.platforms import cuda as cuda_backend
from opforge.platforms.base import Backend, VariantFields

DEFAULT_MATRIX = "matrix.yaml"
# Python versions PyTorch publishes wheels for in the releases this matrix format targets.
KNOWN_PYTHONS = ("3.10", "3.11", "3.12", "3.13", "3.13t", "3.14", "3.14t")
NVCC_ARCHS = cuda_backend.NVCC_ARCHS  # the CUDA backend's table (opforge.platforms.cuda)
# \Z, not $: "$" also matches before a final newline ("cpu\n" would pass)
_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")
_LOCAL_LABEL = re.compile(r"[a-z0-9]+(\.[a-z0-9]+)*\Z")

CHANNEL_ENV = "OPFORGE_TORCH_CHANNEL"
VERSION_ENV = "OPFORGE_TORCH_VERSION"


def load_matrix(path: str | Path | None = None, env: dict[str, str] | None = None) -> Matrix:
    """Read and validate a matrix file (default: ``find_matrix()``).

    ``OPFORGE_TORCH_CHANNEL`` / ``OPFORGE_TORCH_VERSION`` replace the file's torch channel and
    version (and every variant's own torch_version), so one workflow-level setting moves
    every session and job to, say, today's nightly without editing the file.
    """
    path = Path(path) if path is not None else find_matrix()
    try:
        text = read_text(path)
    except UsageError as exc:
        raise MatrixError(f"{exc}") from None
    matrix = parse_matrix(text, path)
    env = os.environ if env is None else env
    channel, version = env.get(CHANNEL_ENV), env.get(VERSION_ENV)
    if channel or version:
        matrix = with_torch(matrix, channel or matrix.torch.channel,
                            version or ("latest" if channel == "nightly" else matrix.torch.version))
    return matrix


def with_torch(matrix: Matrix, channel: str, version: str) -> Matrix:
    """The matrix with another torch channel/version (validated like the file's)."""
    if channel not in CHANNELS:
        raise UsageError(f"{CHANNEL_ENV}={channel!r} is not one of {', '.join(CHANNELS)}")
    node = yaml.ScalarNode("tag:yaml.org,2002:str", version)
    try:
        _check_torch_version(Reader(VERSION_ENV), node, VERSION_ENV, version, channel)
    except MatrixError as exc:
        raise UsageError(str(exc).split(": ", 2)[-1] + f" ({VERSION_ENV}={version!r})") from None
    torch = replace(matrix.torch, channel=channel, version=version)
    variants = tuple(replace(v, torch_version=None) for v in matrix.variants)
    return replace(matrix, torch=torch, variants=variants)


MATRIX_ENV = "OPFORGE_MATRIX"


def find_matrix(start: Path | None = None, env: dict[str, str] | None = None) -> Path:
    """The configuration: ``$OPFORGE_MATRIX``, else matrix.yaml in the working directory or
    the nearest directory above it. Never opforge's own repository's."""
    env = os.environ if env is None else env
    if env.get(MATRIX_ENV):
        path = Path(env[MATRIX_ENV])
        if not path.is_file():
            raise MatrixError(f"{path}:0: (file): no such file (from ${MATRIX_ENV}); "
                              "set it to your matrix.yaml or pass --file PATH")
        return path
    here = (start or Path.cwd()).resolve()
    for directory in (here, *here.parents):
        candidate = directory / DEFAULT_MATRIX
        if candidate.is_file():
            return candidate
    raise MatrixError(f"{DEFAULT_MATRIX}:0: (file): no {DEFAULT_MATRIX} in {here} or any "
                      f"directory above it; pass --file PATH, set ${MATRIX_ENV}, or run "
                      "`opforge init` to write one")


def parse_matrix(text: str, path: Path) -> Matrix:
    r = Reader(path.name)
    root = compose(text, path.name)
    if root is None:
        raise MatrixError(f"{path.name}:1: (top): the file is empty")
    top = r.mapping(root, "", {"extension": True, "torch": True, "pythons": True,
                               "pr_python": False, "platforms": True, "variants": True})
    extension = _extension(r, top["extension"])
    torch = _torch(r, top["torch"])
    pythons = []
    for i, (py, node) in enumerate(r.str_list(top["pythons"], "pythons")):
        if py not in KNOWN_PYTHONS:
            raise r.fail(node, f"pythons[{i}]", f"unknown Python version {py!r} "
                                                f"(known: {', '.join(KNOWN_PYTHONS)})")
        pythons.append(py)
    pr_python = pythons[0]
    if "pr_python" in top:
        pr_python = r.scalar(top["pr_python"], "pr_python")
        if pr_python not in pythons:
            raise r.fail(top["pr_python"], "pr_python", f"{pr_python!r} is not in pythons")
    platforms = _platforms(r, top["platforms"])
    variants = _variants(r, top["variants"], platforms, extension)
    for i, v in enumerate(variants):
        if v.stable and torch.channel != "nightly" and not v.torch_version and \
                Version(torch.version) < Version(v.torch_floor or "0"):
            raise r.fail(top["variants"].value[i], f"variants[{i}].torch_floor",
                         f"{v.torch_floor} is above torch.version {torch.version}, the torch "
                         f"variant {v.name!r} builds against")
    return Matrix(path=path, extension=extension, torch=torch, pythons=tuple(pythons),
                  pr_python=pr_python, platforms=platforms, variants=tuple(variants))


def _extension(r: Reader, node: yaml.Node) -> Extension:
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
    abi, floor, compat = _abi_fields(r, m, "extension", Extension.abi, None, ())
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


def _abi_fields(r: Reader, m: dict[str, yaml.Node], key: str, abi: str, floor: str | None,
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
        lists = {f: tuple(_keys(r, fields[f], f"{where}.{f}")) for f in ("keys", "add", "remove")
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


def _keys(r: Reader, node: yaml.Node, key: str) -> list[str]:
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


def _torch(r: Reader, node: yaml.Node) -> TorchChannel:
    m = r.mapping(node, "torch", {"channel": True, "version": True, "index": False})
    channel = r.scalar(m["channel"], "torch.channel")
    if channel not in CHANNELS:
        raise r.fail(m["channel"], "torch.channel", f"{channel!r} is not one of {', '.join(CHANNELS)}")
    version = r.scalar(m["version"], "torch.version")
    _check_torch_version(r, m["version"], "torch.version", version, channel)
    index = r.scalar(m["index"], "torch.index") if "index" in m \
        else "https://download.pytorch.org/whl"
    r.check(m.get("index"), "torch.index", field_checks.index_url(index))
    return TorchChannel(channel=channel, version=version, index=index)


def _check_torch_version(r: Reader, node: yaml.Node, key: str, version: str, channel: str):
    if channel == "nightly" and version == "latest":
        return
    try:
        parsed = Version(version)
    except InvalidVersion:
        raise r.fail(node, key, f"{version!r} is not a PEP 440 version") from None
    if parsed.local:
        raise r.fail(node, key, f"{version!r}: leave out the local part (+cpu); "
                                "the variant chooses it")
    if channel == "nightly" and not parsed.is_devrelease:
        raise r.fail(node, key, f"nightly channel needs 'latest' or a dev version "
                                f"like 2.14.0.dev20261201, got {version!r}")
    if channel != "nightly" and parsed.is_devrelease:
        raise r.fail(node, key, f"{version!r} is a nightly; set torch.channel: nightly")


def _platforms(r: Reader, node: yaml.Node) -> dict[str, Platform]:
    if not isinstance(node, yaml.MappingNode) or not node.value:
        raise r.fail(node, "platforms", "expected a non-empty mapping of platform names")
    names = {k.value: k for k, _ in node.value if isinstance(k, yaml.ScalarNode)}
    m = r.mapping(node, "platforms", {name: False for name in names})
    platforms = {}
    for name, value in m.items():
        key = f"platforms.{name}"
        if not re.match(r"(linux|macos|windows)-[a-z0-9_]+\Z", name):
            raise r.fail(names[name], key, "platform names are <os>-<arch>, os one of "
                                           "linux, macos, windows (e.g. linux-x86_64)")
        pm = r.mapping(value, key, {"runner": True, "container": False})
        runner = r.scalar(pm["runner"], f"{key}.runner")
        r.check(pm["runner"], f"{key}.runner", field_checks.runner_label(runner))
        container = None
        if "container" in pm:
            container = r.scalar(pm["container"], f"{key}.container")
            r.check(pm["container"], f"{key}.container", field_checks.image_reference(container))
        _check_platform_rules(r, key, pm, [(name, names[name])])
        platforms[name] = Platform(name=name, runner=runner, container=container)
    return platforms


_VARIANT_KEYS = {"name": True, "platforms": True, "expected_keys": True, "cuda": False,
                 "arch_list": False, "container": False, "torch_version": False,
                 "index_variant": False, "macos_deployment_target": False, "mps": False,
                 "device_checks": False, "runner": False, "abi": False, "torch_floor": False,
                 "compat_torch": False, "pypi": False, "build_env": False,
                 "backend": False, "toolkit": False}
# what opforge passes from the variant itself: a variant's build_env cannot name it
_OPFORGE_BUILD_VARIABLES = ("FORCE_CUDA", "FORCE_MPS", "TORCH_CUDA_ARCH_LIST",
                            "MACOSX_DEPLOYMENT_TARGET", "PYTHONPATH", "PATH",
                            "DIST_EXTRA_CONFIG", "SKBUILD_BUILD_DIR")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _build_env(r: Reader, node: yaml.Node, key: str, backend: Backend,
               toolkit: str | None) -> tuple[tuple[str, str], ...]:
    """A variant's ``build_env:`` mapping of NAME: value."""
    if not isinstance(node, yaml.MappingNode):
        raise r.fail(node, key, f"expected a mapping of NAME: value, got {kind(node)}")
    out: dict[str, str] = {}
    for name_node, value_node in node.value:
        name = r.scalar(name_node, key)
        child = f"{key}.{name}"
        if not _ENV_NAME.match(name):
            raise r.fail(name_node, child, f"{name!r} is not a variable name")
        if name in out:
            raise r.fail(name_node, child, "duplicate key")
        if name in backend.toolkit_variables:
            raise r.fail(name_node, child, backend.owned_variable(name, toolkit))
        if name.startswith("OPFORGE_") or name in _OPFORGE_BUILD_VARIABLES \
                or name in backend.variables:
            raise r.fail(name_node, child, f"opforge sets {name} from the variant itself")
        out[name] = r.scalar(value_node, child)
    return tuple(out.items())


def _backend(r: Reader, m: dict[str, yaml.Node], key: str, name: str, cuda: str | None,
             mps: bool) -> Backend:
    """The variant's platform backend: ``backend:``, else cuda: / mps: true, else cpu."""
    implied = "cuda" if cuda is not None else "mps" if mps else None
    if cuda is not None and mps:
        raise r.fail(m["mps"], f"{key}.mps", f"variant {name!r} cannot be both CUDA and MPS")
    if "backend" not in m:
        return platforms.get(implied or "cpu")
    chosen = r.scalar(m["backend"], f"{key}.backend")
    if chosen not in platforms.names():
        raise r.fail(m["backend"], f"{key}.backend", f"unknown backend {chosen!r} (known: "
                                                     f"{', '.join(platforms.names())})")
    if implied and chosen != implied:
        spelled, what = ("cuda", f"cuda: {cuda}") if cuda is not None else ("mps", "mps: true")
        raise r.fail(m[spelled], f"{key}.{spelled}",
                     f"{what} makes variant {name!r} a {platforms.get(implied).title} variant, "
                     f"but it says backend: {chosen}")
    return platforms.get(chosen)


def _check_platform_rules(r: Reader, key: str, fields: dict[str, yaml.Node],
                          platform_nodes: list[tuple[str, yaml.Node]], *,
                          variant: str | None = None, backend: Backend | None = None,
                          keys: list[str] | None = None, vnode: yaml.Node | None = None) -> None:
    """The rules that depend on a platform or a backend, asked of the backend's module
    (opforge.platforms): a platform block (``variant`` None) or a variant and the platforms it
    targets, each with its node for the error line."""
    if variant is None or backend is None:
        if "container" in fields and not all(p.startswith("linux-") for p, _ in platform_nodes):
            raise r.fail(fields["container"], f"{key}.container",
                         "only Linux platforms build in a container image")
        return
    toolkit_node = fields.get(backend.toolkit_field)
    spec = VariantFields(
        name=variant, platforms=tuple(p for p, _ in platform_nodes),
        expected_keys=tuple(keys or ()),
        toolkit=r.scalar(toolkit_node, f"{key}.{backend.toolkit_field}")
        if toolkit_node is not None else None,
        arch_list=r.scalar(fields["arch_list"], f"{key}.arch_list")
        if "arch_list" in fields else None)
    if backend.toolkit_field != "toolkit" and "toolkit" in fields:
        raise r.fail(fields["toolkit"], f"{key}.toolkit", f"a {backend.name} variant names its "
                                                          f"toolkit with {backend.toolkit_field}:")
    for field_name, message in backend.check_variant(spec):
        if field_name == "platforms":
            oses = backend.oses
            node = next((n for p, n in platform_nodes if p.split("-", 1)[0] not in oses),
                        fields["platforms"])
        else:
            node = fields.get(field_name.split(".", 1)[0], vnode)
        raise r.fail(node, f"{key}.{field_name}", message)
    if "container" in fields and not backend.needs_toolkit:
        raise r.fail(fields["container"], f"{key}.container",
                     f"container needs cuda: set (variant {variant!r} is not CUDA)")
    for k in keys or ():
        device = device_of(k)
        if device is None or device == backend.device:
            continue
        if device == "cuda":
            raise r.fail(fields["expected_keys"], f"{key}.expected_keys",
                         f"variant {variant!r} expects {k} kernels but sets no cuda version")
        raise r.fail(fields["expected_keys"], f"{key}.expected_keys",
                     f"variant {variant!r} expects MPS kernels but does not set mps: true")
    if "macos_deployment_target" in fields and \
            not all(p.startswith("macos-") for p, _ in platform_nodes):
        raise r.fail(fields["macos_deployment_target"], f"{key}.macos_deployment_target",
                     "only macOS variants take a deployment target")


def _variants(r: Reader, node: yaml.Node, platforms: dict[str, Platform],
              extension: Extension | None = None) -> list[Variant]:
    if not isinstance(node, yaml.SequenceNode) or not node.value:
        raise r.fail(node, "variants", "expected a non-empty list of variants")
    variants: list[Variant] = []
    seen: dict[str, int] = {}
    pypi_by_platform: dict[str, str] = {}
    for i, vnode in enumerate(node.value):
        key = f"variants[{i}]"
        m = r.mapping(vnode, key, _VARIANT_KEYS)
        name = r.scalar(m["name"], f"{key}.name")
        if not _NAME.match(name):
            raise r.fail(m["name"], f"{key}.name", f"{name!r}: use lower-case letters, digits "
                                                   "and _ (it becomes the session build_<name>)")
        if name in seen:
            raise r.fail(m["name"], f"{key}.name",
                         f"duplicate variant {name!r} (first at variants[{seen[name]}])")
        seen[name] = i
        plats = []
        for j, (plat, pnode) in enumerate(r.str_list(m["platforms"], f"{key}.platforms")):
            if plat not in platforms:
                raise r.fail(pnode, f"{key}.platforms[{j}]",
                             f"unknown platform {plat!r} (declared: {', '.join(platforms)})")
            plats.append((plat, pnode))
        keys = _keys(r, m["expected_keys"], f"{key}.expected_keys")
        opt = {k: r.scalar(m[k], f"{key}.{k}") for k in
               ("cuda", "arch_list", "container", "torch_version", "index_variant",
                "macos_deployment_target", "runner", "toolkit") if k in m}
        for k, check in (("runner", field_checks.runner_label),
                         ("container", field_checks.image_reference),
                         ("index_variant", field_checks.index_variant)):
            if k in opt:
                r.check(m[k], f"{key}.{k}", check(opt[k]))
        mps = r.scalar(m["mps"], f"{key}.mps", bool) if "mps" in m else False
        device_checks = (r.scalar(m["device_checks"], f"{key}.device_checks", bool)
                         if "device_checks" in m else True)
        pypi = r.scalar(m["pypi"], f"{key}.pypi", bool) if "pypi" in m else False
        if pypi:
            for plat, _ in plats:
                if plat in pypi_by_platform:
                    raise r.fail(m["pypi"], f"{key}.pypi",
                                 f"variants {pypi_by_platform[plat]!r} and {name!r} both go to "
                                 f"PyPI for {plat}: PyPI holds one wheel per platform and "
                                 "Python, so at most one variant per platform sets pypi: true")
                pypi_by_platform[plat] = name
        cuda = opt.get("cuda")
        backend = _backend(r, m, key, name, cuda, mps)
        _check_platform_rules(r, key, m, plats, variant=name, backend=backend, keys=keys,
                              vnode=vnode)
        if "macos_deployment_target" in opt:
            if not re.match(r"\d+(\.\d+)?\Z", opt["macos_deployment_target"]):
                raise r.fail(m["macos_deployment_target"], f"{key}.macos_deployment_target",
                             f"{opt['macos_deployment_target']!r} is not a macOS version like 12.3")
        if "torch_version" in opt:
            _check_torch_version(r, m["torch_version"], f"{key}.torch_version",
                                 opt["torch_version"], "stable")
        ext_abi = extension.abi if extension else "legacy"
        abi, floor, compat = _abi_fields(
            r, m, key, ext_abi, extension.torch_floor if extension else None,
            extension.compat_torch if extension else ())
        if not _LOCAL_LABEL.match(name.replace("_", ".")):
            raise r.fail(m["name"], f"{key}.name", f"{name!r} does not make a PEP 440 local "
                                                   "version label (+name)")
        if abi == "stable" and "torch_version" in opt and \
                Version(opt["torch_version"]) < Version(floor or "0"):
            raise r.fail(m["torch_version"], f"{key}.torch_version",
                         f"builds against torch {opt['torch_version']}, below its torch_floor "
                         f"{floor}")
        build_env = _build_env(r, m["build_env"], f"{key}.build_env", backend,
                               cuda or opt.get("toolkit")) if "build_env" in m else ()
        variants.append(Variant(name=name, platforms=tuple(p for p, _ in plats),
                                expected_keys=tuple(keys), mps=mps, backend=backend.name,
                                device_checks=device_checks, abi=abi, torch_floor=floor,
                                compat_torch=compat, pypi=pypi, build_env=build_env, **opt))
    return variants

