"""The smoke's plan, from its options: the matrix read, the variant under test chosen (from
``--variant``, the wheel's build record or local version, or the installed record), the target
and the probe request carrying that variant's promises, in one frozen ``Plan``. ``opforge
smoke`` and ``opforge bench`` both start here: their command modules turn the parsed arguments
into ``Options`` (``opforge.cli.smoke.options_of``) and ``make_plan`` does the rest; nothing
below the command line reads the argparse namespace."""

from __future__ import annotations

import hashlib
import os
import re
import stat
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from opforge.errors import OpforgeError, UsageError
from opforge.files import check_writable, lookup, open_problem
from opforge.matrix import Promises, find_matrix, load_matrix, promises
from opforge.torchsource import resolve_index

if TYPE_CHECKING:
    from opforge.matrix import Matrix
    from opforge.smoke.runner import ProbeRequest, Target

_KEY = re.compile(r"[A-Z][A-Za-z]*\Z")


# the matrix one smoke or bench run parsed, by the file and its bytes' digest: a run asks for
# it several times (the plan, the device-code cause, compat), and parses it once
_PARSED: dict[tuple, object] = {}


def load_matrix_of(path: Path | None, required: bool):
    """The matrix ``--file`` names (else the one found from here), parsed once per process
    while its bytes are unchanged; None when none loads and ``required`` is false."""
    try:
        found = Path(path) if path is not None else find_matrix()
        if not stat.S_ISREG(os.stat(found).st_mode):
            return _fallback(path, required)  # a FIFO, a directory...: never opened here
        with open(found, "rb") as fh:  # the parser reads it again, guarded, when it changed
            digest = hashlib.sha256(fh.read(1 << 24)).hexdigest()
        key = (str(found.resolve()), digest)
        if key not in _PARSED:
            _PARSED.clear()  # one matrix per run: keep only the newest
            _PARSED[key] = load_matrix(found)
        return _PARSED[key]
    except OSError:
        return _fallback(path, required)
    except OpforgeError:
        if required:
            raise
        return None


def _fallback(path: Path | None, required: bool):
    """A file that cannot be opened (missing, a directory, a FIFO...): the parser says why,
    in its words."""
    try:
        return load_matrix(path)
    except OpforgeError:
        if required:
            raise
        return None


@dataclass(frozen=True)
class Choice:
    """The variant under test: its name and how it is known (``--variant``, the wheel's build
    record or local version), or ``pending`` when only the installed build record can say
    (``--python``, ``--requirement``): then ``choose_installed`` picks it before the probe."""

    variant: str | None = None
    source: str | None = None
    pending: bool = False


def _regular_file(path: Path, option: str) -> None:
    try:
        info = os.stat(path)
    except (OSError, ValueError) as exc:
        problem = open_problem(exc) if isinstance(exc, OSError) else "not a valid path"
        raise UsageError(f"{option} {path}: {problem}") from None
    if not stat.S_ISREG(info.st_mode):
        raise UsageError(f"{option} {path}: not a regular file")


def _interpreter(path: Path) -> None:
    try:
        info = os.stat(path)
    except (OSError, ValueError):
        raise UsageError(f"--python {path}: no such interpreter") from None
    if not stat.S_ISREG(info.st_mode):
        raise UsageError(f"--python {path}: not an interpreter (not a regular file)")
    if not os.access(path, os.X_OK):
        raise UsageError(f"--python {path}: not executable")


def _empty_or_new_dir(path: Path) -> None:
    info = lookup(path, what="--env-dir")
    if path.is_symlink() or info is not None:
        if info is None or not stat.S_ISDIR(info.st_mode):
            raise UsageError(f"--env-dir {path}: exists and is not a directory")
        if any(path.iterdir()):
            raise UsageError(f"--env-dir {path} exists and is not empty: remove it or choose "
                             "another directory")
        return
    check_writable(path, what="--env-dir")


