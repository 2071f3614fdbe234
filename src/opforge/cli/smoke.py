"""``opforge smoke``: prove every op has every kernel its variant promises, or say why not."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from opforge.cli.args import comma_list
from opforge.errors import UsageError
from opforge.files import write_atomic
from opforge.progress import say
from opforge.smoke.plan import (
    Choice,
    choose_installed,
    load_matrix_of,
    resolve_choice,
)


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
    matrix = load_matrix_of(args.file, required=False) if variant and target.wheel else None
    if matrix is not None:
        from opforge.smoke.runner import device_code_cause

        device_code_cause(doc, target.wheel, matrix.variant(variant))
    if choice.pending:
        # neither the arguments nor the build record named a variant: nothing was promised
        names = [v.name for v in load_matrix_of(args.file, required=True).variants]
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
    matrix = load_matrix_of(args.file, required=True)
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

        matrix = load_matrix_of(args.file, required=variant is not None)
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
