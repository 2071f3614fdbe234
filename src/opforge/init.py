"""``opforge init``: write an extension's opforge configuration from its sources.

``scan_extension`` (opforge.scan) reads the sources; ``plan_files`` renders matrix.yaml (with
comments), a recipes stub, a three-line noxfile and three caller workflows (CI, nightly canary,
bisect) that call opforge's reusable workflows pinned by commit; ``write_files`` writes all of
them or none, never replacing a file unless asked. The extension's own files are never touched.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from opforge import __version__, _release
from opforge.dispatch_keys import OBSERVED_KEYS, backward_keys, device_of
from opforge.errors import UsageError
from opforge.files import check_target, lookup, read_head, write_file
from opforge.matrix import parse_matrix
from opforge.scan import Scan, ScannedOp, scan_extension
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
        by_hand = "".join(f"\n  {line}" for line in scan.by_hand)
        raise UsageError(f"no op extension in {scan.root}: no TORCH_LIBRARY / "
                         "STABLE_TORCH_LIBRARY block, no torch::RegisterOperators chain, no "
                         "PYBIND11_MODULE a build configuration compiles and no torch.library "
                         "registration (custom_op, define, Library) found" + by_hand)
    return max(scan.namespaces, key=lambda ns: len(scan.namespaces[ns]))


def _ops_of(scan: Scan, namespace: str) -> dict[str, ScannedOp]:
    return scan.namespaces.get(namespace, {})


def render_matrix(scan: Scan, torch_version: str, python: str) -> str:
    namespace = choose_namespace(scan)
    ops = _ops_of(scan, namespace)
    forward = [op for op in ops.values() if not op.backward_only]
    union = _order({k for op in forward for k in op.keys}) or ["CPU", "Meta"]
    variants = [("cpu", None)]
    if scan.has_cuda or any(m.backend == "cuda" for m in scan.modules.values()):
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
            lines.append("    " + _op_line(op, union))
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
        keys = [k for k in union if device_of(k) in (None, kind if kind != "cpu" else None)]
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
        # what a backward-only op gets by default: the backend keys and Meta
        missing = [k for k in backward_keys(OBSERVED_KEYS) if k not in op.keys and k in union]
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


# --------------------------------------------------------------------------- caller workflows

_COMMIT = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class WorkflowsPin:
    """Which commit of opforge's repository the callers ``uses:``, and the opforge they install."""

    commit: str
    opforge: str       # the pip requirement the reusable workflows install
    source: str        # where the commit came from, for the note init prints


def workflows_pin(explicit: str | None = None) -> WorkflowsPin:
    """``--workflows-ref``, else the commit stamped into this release, else the commit of a
    git checkout of a release (its ``v<version>`` tag on HEAD); a UsageError otherwise: a
    commit in no release may never be published, and every caller pinned to it breaks."""
    release = f"opforge=={__version__}"
    if explicit is not None:
        if not _COMMIT.fullmatch(explicit):
            raise UsageError(f"--workflows-ref {explicit!r}: give the full 40-hex commit of "
                             f"{_release.WORKFLOWS_REPOSITORY} (a tag or branch can be moved; "
                             f"`git ls-remote https://github.com/{_release.WORKFLOWS_REPOSITORY} "
                             f"v{__version__}` prints the release's)")
        return WorkflowsPin(explicit, release, "--workflows-ref")
    if _COMMIT.fullmatch(_release.WORKFLOWS_COMMIT):
        return WorkflowsPin(_release.WORKFLOWS_COMMIT, release, f"the opforge {__version__} release")
    commit, where, folder = _source_commit()
    if commit and _release_tagged(commit, folder):
        return WorkflowsPin(commit, release, f"{where}, tagged v{__version__}")
    if commit:
        raise UsageError(
            f"this opforge ({__version__}) is not a release: {where} is at "
            f"{commit}, a commit in no release of {_release.WORKFLOWS_REPOSITORY}, and "
            "workflows pinned to it break for every caller if it is never published; install "
            "a release (pip install opforge), or pass --workflows-ref <40-hex commit> to pin "
            "that commit knowingly")
    raise UsageError(f"cannot tell which commit of {_release.WORKFLOWS_REPOSITORY} this opforge "
                     f"({__version__}) is, to pin the workflows to; pass --workflows-ref "
                     "<40-hex commit>")


