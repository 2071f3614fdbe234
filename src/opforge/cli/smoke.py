"""``opforge smoke``: prove every op has every kernel its variant promises, or say why not."""

from __future__ import annotations

import argparse
import json
import os
import re
import stat
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from opforge.cli.args import comma_list
from opforge.errors import UsageError
from opforge.files import check_writable, lookup, open_problem, write_atomic
from opforge.progress import say

_KEY = re.compile(r"[A-Z][A-Za-z]*\Z")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "smoke", help="install a wheel in a fresh env and prove its ops and kernels work",
        description="Install the wheel (or requirement) in a fresh virtual environment the way a "
                    "user does, import it with a new interpreter outside the source tree, take a "
                    "census of every op x dispatch key, run each op on every present device, "
                    "under FakeTensorMode, torch.compile and autocast. Exit 0 pass, 1 fail, 2 usage.")
    add_target_arguments(p)
    p.add_argument("--expect-keys", type=comma_list, metavar="K1,K2",
                   help="dispatch keys every op must have (overrides --variant)")
    p.add_argument("--ops", type=comma_list, metavar="OP1,OP2",
                   help="ops that must exist (default: the matrix's, for the matrix's package)")
    p.add_argument("--internal-ops", type=comma_list, metavar="OP1,OP2",
                   help="backward ops, checked against backend keys and Meta only")
    p.add_argument("--junit", type=Path, metavar="PATH", help="write JUnit XML here")
    p.add_argument("--json", type=Path, metavar="PATH", help="write the probe's JSON document here")
    p.add_argument("--device-checks", choices=("auto", "skip"), default="auto",
                   help="auto: run ops on every device that is present; skip: CPU only")
    p.add_argument("--compat", action="store_true",
                   help="torch compat matrix of a stable-ABI wheel: the one wheel beside each "
                        "torch of the variant's compat_torch list (or --compat-torch), each in "
                        "a fresh environment; the report is a table wheel x torch")
    p.add_argument("--compat-torch", type=comma_list, metavar="V1,V2",
                   help="the torches for --compat: releases (2.13.0), floor / matrix (the "
                        "stable variant's floor / build torch), latest (the newest the index "
                        "serves) or nightly; replaces the variant's list")
    p.add_argument("--speed-check", choices=("auto", "skip"), default="auto",
                   help="auto: fail a device kernel far slower than the same op on this "
                        "machine's CPU (matrix.yaml: extension.max_slowdown, default 10x); "
                        "skip: do not time")
    p.set_defaults(func=run)


def add_target_arguments(p) -> None:
    """What to install and probe, and where: shared by `opforge smoke` and `opforge bench`."""
    src = p.add_mutually_exclusive_group()
    src.add_argument("--wheel", type=Path, help="wheel file to install (pip install WHEEL)")
    src.add_argument("--requirement", metavar="REQ", help="requirement to install, e.g. torchvision==0.29.1")
    src.add_argument("--python", type=Path, metavar="PATH",
                     help="probe this existing interpreter's environment instead (installs nothing)")
    p.add_argument("--package", help="import name (default: the matrix's extension package)")
    p.add_argument("--namespace", help="torch.ops namespace (default: the matrix's)")
    p.add_argument("--variant", help="take the expected keys from this matrix.yaml variant "
                                     "(default: the wheel's local version, e.g. +cpu)")
    p.add_argument("--torch", dest="torch_spec", metavar="SPEC",
                   help="install this torch beside the wheel (wheel with --no-deps), "
                        "e.g. torch==2.14.1, to test ABI drift")
    p.add_argument("--torch-index", help="index for torch: URL, file://, local dir or 'pypi' "
                                         "(default: $OPFORGE_TORCH_INDEX, else the variant's)")
    p.add_argument("--keep-env", action="store_true", help="keep the fresh environment")
    p.add_argument("--env-dir", type=Path, help="create the fresh environment here")
    p.add_argument("--recipes", type=Path, metavar="FILE",
                   help="recipes file saying how to call each op (default: the matrix's "
                        "extension.recipes, for the matrix's package)")
    p.add_argument("--file", "--matrix", dest="file", type=Path, metavar="FILE",
                   help="matrix file (default: $OPFORGE_MATRIX, else matrix.yaml found from "
                        "the working directory upwards)")


