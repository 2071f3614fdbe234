"""``opforge matrix``: show the expanded build jobs (table, JSON, or GitHub's strategy.matrix)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from rich.console import Console
from rich.table import Table

from opforge.errors import OpforgeError, UsageError
from opforge.files import check_writable
from opforge.matrix import Matrix, build_jobs, compat_jobs, load_matrix

STAGES = ("cells", "builds", "compat")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("matrix", help="show the build jobs matrix.yaml expands to",
                              description="Show the build jobs matrix.yaml expands to.")
    p.add_argument("--file", metavar="PATH", help="matrix file (default: ./matrix.yaml)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print the jobs as a JSON list")
    out.add_argument("--github", action="store_true",
                     help='print {"include": [...]} for strategy.matrix; also written to '
                          "$GITHUB_OUTPUT as matrix=... when that is set")
    p.add_argument("--variant", metavar="NAME[,NAME...]",
                   help="only these variants (comma-separated; empty: all)")
    p.add_argument("--platform", metavar="NAME[,NAME...]",
                   help="only these platforms (e.g. linux-x86_64; empty: all)")
    p.add_argument("--python", metavar="X.Y[,X.Y...]",
                   help="only these Python versions (empty: all)")
    p.add_argument("--pull-request", action="store_true",
                   help="trim to one Python per variant (matrix.yaml's pr_python)")
    p.add_argument("--stage", choices=STAGES, default="cells",
                   help="cells: every smoke cell (default); builds: the cells that compile (a "
                        "stable-ABI variant once per platform); compat: one torch-compat cell "
                        "per stable variant and platform. --github writes all three to "
                        "$GITHUB_OUTPUT (matrix=, builds=, compat=)")
    p.add_argument("--check", action="store_true", help="only validate the file")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    output = os.environ.get("GITHUB_OUTPUT") if args.github else None
    if output:
        check_writable(output, what="$GITHUB_OUTPUT", append=True, make_folders=False)
    matrix = load_matrix(args.file)
    filters = dict(variant=_listed(args.variant), platform=_listed(args.platform),
                   python=_listed(args.python))
    jobs = select_jobs(matrix, pull_request=args.pull_request, **filters)
    if not jobs:
        # an empty strategy.matrix fails the next GitHub job with a far vaguer message
        given = " ".join(f"--{k} {','.join(v)}" for k, v in filters.items() if v) + \
            (" --pull-request" if args.pull_request else "")
        raise UsageError(f"no job in {matrix.path.name} matches {given.strip()}")
    if args.check:
        filtered = any(filters.values()) or args.pull_request
        print(f"{matrix.path}: ok ({len(matrix.variants)} variants, {len(jobs)} jobs"
              + (" match the filters)" if filtered else ")"))
        return 0
    staged = {"cells": jobs, "builds": build_jobs(jobs, matrix.pr_python),
              "compat": compat_jobs(jobs, matrix.pr_python)}
    jobs = staged[args.stage]
    if args.github:
        payloads = {stage: json.dumps({"include": [job.as_dict() for job in cells]},
                                      separators=(",", ":")) for stage, cells in staged.items()}
        print(payloads[args.stage])
        if output:
            # an empty strategy.matrix is an error on GitHub: has_compat guards the compat job
            lines = [f"matrix={payloads['cells']}", f"builds={payloads['builds']}",
                     f"compat={payloads['compat']}",
                     f"has_compat={'true' if staged['compat'] else 'false'}"]
            try:
                with open(output, "a", encoding="utf-8") as fh:
                    fh.write("\n".join(lines) + "\n")
            except OSError as exc:
                raise OpforgeError(f"$GITHUB_OUTPUT {output}: cannot write: "
                                   f"{exc.strerror or exc}") from None
        return 0
    if args.json:
        print(json.dumps([job.as_dict() for job in jobs], indent=2))
        return 0
    print_table(matrix, jobs)
    return 0


def _listed(value: str | None) -> list[str]:
    """``a,b`` -> [a, b]; None or empty (a workflow input left empty) -> [] (no filter)."""
    return [part.strip() for part in (value or "").split(",") if part.strip()]


def select_jobs(matrix: Matrix, variant: list[str], platform: list[str], python: list[str],
                pull_request: bool = False) -> list:
    """The matrix's jobs in its own order, kept when they match one value of each filter."""
    for values, name in ((variant, "variant"), (platform, "platform"), (python, "python")):
        for value in values:  # an unknown name is an error (exit 2), as with one value
            matrix.jobs(**{name: value})
    return [job for job in matrix.jobs(pull_request=pull_request)
            if (not variant or job.variant.name in variant)
            and (not platform or job.platform.name in platform)
            and (not python or job.python in python)]


def print_table(matrix: Matrix, jobs: list, console: Console | None = None) -> None:
    """The jobs as a table: a job name is never cut (it is what a user types, and the job's
    name on GitHub); the other columns wrap to fit a terminal. Piped, a row is one line."""
    console = console or Console(width=None if sys.stdout.isatty() else 100_000)
    table = Table(title=f"{matrix.path.name}: {len(jobs)} jobs "
                        f"(torch {matrix.torch.channel} {matrix.torch.version})")
    longest = max((len(job.name) for job in jobs), default=3)
    table.add_column("job", no_wrap=True, min_width=longest, overflow="fold")
    for column in ("runner", "container", "backend / archs", "torch", "index", "abi",
                   "expected keys"):
        # fold: a long word goes on the next line rather than ending in an ellipsis
        table.add_column(column, overflow="fold")
    builders = {job.name for job in build_jobs(jobs, matrix.pr_python)}
    for job in jobs:
        v = job.variant
        arch_list = v.option("arch_list")
        archs = ("-" if v.backend == "cpu" else
                 " ".join(p for p in (v.backend, v.toolkit, arch_list and f"/ {arch_list}") if p))
        index = job.torch_index.removeprefix(matrix.torch.index.rstrip("/"))
        abi = "legacy" if not v.stable else \
            f"abi3 torch>={v.torch_floor}" + (" (builds)" if job.name in builders else "")
        table.add_row(job.name, job.runner, job.container or "-", archs, job.torch_spec,
                      index, abi, ", ".join(v.expected_keys))
    console.print(table)
