"""What ``opforge init`` decides from a scan: the namespace, matrix.yaml (with comments),
the recipes stub and the noxfile; and the refusal of a value that would not copy back the
same."""

from __future__ import annotations

import re

from opforge import __version__
from opforge.dispatch_keys import OBSERVED_KEYS, backward_keys, device_type_of
from opforge.errors import UsageError
from opforge.scan import Scan, ScannedOp
from opforge.stubs import recipe_entry

DEFAULT_TORCH = "2.13.0"
DEFAULT_FLOOR = "2.10"   # a stable-ABI extension's torch_floor when its sources do not say
RECIPES_FILE = "opforge_recipes.py"
CUDA_VARIANT = ("cu130", "13.0", "7.5;8.0;8.6;9.0;10.0;12.0+PTX",
                "pytorch/manylinux2_28-builder:cuda13.0")


def _order(keys) -> list[str]:
    """The keys in the census's column order, then the others by name."""
    keys = set(keys)
    known = [k for k in OBSERVED_KEYS if k in keys]
    return known + sorted(keys - set(known))


def choose_namespace(scan: Scan) -> str:
    if not any(scan.namespaces.values()):
        if scan.modules and scan.package:  # pybind11 modules only: no dispatcher ops
            return scan.package
        opt_in = [f"{e.where}: {e.name} is built only when {e.opt_in} is set; a default build "
                  "compiles nothing to check (set it in a variant's build_env and list the "
                  "module under extension.modules to check that build)"
                  for e in scan.extensions if e.opt_in]
        by_hand = "".join(f"\n  {line}" for line in (*opt_in, *scan.by_hand))
        raise UsageError(f"no op extension in {scan.root}: no TORCH_LIBRARY / "
                         "STABLE_TORCH_LIBRARY block, no torch::RegisterOperators chain, no "
                         "PYBIND11_MODULE a build configuration compiles and no torch.library "
                         "registration (custom_op, define, Library) found" + by_hand)
    return max(scan.namespaces, key=lambda ns: len(scan.namespaces[ns]))


def _ops_of(scan: Scan, namespace: str) -> dict[str, ScannedOp]:
    return scan.namespaces.get(namespace, {})


def _variant_kinds(scan: Scan) -> list[str]:
    """The variants init writes: cpu, and cuda / mps where the sources build them."""
    kinds = ["cpu"]
    if scan.has_cuda or any(m.backend == "cuda" for m in scan.modules.values()):
        kinds.append("cuda")
    if scan.has_mps:
        kinds.append("mps")
    return kinds


def _builds(kind: str) -> tuple[str | None, ...]:
    """The device types a variant of ``kind`` has kernels for (None: keys of every device)."""
    return (None, "cpu") if kind == "cpu" else (None, "cpu", kind)


def unchecked_keys(scan: Scan) -> dict[str, list[str]]:
    """Keys the namespace's ops register for a device no variant init writes builds (HPU,
    XLA, XPU, a renamed PrivateUse1 such as npu): key -> ops. They are recorded in matrix.yaml
    (a comment on each op) and reported, never expected: nothing here could check them."""
    built = {d for kind in _variant_kinds(scan) for d in _builds(kind)}
    out: dict[str, list[str]] = {}
    for op in _ops_of(scan, choose_namespace(scan)).values():
        for key in _order(op.named):
            if device_type_of(key) not in built:
                out.setdefault(key, []).append(op.name)
    return out


def device_words(keys, scan: Scan) -> str:
    """'hpu, npu' for HPU and PrivateUse1 (renamed npu): the devices ``keys`` belong to."""
    words = []
    for key in keys:
        device = device_type_of(key)
        if device == "privateuseone" and scan.renamed_backends:
            words += sorted(scan.renamed_backends)
        elif device is not None:
            words.append(device)
    return ", ".join(dict.fromkeys(words))