@dataclass(frozen=True)
class Options:
    """What the command line said about the target, the probe and its report: the options
    ``opforge smoke`` and ``opforge bench`` share (``add_target_arguments``) and smoke's own
    (bench leaves those at their defaults)."""

    wheel: Path | None = None
    requirement: str | None = None
    python: Path | None = None
    package: str | None = None
    namespace: str | None = None
    variant: str | None = None
    torch_spec: str | None = None
    torch_index: str | None = None
    keep_env: bool = False
    env_dir: Path | None = None
    recipes: Path | None = None
    file: Path | None = None
    expect_keys: tuple[str, ...] | None = None
    ops: tuple[str, ...] | None = None
    internal_ops: tuple[str, ...] | None = None
    json: Path | None = None
    junit: Path | None = None
    device_checks: str = "auto"
    speed_check: str = "auto"
    compat: bool = False
    compat_torch: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Plan:
    """One smoke or bench run, planned once: its options, the matrix (None when none was
    needed and none loads), the target, the probe request and the variant choice."""

    options: Options
    matrix: Matrix | None
    target: Target
    request: ProbeRequest
    choice: Choice

    @property
    def variant(self) -> str | None:
        return self.choice.variant


def make_plan(given: Options) -> Plan:
    """Options + matrix -> the Plan: the request carries the promises of the variant under
    test only (none yet while the choice is pending)."""
    # smoke/plan is on the CLI's startup path (cli/smoke's Options): the runner (~13 ms) and
    # matrix.dist (~1 ms) are imported when a plan is made
    from opforge.smoke.runner import ProbeRequest, Target

    _check_arguments(given)
    needs_matrix = (given.variant is not None or given.package is None or given.namespace is None
                    or given.file is not None)
    matrix = load_matrix_of(given.file, required=needs_matrix)
    ext = matrix.extension if matrix else None
    package = given.package or ext.package
    namespace = given.namespace or ext.namespace
    for what, value in (("--package", package), ("--namespace", namespace)):
        if not value.replace(".", "_").isidentifier():
            raise UsageError(f"{what} {value!r} is not an identifier")
    own = ext is not None and package == ext.package

    wheel = given.wheel
    if not (wheel or given.requirement or given.python):
        # on the startup path: matrix.dist when a plan is made
        from opforge.matrix.dist import latest_wheel

        wheel = latest_wheel(matrix, matrix.variant(given.variant).name)
    variant, choice = _choose(given, matrix, own, wheel)
    for key in given.expect_keys or ():
        if not _KEY.match(key):
            raise UsageError(f"--expect-keys: {key!r} is not a dispatch key name "
                             "(e.g. CPU, CUDA, MPS, Meta, Autograd, AutocastCPU)")
    for op in (*(given.ops or ()), *(given.internal_ops or ())):
        if not op.isidentifier():
            raise UsageError(f"{op!r} is not an operator name")

    chosen = _promises(given, ext if own else None, variant)
    device_checks = given.device_checks
    if variant is not None and not variant.device_checks and device_checks == "auto":
        device_checks = "skip"
    channel_index = matrix.torch_index(variant) if (matrix and variant) else None
    index = resolve_index(channel_index, given.torch_index)
    if choice.pending:  # nothing is promised until the installed build record names a variant

        chosen = Promises()
    recipes = given.recipes
    if recipes is None and own and ext.recipes:
        recipes = matrix.path.parent / ext.recipes
        if not recipes.is_file():
            raise UsageError(f"{matrix.path.name}: extension.recipes {ext.recipes!r}: no such "
                             f"file in {matrix.path.parent}")
    variant_torch = matrix.torch_spec(variant) \
        if (variant is not None and wheel is not None and not given.torch_spec) else None
    target = Target(wheel=wheel, requirement=given.requirement, python=given.python,
                    torch_spec=given.torch_spec, torch_index=index, env_dir=given.env_dir,
                    variant_torch=variant_torch)
    request = ProbeRequest(package=package, namespace=namespace, device_checks=device_checks,
                           recipes=recipes,
                           speed=speed_spec(ext if own else None, given.speed_check))
    return Plan(options=given, matrix=matrix, target=target, request=request.promising(chosen),
                choice=choice)