def _release_tagged(commit: str, folder: Path | None) -> bool:
    """The checkout's commit carries this version's release tag (``v<version>``)."""
    if folder is None:
        return False
    try:
        tags = subprocess.run(["git", "-C", str(folder), "tag", "--points-at", commit],
                              capture_output=True, text=True, timeout=30).stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        return False
    return f"v{__version__}" in tags


def _source_commit() -> tuple[str | None, str, Path | None]:
    """The commit of the git checkout this opforge is imported from (a development tree,
    or a ``pip install git+...@commit`` / of a checkout, per its direct_url.json)."""
    try:
        direct = metadata.distribution("opforge").read_text("direct_url.json")
        info = json.loads(direct) if direct else {}
    except (metadata.PackageNotFoundError, ValueError, OSError):
        info = {}
    tree = Path(__file__).resolve().parents[2]
    commit = (info.get("vcs_info") or {}).get("commit_id") if isinstance(info, dict) else None
    if isinstance(commit, str) and _COMMIT.fullmatch(commit) and \
            not (tree / "pyproject.toml").is_file():
        return commit, f"the git install of opforge ({info.get('url')})", None
    for folder in (tree, _file_url_path(info.get("url") if isinstance(info, dict) else None)):
        if folder is None or not (folder / "pyproject.toml").is_file():
            continue
        if 'name = "opforge"' not in (folder / "pyproject.toml").read_text(encoding="utf-8"):
            continue
        try:
            head = subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"],
                                  capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            continue
        if _COMMIT.fullmatch(head):
            return head, f"the opforge checkout at {folder}", folder
    return None, "", None


def _file_url_path(url: object) -> Path | None:
    return Path(url[len("file://"):]) if isinstance(url, str) and url.startswith("file://") \
        else None


def repository_root(root: Path) -> Path:
    """The git repository ``root`` is in (workflows live at its top), else ``root``.

    A repository is a folder holding a real ``.git``: a directory (not a link to one), or a
    ``gitdir: PATH`` file (a worktree, a submodule) whose PATH is a directory. An empty or
    any other file named ``.git`` in some ancestor decides nothing.
    """
    here = root.resolve()
    for folder in (here, *here.parents):
        if _is_git_dir(folder / ".git") or _git_file_points(folder / ".git"):
            return folder
    return here


def _is_git_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except (OSError, ValueError):
        return False


def _git_file_points(path: Path) -> bool:
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return False
        first = read_head(path, 4096).decode("utf-8", "replace").splitlines()
    except (OSError, UsageError):
        return False
    if not first or not first[0].startswith("gitdir:"):
        return False
    target = Path(first[0][len("gitdir:"):].strip())
    return _is_git_dir(target if target.is_absolute() else path.parent / target)


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


def render_workflows(matrix_text: str, matrix_file: str, pin: WorkflowsPin) -> dict[str, str]:
    """The three caller workflows, by file name under .github/workflows/."""
    import yaml

    matrix = yaml.safe_load(matrix_text)
    uses = f"{_release.WORKFLOWS_REPOSITORY}/.github/workflows/{{}}@{pin.commit} # v{__version__}"
    given = f"      opforge: {_quoted(pin.opforge)}\n      matrix-file: {_quoted(matrix_file)}\n"
    choices = {"variant": [v["name"] for v in matrix["variants"]],
               "platform": list(matrix["platforms"]),
               "python": [str(p) for p in matrix["pythons"]]}
    inputs = "".join(
        f"      {name}:\n        description: \"matrix.yaml {name}\"\n        type: choice\n"
        f"        options: [{', '.join(_quoted(o) for o in options)}]\n"
        f"        default: {_quoted(options[0])}\n" for name, options in choices.items())
    inputs += "".join(
        f"      {name}:\n        description: \"{text}\"\n        type: string\n"
        "        default: \"\"\n" for name, text in _BISECT_TEXT_INPUTS)
    passed = "".join(f"      {name}: ${{{{ inputs.{name} }}}}\n"
                     for name in [*choices, *(name for name, _ in _BISECT_TEXT_INPUTS)])
    return {
        "opforge-ci.yml": _CI.format(header=_header("build each variant of matrix.yaml and "
                                                    "smoke-test its wheel."),
                                     uses=uses.format("reusable-build-smoke.yml"), given=given),
        "opforge-nightly.yml": _NIGHTLY.format(
            header=_header("every variant against today's torch nightly; "
                           "bisect a failure."),
            uses=uses.format("reusable-nightly.yml"), given=given),
        "opforge-bisect.yml": _BISECT.format(
            header=_header("find the torch nightly that broke a cell (by hand)."),
            inputs=inputs, uses=uses.format("reusable-bisect.yml"), given=passed + given),
    }