def _load_matrix(path: Path | None, required: bool):
    from opforge.errors import OpforgeError
    from opforge.matrix import load_matrix

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


def resolve(args: argparse.Namespace):
    """Arguments + matrix -> (Target, ProbeRequest, variant name or None)."""
    target, request, choice = resolve_choice(args)
    return target, request, choice.variant


def resolve_choice(args: argparse.Namespace):
    """Arguments + matrix -> (Target, ProbeRequest, Choice): the request carries the promises
    of the variant under test only (none yet while the choice is pending)."""
    from opforge.smoke.runner import ProbeRequest, Target
    from opforge.torchsource import resolve_index

    if not (args.wheel or args.requirement or args.python or args.variant):
        raise UsageError("give --variant V (its wheel from dist/V), --wheel PATH, "
                         "--requirement REQ or --python PATH")
    if args.wheel is not None and args.wheel.suffix != ".whl":
        raise UsageError(f"--wheel {args.wheel}: not a .whl file")
    if args.wheel is not None:
        _regular_file(args.wheel, "--wheel")
    if args.python is not None:
        _interpreter(args.python)
    if args.python is not None and (args.torch_spec or args.keep_env or args.env_dir):
        raise UsageError("--torch, --keep-env and --env-dir apply to a fresh environment, "
                         "not --python")
    if args.recipes is not None:
        _regular_file(args.recipes, "--recipes")
    if args.env_dir is not None:
        _empty_or_new_dir(args.env_dir)
    for option, target in (("--json", args.json), ("--junit", args.junit)):
        if target is not None:
            check_writable(target, what=option)
    if os.environ.get("GITHUB_STEP_SUMMARY"):
        check_writable(os.environ["GITHUB_STEP_SUMMARY"], what="$GITHUB_STEP_SUMMARY",
                       append=True, make_folders=False)
    needs_matrix = (args.variant is not None or args.package is None or args.namespace is None
                    or args.file is not None)
    matrix = _load_matrix(args.file, required=needs_matrix)
    ext = matrix.extension if matrix else None
    package = args.package or ext.package
    namespace = args.namespace or ext.namespace
    for what, value in (("--package", package), ("--namespace", namespace)):
        if not value.replace(".", "_").isidentifier():
            raise UsageError(f"{what} {value!r} is not an identifier")
    own = ext is not None and package == ext.package

    wheel = args.wheel
    if not (wheel or args.requirement or args.python):
        from opforge.matrix.dist import latest_wheel

        wheel = latest_wheel(matrix, matrix.variant(args.variant).name)
    variant = None
    choice = Choice()
    if args.variant is not None:
        variant = matrix.variant(args.variant)
        choice = Choice(variant.name)
    elif own:
        from opforge.matrix.dist import identify_wheel

        found = identify_wheel(matrix, wheel) if wheel is not None else None
        if found is not None:
            variant = found[0]
            choice = Choice(variant.name, found[1])
        elif args.expect_keys is None:
            choice = Choice(pending=True)
    for key in args.expect_keys or ():
        if not _KEY.match(key):
            raise UsageError(f"--expect-keys: {key!r} is not a dispatch key name "
                             "(e.g. CPU, CUDA, MPS, Meta, Autograd, AutocastCPU)")
    for op in (*(args.ops or ()), *(args.internal_ops or ())):
        if not op.isidentifier():
            raise UsageError(f"{op!r} is not an operator name")

    chosen = _promises(args, ext if own else None, variant)
    device_checks = args.device_checks
    if variant is not None and not variant.device_checks and device_checks == "auto":
        device_checks = "skip"
    channel_index = matrix.torch_index(variant) if (matrix and variant) else None
    index = resolve_index(channel_index, args.torch_index)
    if choice.pending:  # nothing is promised until the installed build record names a variant
        from opforge.matrix import Promises

        chosen = Promises()
    recipes = args.recipes
    if recipes is None and own and ext.recipes:
        recipes = matrix.path.parent / ext.recipes
        if not recipes.is_file():
            raise UsageError(f"{matrix.path.name}: extension.recipes {ext.recipes!r}: no such "
                             f"file in {matrix.path.parent}")
    variant_torch = matrix.torch_spec(variant) \
        if (variant is not None and wheel is not None and not args.torch_spec) else None
    target = Target(wheel=wheel, requirement=args.requirement, python=args.python,
                    torch_spec=args.torch_spec, torch_index=index, env_dir=args.env_dir,
                    variant_torch=variant_torch)
    request = ProbeRequest(package=package, namespace=namespace, device_checks=device_checks,
                           recipes=recipes,
                           speed=speed_spec(ext if own else None, args.speed_check))
    return target, request.promising(chosen), choice


