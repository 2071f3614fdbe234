"""``opforge smoke``: prove every op has every kernel its variant promises, or say why not."""

from __future__ import annotations

import argparse
import json
import os
import re
import stat
import sys
from pathlib import Path

from opforge.errors import UsageError
from opforge.files import check_writable, lookup, open_problem, write_atomic
from opforge.matrix import BACKEND_KEYS

_KEY = re.compile(r"[A-Z][A-Za-z]*\Z")


def _csv(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "smoke", help="install a wheel in a fresh env and prove its ops and kernels work",
        description="Install the wheel (or requirement) in a fresh virtual environment the way a "
                    "user does, import it with a new interpreter outside the source tree, take a "
                    "census of every op x dispatch key, run each op on every present device, "
                    "under FakeTensorMode, torch.compile and autocast. Exit 0 pass, 1 fail, 2 usage.")
    add_target_arguments(p)
    p.add_argument("--expect-keys", type=_csv, metavar="K1,K2",
                   help="dispatch keys every op must have (overrides --variant)")
    p.add_argument("--ops", type=_csv, metavar="OP1,OP2",
                   help="ops that must exist (default: the matrix's, for the matrix's package)")
    p.add_argument("--internal-ops", type=_csv, metavar="OP1,OP2",
                   help="backward ops, checked against backend keys and Meta only")
    p.add_argument("--junit", type=Path, metavar="PATH", help="write JUnit XML here")
    p.add_argument("--json", type=Path, metavar="PATH", help="write the probe's JSON document here")
    p.add_argument("--device-checks", choices=("auto", "skip"), default="auto",
                   help="auto: run ops on every device that is present; skip: CPU only")
    p.add_argument("--compat", action="store_true",
                   help="torch compat matrix of a stable-ABI wheel: the one wheel beside each "
                        "torch of the variant's compat_torch list (or --compat-torch), each in "
                        "a fresh environment; the report is a table wheel x torch")
    p.add_argument("--compat-torch", type=_csv, metavar="V1,V2",
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


def _wheel_local_version(wheel: Path | None) -> str | None:
    if wheel is None:
        return None
    parts = wheel.name.split("-")
    return parts[1].split("+", 1)[1] if len(parts) > 2 and "+" in parts[1] else None


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
        from opforge.sessions import latest_wheel

        wheel = latest_wheel(matrix, matrix.variant(args.variant).name)
    variant = None
    variant_name = args.variant
    if variant_name is None and own:
        local = _wheel_local_version(wheel)
        by_label = {v.local_version: v.name for v in matrix.variants}  # +cpu.stable: cpu_stable
        if local and local.replace("_", ".") in by_label:
            variant_name = by_label[local.replace("_", ".")]
    if variant_name is not None:
        variant = matrix.variant(variant_name)
    for key in args.expect_keys or ():
        if not _KEY.match(key):
            raise UsageError(f"--expect-keys: {key!r} is not a dispatch key name "
                             "(e.g. CPU, CUDA, MPS, Meta, Autograd, AutocastCPU)")
    for op in (*(args.ops or ()), *(args.internal_ops or ())):
        if not op.isidentifier():
            raise UsageError(f"{op!r} is not an operator name")

    def promises(v) -> dict:
        """op -> keys, backward ops and default keys, for variant ``v`` (None: no variant)."""
        default = tuple(args.expect_keys) if args.expect_keys is not None else \
            (v.expected_keys if v else ())
        forward = args.ops if args.ops is not None else (ext.ops if own else ())
        backward = args.internal_ops if args.internal_ops is not None else \
            (ext.internal_ops if own else ())
        specs = {op.name: op for op in ext.op_specs} if own else {}
        op_keys = {}
        for op in (*forward, *backward):
            if args.expect_keys is None and v is not None and op in specs:
                op_keys[op] = specs[op].expected_keys(v)
            elif op in backward:
                op_keys[op] = tuple(k for k in default if k in BACKEND_KEYS or k == "Meta")
            else:
                op_keys[op] = default
        modules = [{"name": m.name, "backend": m.backend, "load": m.load,
                    "functions": list(m.functions)} for m in ext.modules_for(v)] \
            if own and v is not None else []
        return {"op_keys": op_keys, "backward_ops": tuple(backward), "default_keys": default,
                "modules": modules}

    chosen = promises(variant)
    device_checks = args.device_checks
    if variant is not None and not variant.device_checks and device_checks == "auto":
        device_checks = "skip"
    channel_index = matrix.torch_index(variant) if (matrix and variant) else None
    index = resolve_index(channel_index, args.torch_index)
    # our own package with no variant named: the probe takes the one its build record names
    variants = {}
    if own and variant is None and args.expect_keys is None:
        for v in matrix.variants:
            p = promises(v)
            variants[v.name] = {"op_keys": {k: list(x) for k, x in p["op_keys"].items()},
                                "backward_ops": list(p["backward_ops"]),
                                "default_keys": list(p["default_keys"]),
                                "modules": p["modules"]}
        chosen = {"op_keys": {}, "backward_ops": (), "default_keys": (), "modules": []}
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
    request = ProbeRequest(package=package, namespace=namespace, op_keys=chosen["op_keys"],
                           backward_ops=tuple(chosen["backward_ops"]),
                           default_keys=tuple(chosen["default_keys"]),
                           device_checks=device_checks, variants=variants, recipes=recipes,
                           speed=speed_spec(ext if own else None, args.speed_check),
                           modules=tuple(chosen["modules"]))
    return target, request, variant_name


def speed_spec(ext, mode: str) -> dict:
    """The probe's speed-check settings: the matrix's factors (10x when it has none)."""
    spec: dict = {"enabled": mode != "skip", "factor": ext.max_slowdown if ext else 10.0,
                  "op_factors": ext.slowdown_factors() if ext else {}}
    devices = os.environ.get("OPFORGE_SPEED_EXTRA_DEVICES", "")
    if devices:  # for tests on a machine without an accelerator (docs/adopt.md)
        spec["devices"] = list(_csv(devices))
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
    target, request, variant = resolve(args)
    if args.compat or args.compat_torch:
        return run_compat(args, target, request, variant)
    if request.default_keys:
        expecting = f", expecting {','.join(request.default_keys)}"
        if any(keys != request.default_keys for keys in request.op_keys.values()):
            expecting += " (some ops their own keys)"
    elif request.variants:
        expecting = ", expected keys from the variant the installed build info names"
    else:
        expecting = ", no expected keys (census is informational; pass --variant or --expect-keys)"
    print(f"opforge smoke: {target.describe()}" + (f", variant {variant}" if variant else "")
          + expecting, file=sys.stderr, flush=True)
    env = prepare_environment(target)
    try:
        doc = run_probe(env, request)
    finally:
        cleanup(env, keep=args.keep_env)
    if variant:
        doc["variant"] = variant
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
    if matrix is not None and matrix.variant(variant).cuda:
        from opforge.smoke.runner import device_code_cause

        device_code_cause(doc, target.wheel, matrix.variant(variant).arch_list or "", variant)
    if request.variants and not doc.get("variant"):
        # neither the arguments nor the build record named a variant: nothing was promised
        add_check(doc, "variant", "warn", f"{request.package} names no variant of "
                  f"{', '.join(request.variants)} in its build record, so no kernel was "
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


def run_compat(args: argparse.Namespace, target, request, variant: str | None) -> int:
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
    rows = compat.run_compat(target, request, torches, keep_env=args.keep_env,
                             log=lambda line: print(line, file=sys.stderr, flush=True),
                             nightly_index=nightly)
    doc = compat.combined(rows, what)
    if variant:
        doc["variant"] = variant
    compat.render(rows, what)
    return emit(args, doc)
