"""``opforge workflows check``: hold a repository's GitHub workflows to matrix.yaml and the
CI hygiene rules (see opforge.workflows for each rule)."""

from __future__ import annotations

import argparse
import stat
import sys
from pathlib import Path

from opforge.errors import UsageError
from opforge.files import lookup


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "workflows", help="check a repository's GitHub workflows",
        description="Check .github/workflows: drift from matrix.yaml and the CI hygiene rules.")
    actions = p.add_subparsers(dest="action", metavar="ACTION", parser_class=type(p))
    actions.required = True
    c = actions.add_parser(
        "check", help="print one file:line line per problem; exit 1 if there is any",
        description="Check .github/workflows against matrix.yaml and the hygiene rules: "
                    "reusable workflows pinned by commit, opforge installed pinned (never "
                    "`pip install .` outside opforge's repository), actions pinned, read-only "
                    "permissions, every variant built and smoke-tested. Prints one "
                    "'file:line: where: what' line per problem; exit 1 if there is any, 2 "
                    "when the matrix or the arguments are bad.")
    c.add_argument("--root", type=Path, default=Path("."), metavar="PATH",
                   help="the repository (default: the working directory)")
    c.add_argument("--file", type=Path, metavar="PATH",
                   help="matrix file (default: matrix.yaml in the repository, if there is one)")
    c.add_argument("--all", dest="every", action="store_true",
                   help="check every workflow, not only those that use opforge")
    c.set_defaults(func=run_check)


def run_check(args: argparse.Namespace) -> int:
    # the workflow checks (~35 ms), imported when the command runs: not at startup
    from opforge.workflows import WORKFLOW_DIR

    root = args.root
    info = lookup(root, what="--root")
    if info is None or not stat.S_ISDIR(info.st_mode):
        raise UsageError(f"--root {root}: no such directory")
    folder = lookup(root / WORKFLOW_DIR, what="--root")
    if folder is None or not stat.S_ISDIR(folder.st_mode):
        raise UsageError(f"no {WORKFLOW_DIR.as_posix()} in {root} (--root names the "
                         "repository)")
    matrix = args.file
    if matrix is not None and not matrix.is_absolute() and not matrix.exists():
        matrix = root / matrix
    # the workflow checks, imported when the command runs: not at startup
    from opforge.workflows import check_repository
    from opforge.workflows.project import subcommand_parsers

    # the parser main() parsed with (opforge.cli sets it): the steps' opforge commands are
    # parsed by it; importing opforge.cli here would close a circle
    result = check_repository(root, matrix, args.every,
                              commands=subcommand_parsers(args.command_parser))
    for problem in result.problems:
        print(problem)
    skipped = f"; not using opforge, not checked: {', '.join(result.skipped)}" \
        if result.skipped else ""
    if result.problems:
        print(f"opforge workflows check: {len(result.problems)} problem(s) in "
              f"{len(result.checked)} workflow(s){skipped}", file=sys.stderr)
        return 1
    print(f"opforge workflows check: ok ({len(result.checked)} workflow(s){skipped})",
          file=sys.stderr)
    return 0