_BISECT_TEXT_INPUTS = (
    ("good", "a nightly that passes (YYYY-MM-DD); empty: walk back from bad"),
    ("bad", "a nightly that fails (YYYY-MM-DD); empty: the newest"),
    ("match", "count a failure only when its output matches this regex (empty: any)"),
)


def _header(what: str) -> str:
    return (f"# Written by `opforge init` (opforge {__version__}): {what}\n"
            "# It calls opforge's reusable workflow pinned to a commit; `opforge workflows "
            "check` holds it\n# to matrix.yaml. To move to another opforge release: "
            "`opforge init --force` with that release,\n# or edit the commit, its `# v` "
            "comment and the `opforge` input together (docs/adopt.md).\n")


_TOP = """
permissions:
  contents: read

concurrency:
  group: {group}
  cancel-in-progress: true

jobs:
"""
_CI = ("{header}name: opforge\n\non:\n  push:\n    branches: [main, master]\n  pull_request:\n"
       "  workflow_dispatch:\n" + _TOP.format(
           group="${{{{ github.workflow }}}}-${{{{ github.event.pull_request.number || "
                 "github.ref }}}}") +
       "  wheels:\n    uses: {uses}\n    with:\n{given}")
_NIGHTLY = ("{header}name: opforge nightly\n\non:\n  schedule:\n"
            "    - cron: \"23 7 * * *\"  # torch nightlies are out by about 07:00 UTC\n"
            "  workflow_dispatch:\n" + _TOP.format(
                group="${{{{ github.workflow }}}}-${{{{ github.ref }}}}") +
            "  canary:\n    uses: {uses}\n    with:\n{given}")
_BISECT = ("{header}name: opforge bisect\n\non:\n  workflow_dispatch:\n    inputs:\n{inputs}" +
           _TOP.format(group="${{{{ github.workflow }}}}-${{{{ inputs.variant }}}}-"
                             "${{{{ inputs.platform }}}}-${{{{ inputs.python }}}}") +
           "  bisect:\n    uses: {uses}\n    with:\n{given}")


def _quoted(value: str) -> str:
    return json.dumps(str(value))


def plan_files(root: Path, *, torch_version: str = DEFAULT_TORCH, python: str = "3.11",
               workflows_ref: str | None = None) -> tuple[Scan, dict[Path, str]]:
    root = Path(root)
    info = lookup(root, what="the extension's directory")
    if info is None or not stat.S_ISDIR(info.st_mode):
        raise UsageError(f"{root}: no such directory")
    scan = scan_extension(root)
    check_copied(scan)
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
    pin = workflows_pin(workflows_ref)
    repo = repository_root(root)
    matrix_file = (root.resolve() / "matrix.yaml").relative_to(repo).as_posix()
    files = {root / "matrix.yaml": matrix_text,
             root / RECIPES_FILE: render_recipes(scan),
             root / "noxfile.py": render_noxfile()}
    for name, text in render_workflows(matrix_text, matrix_file, pin).items():
        files[repo / ".github" / "workflows" / name] = text
    scan.notes.append(f"workflows pinned to {_release.WORKFLOWS_REPOSITORY}@{pin.commit[:12]} "
                      f"(from {pin.source}); they install {pin.opforge}")
    return scan, files


def _write_root(path: Path) -> Path:
    """The folder a written file must stay under: the repository for a workflow (so a
    symlinked ``.github`` is refused), else the file's own folder."""
    if path.parent.name == "workflows" and path.parent.parent.name == ".github":
        return path.parents[2]
    return path.parent


def write_files(files: dict[Path, str], force: bool) -> list[Path]:
    """All of them or none: every target is checked before any write (an existing file is
    refused unless ``force``; a link, FIFO or directory where a file goes, or a link among
    the folders, always), then each is written under its folder without following links."""
    existing = [p for p in files if check_target(p, root=_write_root(p), what="init")]
    if existing and not force:
        raise UsageError("would overwrite " + ", ".join(str(p) for p in existing)
                         + " (--force to replace them, --dry-run to see what would be written)")
    written: list[Path] = []
    for path, text in files.items():
        write_file(path, text, root=_write_root(path), what="init")
        written.append(path)
    return written
