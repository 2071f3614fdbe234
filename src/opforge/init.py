"""``opforge init``: write an extension's opforge configuration from its sources.

``scan_extension`` (opforge.scan) reads the sources; ``plan_files`` renders matrix.yaml (with
comments), a recipes stub and a three-line noxfile; ``write_files`` writes all of them or none,
never replacing a file unless asked. The extension's own files are never touched.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from opforge import __version__
from opforge.errors import UsageError
from opforge.files import lookup
from opforge.matrix import parse_matrix
from opforge.scan import Scan, ScannedOp, scan_extension

DEFAULT_TORCH = "2.13.0"
RECIPES_FILE = "opforge_recipes.py"
CUDA_VARIANT = ("cu130", "13.0", "7.5;8.0;8.6;9.0;10.0;12.0+PTX",
                "pytorch/manylinux2_28-builder:cuda13.0")
# keys a variant builds, by device: CUDA/MPS keys only in the variants that compile them
_BASE_ORDER = ("CPU", "CUDA", "MPS", "Meta", "Autograd", "AutocastCPU", "AutocastCUDA",
               "AutocastMPS")


def _order(keys) -> list[str]:
    keys = set(keys)
    known = [k for k in _BASE_ORDER if k in keys]
    return known + sorted(keys - set(known))


def _device_of(key: str) -> str | None:
    return "cuda" if key.endswith("CUDA") else "mps" if key.endswith("MPS") else None


def choose_namespace(scan: Scan) -> str:
    if not any(scan.namespaces.values()):
        raise UsageError(f"no op extension in {scan.root}: no TORCH_LIBRARY / "
                         "TORCH_LIBRARY_FRAGMENT / STABLE_TORCH_LIBRARY block and no "
                         "torch.library registration (custom_op, define, Library) found")
    return max(scan.namespaces, key=lambda ns: len(scan.namespaces[ns]))


def render_matrix(scan: Scan, torch_version: str, python: str) -> str:
    namespace = choose_namespace(scan)
    ops = scan.namespaces[namespace]
    forward = [op for op in ops.values() if not op.backward_only]
    union = _order({k for op in forward for k in op.keys}) or ["CPU", "Meta"]
    variants = [("cpu", None)]
    if scan.has_cuda:
        variants.append(("cuda", CUDA_VARIANT))
    if scan.has_mps:
        variants.append(("mps", None))
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
        "  # each op is checked against its variant's expected_keys; `remove` / `add` / `keys`",
        "  # change them for one op, `backward: true` marks an op reached only through a backward",
        "  ops:",
    ]
    for op in ops.values():
        lines.append("    " + _op_line(op, union))
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
        keys = [k for k in union if _device_of(k) in (None, kind if kind != "cpu" else None)]
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


def _op_line(op: ScannedOp, union: list[str]) -> str:
    where = f"  # {op.where}" + (", mutates its inputs" if op.mutating else "")
    if op.backward_only:
        backend = {"CPU", "CUDA", "MPS", "Meta"}
        missing = [k for k in _order(backend) if k not in op.keys and k in union]
        fields = ["backward: true"] + ([f"remove: [{', '.join(missing)}]"]
                                       if op.keys and missing else [])
        return f"- {op.name}: {{{', '.join(fields)}}}{where}"
    missing = [k for k in union if k not in op.keys]
    if op.keys and missing:
        return f"- {op.name}: {{remove: [{', '.join(missing)}]}}{where}"
    return f"- {op.name}{where}"


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
        '"""',
        "",
        "import torch  # noqa: F401",
        "",
        "RECIPES = {",
    ]
    for op in scan.namespaces[namespace].values():
        if op.backward_only:
            lines.append(f"    # {op.name}: backward-only, reached through its forward op's "
                         "\"grad\"")
            continue
        lines.append(f"    # {op.schema or op.name + '(...)'}")
        lines.append(f'    # "{op.name}": {{"inputs": lambda dtype: [torch.rand(4, 4, '
                     f'dtype=dtype)]}},')
    lines.append("}")
    return "\n".join(lines) + "\n"


def render_noxfile() -> str:
    return (f'# /// script\n# dependencies = ["nox>=2025.2.9", "opforge=={__version__}"]\n'
            "# ///\nimport opforge.nox\n\nopforge.nox.sessions(\"matrix.yaml\")\n")


def plan_files(root: Path, *, torch_version: str = DEFAULT_TORCH,
               python: str = "3.11") -> tuple[Scan, dict[Path, str]]:
    root = Path(root)
    info = lookup(root, what="the extension's directory")
    if info is None or not stat.S_ISDIR(info.st_mode):
        raise UsageError(f"{root}: no such directory")
    scan = scan_extension(root)
    if not (root / "pyproject.toml").is_file() and not (root / "setup.py").is_file():
        raise UsageError(f"no op extension in {root}: no pyproject.toml or setup.py to build it")
    if scan.package is None:
        raise UsageError(f"no Python package (a directory with __init__.py) in {root}")
    matrix_text = render_matrix(scan, torch_version, python)
    try:  # never write a matrix that opforge itself would refuse (--torch banana)
        parse_matrix(matrix_text, root / "matrix.yaml")
    except UsageError as exc:
        raise UsageError(f"the matrix.yaml init would write is not valid ({exc}); check "
                         "--torch and --python") from None
    files = {root / "matrix.yaml": matrix_text,
             root / RECIPES_FILE: render_recipes(scan),
             root / "noxfile.py": render_noxfile()}
    return scan, files


def write_files(files: dict[Path, str], force: bool) -> list[Path]:
    """All of them or none: existing files are refused (unless ``force``) before any write."""
    existing = [p for p in files if p.exists()]
    if existing and not force:
        raise UsageError("would overwrite " + ", ".join(str(p) for p in existing)
                         + " (--force to replace them, --dry-run to see what would be written)")
    written: list[Path] = []
    staged: list[tuple[Path, Path]] = []
    try:
        for path, text in files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.opforge-init")
            tmp.write_text(text, encoding="utf-8")
            staged.append((tmp, path))
        for tmp, path in staged:
            os.replace(tmp, path)
            written.append(path)
    finally:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
    return written
