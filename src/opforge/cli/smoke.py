"""``opforge smoke``: prove every op has every kernel its variant promises, or say why not."""

from __future__ import annotations

import argparse
from dataclasses import fields
from pathlib import Path

from opforge.cli.args import comma_list
from opforge.smoke.plan import Options


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


def options_of(args: argparse.Namespace) -> Options:
    """The parsed arguments of `opforge smoke` or `opforge bench` as the smoke plan's options
    (an option the command does not take keeps its default; a list becomes a tuple)."""
    given = {f.name: getattr(args, f.name) for f in fields(Options) if hasattr(args, f.name)}
    return Options(**{name: tuple(value) if isinstance(value, list) else value
                      for name, value in given.items()})


def run(args: argparse.Namespace) -> int:
    # the application, imported when the command runs: not at startup (~15 ms)
    from opforge.smoke.app import run as run_smoke

    return run_smoke(options_of(args))