def _choose(given: Options, matrix, own: bool, wheel):
    """The variant under test and how it is known: --variant, else the wheel's build record
    or local version, else pending (the installed record decides)."""
    variant = None
    choice = Choice()
    if given.variant is not None:
        variant = matrix.variant(given.variant)
        choice = Choice(variant.name)
    elif own:
        # on the startup path: matrix.dist when a plan is made
        from opforge.matrix.dist import identify_wheel

        found = identify_wheel(matrix, wheel) if wheel is not None else None
        if found is not None:
            variant = found[0]
            choice = Choice(variant.name, found[1])
        elif given.expect_keys is None:
            choice = Choice(pending=True)
    return variant, choice


def _check_arguments(given: Options) -> None:
    """The target's options and every file the run will write, checked first (exit 2)."""
    if not (given.wheel or given.requirement or given.python or given.variant):
        raise UsageError("give --variant V (its wheel from dist/V), --wheel PATH, "
                         "--requirement REQ or --python PATH")
    if given.wheel is not None and given.wheel.suffix != ".whl":
        raise UsageError(f"--wheel {given.wheel}: not a .whl file")
    if given.wheel is not None:
        _regular_file(given.wheel, "--wheel")
    if given.python is not None:
        _interpreter(given.python)
    if given.python is not None and (given.torch_spec or given.keep_env or given.env_dir):
        raise UsageError("--torch, --keep-env and --env-dir apply to a fresh environment, "
                         "not --python")
    if given.recipes is not None:
        _regular_file(given.recipes, "--recipes")
    if given.env_dir is not None:
        _empty_or_new_dir(given.env_dir)
    for option, target in (("--json", given.json), ("--junit", given.junit)):
        if target is not None:
            check_writable(target, what=option)
    if os.environ.get("GITHUB_STEP_SUMMARY"):
        check_writable(os.environ["GITHUB_STEP_SUMMARY"], what="$GITHUB_STEP_SUMMARY",
                       append=True, make_folders=False)


def _promises(given: Options, ext, variant):
    """What the probe checks: the variant's promises, or what --expect-keys, --ops and
    --internal-ops say instead (``opforge.matrix.promises`` works out each op's keys)."""
    return promises(ext, variant, keys=given.expect_keys, ops=given.ops,
                    backward_ops=given.internal_ops)


def choose_installed(given: Options, env, request, choice: Choice):
    """A pending choice made from the build record installed in ``env``: the request with
    that variant's promises, and the choice (still pending when no record names a variant)."""
    # on the startup path: matrix.dist and the runner when a plan is made
    from opforge.matrix.dist import identify_record
    from opforge.smoke.runner import installed_build_record

    if not choice.pending:
        return request, choice
    matrix = load_matrix_of(given.file, required=True)
    record, distribution = installed_build_record(env, request.package)
    found = identify_record(matrix, record, distribution)
    if found is None:
        return request, choice
    variant, source = found
    request = request.promising(_promises(given, matrix.extension, variant))
    if not variant.device_checks and given.device_checks == "auto":
        request = replace(request, device_checks="skip")
    return request, Choice(variant.name, source)


def speed_spec(ext, mode: str) -> dict:
    """The probe's speed-check settings: the matrix's factors (10x when it has none)."""
    spec: dict = {"enabled": mode != "skip", "factor": ext.max_slowdown if ext else 10.0,
                  "op_factors": ext.slowdown_factors() if ext else {}}
    devices = os.environ.get("OPFORGE_SPEED_EXTRA_DEVICES", "")
    if devices:  # for tests on a machine without an accelerator (docs/adopt.md)
        spec["devices"] = [d.strip() for d in devices.split(",") if d.strip()]
    return spec