def _promises(args: argparse.Namespace, ext, variant):
    """What the probe checks: the variant's promises, or what --expect-keys, --ops and
    --internal-ops say instead (``opforge.matrix.promises`` works out each op's keys)."""
    from opforge.matrix import promises

    return promises(ext, variant, keys=args.expect_keys, ops=args.ops,
                    backward_ops=args.internal_ops)


def choose_installed(args: argparse.Namespace, env, request, choice: Choice):
    """A pending choice made from the build record installed in ``env``: the request with
    that variant's promises, and the choice (still pending when no record names a variant)."""
    from opforge.matrix.dist import identify_record
    from opforge.smoke.runner import installed_build_record

    if not choice.pending:
        return request, choice
    matrix = _load_matrix(args.file, required=True)
    record, distribution = installed_build_record(env, request.package)
    found = identify_record(matrix, record, distribution)
    if found is None:
        return request, choice
    variant, source = found
    request = request.promising(_promises(args, matrix.extension, variant))
    if not variant.device_checks and args.device_checks == "auto":
        request = replace(request, device_checks="skip")
    return request, Choice(variant.name, source)


def speed_spec(ext, mode: str) -> dict:
    """The probe's speed-check settings: the matrix's factors (10x when it has none)."""
    spec: dict = {"enabled": mode != "skip", "factor": ext.max_slowdown if ext else 10.0,
                  "op_factors": ext.slowdown_factors() if ext else {}}
    devices = os.environ.get("OPFORGE_SPEED_EXTRA_DEVICES", "")
    if devices:  # for tests on a machine without an accelerator (docs/adopt.md)
        spec["devices"] = list(comma_list(devices))
    return spec


def run(args: argparse.Namespace) -> int:
    from opforge.smoke import report
    from opforge.smoke.runner import (
        add_check,
        cleanup,
        prepare_environment,
        run_probe,
        torch_mismatch,
    )

    if args.compat_torch is not None and not args.compat_torch:
        raise UsageError("--compat-torch '': name at least one torch (2.13.0, floor, matrix, "
                         "latest, nightly), or leave the option out")
    target, request, choice = resolve_choice(args)
    variant = choice.variant
    if args.compat or args.compat_torch:
        return run_compat(args, target, request, variant, choice)
    if request.default_keys:
        expecting = f", expecting {','.join(request.default_keys)}"
        if any(keys != request.default_keys for keys in request.op_keys.values()):
            expecting += " (some ops their own keys)"
    elif choice.pending:
        expecting = ", expected keys from the variant the installed build info names"
    else:
        expecting = ", no expected keys (census is informational; pass --variant or --expect-keys)"
    say(f"opforge smoke: {target.describe()}" + (f", variant {variant}" if variant else "")
        + expecting)
    env = prepare_environment(target)
    try:
        request, choice = choose_installed(args, env, request, choice)
        variant = choice.variant
        doc = run_probe(env, request)
    finally:
        cleanup(env, keep=args.keep_env)
    if variant:
        doc["variant"] = variant
        if choice.source:
            doc["variant_source"] = choice.source
    mismatch = torch_mismatch(target.variant_torch, env.torch_installed)
    if mismatch:
        add_check(doc, "torch-variant", "fail", mismatch, category="environment")
        if not any(c["class"] == "wrong_torch" for c in doc.get("causes") or []):
            from opforge.smoke.probe.causes import add_cause

            add_cause(doc, "wrong_torch", "the environment's torch is not the variant's",
                      [mismatch], f"install {target.variant_torch} (the matrix's torch for "
                      f"{variant}) before the wheel, or fix the wheel's torch pin",
                      explains=["torch-variant"])
    matrix = _load_matrix(args.file, required=False) if variant and target.wheel else None
    if matrix is not None:
        from opforge.smoke.runner import device_code_cause

        device_code_cause(doc, target.wheel, matrix.variant(variant))
    if choice.pending:
        # neither the arguments nor the build record named a variant: nothing was promised
        names = [v.name for v in _load_matrix(args.file, required=True).variants]
        add_check(doc, "variant", "warn", f"{request.package} names no variant of "
                  f"{', '.join(names)} in its build record, so no kernel was "
                  "required: pass --variant", category="environment")
    report.render_terminal(doc)
    if args.keep_env and env.env_dir:
        print(f"environment kept at {env.env_dir} (python: {env.python})", file=sys.stderr)
    return emit(args, doc)


