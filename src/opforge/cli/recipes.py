"""``opforge recipes --derive``: write a working call into each stub recipe."""

from __future__ import annotations

import argparse
from pathlib import Path

from opforge.cli.args import comma_list
from opforge.errors import UsageError


def _positive(kind):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"{text!r} must be above 0")
        return value
    return parse


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "recipes", help="derive a working call for each stub recipe (--derive)",
        description="--derive: for every stub recipe of the recipes file (\"stub\": True, as "
                    "`opforge init` writes them), search a call the op accepts: from its "
                    "schema, argument names and the scan's hints, refined by the op's own "
                    "error messages, each try on the CPU of the environment under test, twice, "
                    "with a time limit. A call found replaces the stub as a plain recipe marked "
                    "\"derived\": True; recipes you wrote are left alone. Prints one row per op "
                    "and 'N of M ops got a working call'. Exit 0 when done (an op with no "
                    "working call stays a stub, with a comment), 2 on bad input.")
    p.add_argument("--derive", action="store_true", required=True,
                   help="derive the stub recipes' calls (the one action for now)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--variant", help="install the variant's wheel from dist/VARIANT in a "
                                       "fresh environment")
    src.add_argument("--wheel", type=Path, help="install this wheel in a fresh environment")
    src.add_argument("--python", type=Path, metavar="PATH",
                     help="call the ops in this interpreter's environment (installs nothing)")
    p.add_argument("--ops", type=comma_list, metavar="OP1,OP2",
                   help="only these stubs (op names, or FUNCTIONS keys)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the table and the change to the recipes file; write nothing")
    p.add_argument("--tries", type=_positive(int), default=40, metavar="N",
                   help="calls tried per op at most (default 40)")
    p.add_argument("--timeout", type=_positive(float), default=30.0, metavar="S",
                   help="seconds one trial call may take before it counts as hung (default 30)")
    p.add_argument("--recipes", type=Path, metavar="FILE",
                   help="the recipes file (default: the matrix's extension.recipes)")
    p.add_argument("--torch-index", help="index for torch in a fresh environment (default: "
                                         "$OPFORGE_TORCH_INDEX, else the variant's)")
    p.add_argument("--file", "--matrix", dest="file", type=Path, metavar="FILE",
                   help="matrix file (default: $OPFORGE_MATRIX, else matrix.yaml found from "
                        "the working directory upwards)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # the application, imported when the command runs: not at startup (~40 ms)
    from opforge.recipes import app

    if not (args.variant or args.wheel or args.python):
        raise UsageError("--derive calls the ops where the package is installed: give "
                         "--variant V (its wheel from dist/V), --wheel PATH or --python PATH")
    if args.wheel is not None and (args.wheel.suffix != ".whl" or not args.wheel.is_file()):
        raise UsageError(f"--wheel {args.wheel}: not a .whl file")
    if args.python is not None and not args.python.is_file():
        raise UsageError(f"--python {args.python}: no such interpreter")
    if args.recipes is not None and not args.recipes.is_file():
        raise UsageError(f"--recipes {args.recipes}: no such file")
    return app.run(app.Request(
        matrix=args.file, recipes=args.recipes, variant=args.variant, wheel=args.wheel,
        python=args.python, torch_index=args.torch_index, ops=args.ops, dry_run=args.dry_run,
        limits=app.Limits(tries=args.tries), call_timeout=args.timeout))