def render_matrix(scan: Scan, torch_version: str, python: str) -> str:
    # Long by design: the commented matrix.yaml written top to bottom, section by section, as
    # the user will read it; split, the file's order would be spread over functions.
    namespace = choose_namespace(scan)
    ops = _ops_of(scan, namespace)
    forward = [op for op in ops.values() if not op.backward_only]
    unchecked = unchecked_keys(scan)
    union = [k for k in _order({k for op in forward for k in op.keys}) if k not in unchecked] \
        or ["CPU", "Meta"]
    variants = [(kind, CUDA_VARIANT if kind == "cuda" else None)
                for kind in _variant_kinds(scan)]
    lines = [
        f"# opforge build matrix for {scan.distribution}, written by `opforge init` "
        f"(opforge {__version__}).",
        "# Every command finds this file from the working directory upwards (or --file PATH, "
        "$OPFORGE_MATRIX).",
        "# Reference: https://github.com/opforge/opforge/blob/main/docs/adopt.md",
        "",
        "extension:",
        "  path: .                   # the directory with pyproject.toml / setup.py",
        f"  package: {scan.package}        # import name",
        f"  distribution: {scan.distribution}   # wheel / pip name",
        f"  namespace: {namespace}          # torch.ops.<namespace>",
        f"  recipes: {RECIPES_FILE}   # how `opforge smoke` calls each op",
    ]
    if scan.stable_only:
        lines += ["  abi: stable               # STABLE_TORCH_LIBRARY only: one abi3 wheel per "
                  "platform",
                  f'  torch_floor: "{scan.torch_floor or DEFAULT_FLOOR}"       # the oldest torch '
                  "it loads on" + ("" if scan.torch_floor else " (no TORCH_TARGET_VERSION found: "
                                   "check it)")]
    if ops:
        lines += [
            "  # each op is checked against its variant's expected_keys; `remove` / `add` / "
            "`keys`",
            "  # change them for one op, `backward: true` marks an op reached only through a "
            "backward",
            "  ops:",
        ]
        for op in ops.values():
            lines.append("    " + _op_line(op, union, [k for k in _order(op.keys)
                                                      if k in unchecked], scan))
    if scan.modules:
        lines += ["  # compiled modules, each checked on its own by `opforge smoke` in every "
                  "variant that",
                  "  # builds its backend: `import` ones must import and export their functions,",
                  "  # `library` ones must load with torch.ops.load_library and register their ops",
                  "  modules:"]
        for module in scan.modules.values():
            fields = [f"backend: {module.backend}"]
            if module.load != "import":
                fields.append(f"load: {module.load}")
            if module.functions:
                fields.append(f"functions: [{', '.join(module.functions)}]")
            lines.append(f"    {module.name}: {{{', '.join(fields)}}}  # {module.where}")
    others = [ns for ns in scan.namespaces if ns != namespace and scan.namespaces[ns]]
    if others:
        lines.append(f"  # also found: namespace(s) {', '.join(others)}; one matrix checks one "
                     "namespace")
    lines += [
        "",
        "torch:",
        "  channel: stable           # stable | test | nightly",
        f'  version: "{torch_version}"         # the torch every wheel is built against and pins',
        "  index: https://download.pytorch.org/whl",
        "",
        f'pythons: ["{python}"]',
        "",
        "platforms:",
        "  linux-x86_64:",
        "    runner: ubuntu-24.04",
    ]
    if scan.has_mps:
        lines += ["  macos-arm64:", "    runner: macos-14"]
    lines += ["", "variants:"]
    for kind, cuda in variants:
        keys = [k for k in union if device_type_of(k) in _builds(kind)]
        if kind == "cpu":
            lines += ["  - name: cpu", "    platforms: [linux-x86_64]"]
        elif kind == "cuda":
            name, version, archs, container = cuda
            lines += [f"  - name: {name}", "    platforms: [linux-x86_64]",
                      f'    cuda: "{version}"', f'    arch_list: "{archs}"',
                      f"    container: {container}"]
        else:
            lines += ["  - name: mps", "    platforms: [macos-arm64]", "    mps: true",
                      "    index_variant: cpu", "    # hosted macOS runners have no usable "
                      "Metal device: census only", "    device_checks: false"]
        lines.append(f"    expected_keys: [{', '.join(keys) or 'CPU'}]")
        lines.append("")
    return "\n".join(lines)


def _op_line(op: ScannedOp, union: list[str], unchecked: list[str], scan: Scan) -> str:
    where = f"  # {op.where}" + (", mutates its inputs" if op.mutating else "")
    if unchecked:
        where += (f"; also registers {', '.join(unchecked)} (no variant builds "
                  f"{device_words(unchecked, scan)})")
    if op.no_kernel:
        where += "; " + "; ".join(f"no {device} kernel by design, proposed by init: {why} "
                                  "(drop no_kernel if it should have one)"
                                  for device, why in op.no_kernel.items())
    fields = [f"no_kernel: [{', '.join(op.no_kernel)}]"] if op.no_kernel else []
    if op.backward_only:
        # what a backward-only op gets by default: the backend keys and Meta
        missing = [k for k in backward_keys(OBSERVED_KEYS) if k not in op.keys and k in union]
        fields = ["backward: true"] + ([f"remove: [{', '.join(missing)}]"]
                                       if op.keys and missing else []) + fields
        return f"- {op.name}: {{{', '.join(fields)}}}{where}"
    missing = [k for k in union if k not in op.keys]
    if op.keys and missing:
        fields.insert(0, f"remove: [{', '.join(missing)}]")
    return f"- {op.name}: {{{', '.join(fields)}}}{where}" if fields else f"- {op.name}{where}"