def emit(args: argparse.Namespace, doc: dict) -> int:
    """The report's files (--json, --junit) and the GitHub summary; the exit code."""
    from opforge.smoke import report

    if args.json:
        write_atomic(args.json, json.dumps(doc, indent=1) + "\n")
    if args.junit:
        report.write_junit(doc, args.junit)
    report.publish_github(doc)
    return report.exit_code(doc)


def compat_torches(args: argparse.Namespace, variant: str | None) -> list[str]:
    """--compat-torch, else the variant's compat_torch list (its words resolved)."""
    from packaging.version import InvalidVersion, Version

    from opforge.matrix import COMPAT_WORDS

    if args.compat_torch:
        for entry in args.compat_torch:
            if entry in COMPAT_WORDS:
                continue
            try:
                Version(entry)
            except InvalidVersion:
                raise UsageError(f"--compat-torch: {entry!r} is not a torch release (2.13.0) "
                                 f"nor one of {', '.join(COMPAT_WORDS)}") from None
        words = [e for e in args.compat_torch if e in COMPAT_WORDS[:2]]  # floor, matrix
        if not words:
            return list(dict.fromkeys(args.compat_torch))
        if variant is None:
            raise UsageError(f"--compat-torch: {words[0]!r} is the floor or build torch of a "
                             "stable variant: give --variant V")
    elif variant is None:
        raise UsageError("--compat needs --variant V (a stable-ABI variant: its compat_torch "
                         "list) or --compat-torch V1,V2")
    matrix = _load_matrix(args.file, required=True)
    v = matrix.variant(variant)
    if not v.stable:
        if args.compat_torch:
            raise UsageError(f"--compat-torch: floor and matrix name a stable variant's "
                             f"torches; {variant!r} is abi: {v.abi}")
        raise UsageError(f"--compat: variant {variant!r} is abi: {v.abi}; its wheel pins one "
                         "torch. A torch compat matrix needs abi: stable (or --compat-torch)")
    return matrix.compat_torches(v, args.compat_torch or None)


def run_compat(args: argparse.Namespace, target, request, variant: str | None,
               choice: Choice | None = None) -> int:
    from opforge.smoke import compat

    if target.python is not None:
        raise UsageError("--compat installs the wheel beside each torch in fresh environments; "
                         "give --wheel or --variant, not --python")
    if args.torch_spec or args.env_dir:
        raise UsageError("--compat chooses each environment's torch: drop --torch / --env-dir")
    torches = compat_torches(args, variant)
    what = target.wheel.name if target.wheel else target.requirement
    print(f"opforge smoke --compat: {what} beside torch {', '.join(torches)}", file=sys.stderr,
          flush=True)
    nightly = None
    if "nightly" in torches:
        from opforge.torchsource import resolve_index

        matrix = _load_matrix(args.file, required=variant is not None)
        channel = matrix.nightly_index(matrix.variant(variant)) if matrix and variant else None
        nightly = resolve_index(channel, args.torch_index)
    # a variant only the installed build record names is chosen in each environment
    choose = (lambda env, req: choose_installed(args, env, req, choice)[0]) \
        if choice is not None and choice.pending else None
    rows = compat.run_compat(target, request, torches, keep_env=args.keep_env, choose=choose,
                             log=lambda line: print(line, file=sys.stderr, flush=True),
                             nightly_index=nightly)
    doc = compat.combined(rows, what)
    if variant:
        doc["variant"] = variant
    compat.render(rows, what)
    return emit(args, doc)
