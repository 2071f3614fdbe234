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
from opforge.dispatch_keys import device_of
from opforge.errors import UsageError
from opforge.files import read_text
from opforge.matrix.extension import abi_fields, extension_section, key_list
from opforge.matrix.model import (
    CHANNELS,
    Extension,
    Matrix,
    MatrixError,
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
    extension = extension_section(r, top["extension"])
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


_VARIANT_KEYS = {"name": True, "platforms": True, "expected_keys": True, "container": False,
                 "torch_version": False, "index_variant": False, "device_checks": False,
                 "runner": False, "abi": False, "torch_floor": False, "compat_torch": False,
                 "pypi": False, "build_env": False, "backend": False, "toolkit": False}


def _backend_keys() -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """The variant keys the registered backends own: their toolkit spellings (toolkit, cuda),
    their settings (arch_list, macos_deployment_target) and their flags (mps: true)."""
    owned: tuple[list[str], list[str], list[str]] = ([], [], [])
    for backend in platforms.backends():
        for names, spelled in zip(owned, ((backend.toolkit_field,), backend.option_fields,
                                          (backend.flag_field,))):
            names += [n for n in spelled if n and n not in names]
    toolkits, options, flags = owned
    return tuple(toolkits), tuple(options), tuple(flags)


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


def _backend(r: Reader, m: dict[str, yaml.Node], key: str, name: str,
             values: dict[str, object]) -> Backend:
    """The variant's platform backend: ``backend:``, else the one its own spelling implies
    (CUDA's ``cuda: "13.0"``, MPS's ``mps: true``), else cpu. ``values``: the backends'
    keys the variant sets."""
    implied = [(b, spelled) for b in platforms.backends()
               for spelled in (b.toolkit_field, b.flag_field)
               if spelled and spelled != "toolkit" and values.get(spelled)]
    if len(implied) > 1:
        (first, _), (second, spelled) = implied[:2]
        raise r.fail(m[spelled], f"{key}.{spelled}",
                     f"variant {name!r} cannot be both {first.title} and {second.title}")
    if "backend" not in m:
        return implied[0][0] if implied else platforms.get("cpu")
    chosen = r.scalar(m["backend"], f"{key}.backend")
    if chosen not in platforms.names():
        raise r.fail(m["backend"], f"{key}.backend", f"unknown backend {chosen!r} (known: "
                                                     f"{', '.join(platforms.names())})")
    if implied and chosen != implied[0][0].name:
        backend, spelled = implied[0]
        value = values[spelled]
        what = f"{spelled}: {'true' if value is True else value}"
        raise r.fail(m[spelled], f"{key}.{spelled}",
                     f"{what} makes variant {name!r} a {backend.title} variant, "
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
        if "arch_list" in fields else None,
        options={k: r.scalar(fields[k], f"{key}.{k}") for k in _backend_keys()[1] if k in fields})
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
        owner = next(b for b in platforms.backends() if b.device == device
                     and any(k.endswith(word) for word in b.dispatch_words))
        raise r.fail(fields["expected_keys"], f"{key}.expected_keys",
                     owner.foreign_key(variant, k, backend.name))
    if "macos_deployment_target" in fields and \
            not all(p.startswith("macos-") for p, _ in platform_nodes):
        raise r.fail(fields["macos_deployment_target"], f"{key}.macos_deployment_target",
                     "only macOS variants take a deployment target")
    if "macos_deployment_target" in fields:
        target = r.scalar(fields["macos_deployment_target"], f"{key}.macos_deployment_target")
        if not re.match(r"\d+(\.\d+)?\Z", target):
            raise r.fail(fields["macos_deployment_target"], f"{key}.macos_deployment_target",
                         f"{target!r} is not a macOS version like 12.3")


def _variants(r: Reader, node: yaml.Node, platforms: dict[str, Platform],
              extension: Extension | None = None) -> list[Variant]:
    if not isinstance(node, yaml.SequenceNode) or not node.value:
        raise r.fail(node, "variants", "expected a non-empty list of variants")
    variants: list[Variant] = []
    seen: dict[str, int] = {}
    pypi_by_platform: dict[str, str] = {}
    for i, vnode in enumerate(node.value):
        key = f"variants[{i}]"
        toolkits, option_keys, flags = _backend_keys()
        m = r.mapping(vnode, key, {**_VARIANT_KEYS, **dict.fromkeys(
            (*toolkits, *option_keys, *flags), False)})
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
        keys = key_list(r, m["expected_keys"], f"{key}.expected_keys")
        opt = {k: r.scalar(m[k], f"{key}.{k}") for k in
               ("container", "torch_version", "index_variant", "runner") if k in m}
        text = {k: r.scalar(m[k], f"{key}.{k}") for k in (*toolkits, *option_keys) if k in m}
        flag = {k: r.scalar(m[k], f"{key}.{k}", bool) for k in flags if k in m}
        for k, check in (("runner", field_checks.runner_label),
                         ("container", field_checks.image_reference),
                         ("index_variant", field_checks.index_variant)):
            if k in opt:
                r.check(m[k], f"{key}.{k}", check(opt[k]))
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
        backend = _backend(r, m, key, name, {**text, **flag})
        toolkit = text.get(backend.toolkit_field)
        options = tuple((k, text[k]) for k in option_keys if k in text)
        _check_platform_rules(r, key, m, plats, variant=name, backend=backend, keys=keys,
                              vnode=vnode)
        if "torch_version" in opt:
            _check_torch_version(r, m["torch_version"], f"{key}.torch_version",
                                 opt["torch_version"], "stable")
        ext_abi = extension.abi if extension else "legacy"
        abi, floor, compat = abi_fields(
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
                               toolkit) if "build_env" in m else ()
        variants.append(Variant(name=name, platforms=tuple(p for p, _ in plats),
                                expected_keys=tuple(keys), backend=backend.name,
                                toolkit=toolkit, options=options,
                                device_checks=device_checks, abi=abi, torch_floor=floor,
                                compat_torch=compat, pypi=pypi, build_env=build_env, **opt))
    return variants