def no_kernel_proposals(scan: Scan) -> list[str]:
    """One line per op init declares without a kernel for a device (matrix.yaml
    ``no_kernel``), with the source that showed it, so the author can take it back."""
    return [f"{op.name}: {{no_kernel: [{', '.join(op.no_kernel)}]}}: "
            + "; ".join(op.no_kernel.values()) + " (its kernel only says it has none: smoke "
            "skips its checks there; remove the field from matrix.yaml if it should have one)"
            for op in _ops_of(scan, choose_namespace(scan)).values() if op.no_kernel]


def render_recipes(scan: Scan) -> str:
    namespace = choose_namespace(scan)
    lines = [
        f'"""How `opforge smoke` calls each op of torch.ops.{namespace} '
        "(matrix.yaml: extension.recipes).",
        "",
        "Loaded in the environment under test: import only the standard library and torch.",
        "An op without a recipe is checked by the census only. Each recipe is a dict:",
        "  inputs(dtype) -> list of arguments, built on the CPU (required)",
        "  expected (the CPU result) or check(call, args, out) -> None or what is wrong",
        "  grad / autocast / mutates: argument indices; skip: {check: reason}; atol, rtol",
        "",
        "`opforge init` wrote each recipe from the op's schema or signature (\"stub\": True): it",
        "calls every op once on every present device, and the smoke report names it a stub",
        "until you edit it (real inputs, a known answer, grad) and drop \"stub\".",
        '"""',
        "",
        "import torch  # noqa: F401",
        "",
        "RECIPES = {",
    ]
    for op in _ops_of(scan, namespace).values():
        if op.backward_only:
            lines.append(f"    # {op.name}: backward-only, reached through its forward op's "
                         "\"grad\"")
            continue
        lines += recipe_entry(op.name, op.schema, op.hints, fake="Meta" in op.keys)
    lines.append("}")
    functions = [(m, fn, sig) for m in scan.modules.values() if m.load == "import"
                 for fn, sig in m.functions.items()]
    if functions:
        lines += [
            "",
            "# Calls of the compiled modules' functions, by import name, on the devices listed:",
            "# smoke runs each on every present one. A device registry that fails only when",
            "# called (\"implementation for device cuda:0 not found\") is caught by calling the",
            "# package's own wrapper (e.g. \"mypkg.ops.nms\") with \"devices\": [\"cpu\", \"cuda\"].",
            "FUNCTIONS = {",
        ]
        for module, fn, sig in functions:
            lines += recipe_entry(f"{module.name}.{fn}", f"{fn}({sig})" if sig is not None
                                  else None, module.hints.get(fn), fake=True,
                                  devices=[module.backend])
        lines.append("}")
    return "\n".join(lines) + "\n"


def render_noxfile() -> str:
    return (f'# /// script\n# dependencies = ["nox>=2025.2.9", "opforge=={__version__}"]\n'
            "# ///\nimport opforge.nox\n\nopforge.nox.sessions(\"matrix.yaml\")\n")


# characters that end a line (or a string) in YAML or Python, or that no name may hold
_UNSAFE = re.compile(r"[\x00-\x1f\x7f\x85\u2028\u2029\ufeff]")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)?")
_PACKAGE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
_DISTRIBUTION = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")


def check_copied(scan: Scan) -> None:
    """Refuse, naming the file and line, a value init would copy into matrix.yaml or the
    recipes file that would not come back the same (a schema with a line break and code after
    it, an op name with a newline that would add an op): copied, it would change meaning."""
    def refuse(where: str, what: str, value: str, why: str) -> UsageError:
        shown = _UNSAFE.sub(lambda m: repr(m.group())[1:-1], value)[:120]
        return UsageError(f"{where or scan.root}: {what} {shown!r} {why}; init copies it into "
                          f"matrix.yaml and {RECIPES_FILE} and it would not read back the same "
                          "(fix the source, or write the files by hand: docs/adopt.md)")

    for what, value, pattern in (("the package name", scan.package, _PACKAGE),
                                 ("the distribution name", scan.distribution, _DISTRIBUTION)):
        if value is not None and not pattern.fullmatch(value):
            raise refuse("pyproject.toml / setup.py", what, value, "is not a valid name")
    for namespace, ops in scan.namespaces.items():
        first = next(iter(ops.values()), None)
        where = first.where if first is not None else ""
        if not _NAME.fullmatch(namespace) or "." in namespace:
            raise refuse(where, "the namespace", namespace, "is not a valid name")
        for op in ops.values():
            if not _NAME.fullmatch(op.name):
                raise refuse(op.where, "the op name", op.name, "is not a valid name")
            if op.schema is not None and _UNSAFE.search(op.schema):
                raise refuse(op.where, f"{op.name}'s schema", op.schema,
                             "holds a line break or a control character")
            if _UNSAFE.search(op.where):
                raise refuse("", f"{op.name}'s source path", op.where,
                             "holds a line break or a control character")
