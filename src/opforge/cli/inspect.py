"""``opforge inspect``: read a wheel without installing it."""

from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console
from rich.table import Table

from opforge import wheels
from opforge.matrix import load_matrix


def register(subparsers: argparse._SubParsersAction) -> None:
    i = subparsers.add_parser("inspect", help="read a wheel without installing it",
                              description="Show a wheel's tags, torch pin, build info, "
                                          "libraries and embedded CUDA architectures.")
    i.add_argument("wheel", help="path to a .whl")
    i.add_argument("--json", action="store_true", help="print JSON")
    i.add_argument("--expect-variant", metavar="NAME",
                   help="exit 1 if the wheel contradicts this matrix variant")
    i.add_argument("--file", metavar="PATH", help="matrix file for --expect-variant (default: "
                                                  "$OPFORGE_MATRIX, else found upwards)")
    i.set_defaults(func=run_inspect)


def run_inspect(args: argparse.Namespace) -> int:
    report = wheels.inspect_wheel(args.wheel)
    problems: list[str] = []
    if args.expect_variant:
        variant = load_matrix(args.file).variant(args.expect_variant)
        problems = wheels.check_against_variant(report, variant)
    if args.json:
        data = report.to_json()
        if args.expect_variant:
            data["expect_variant"] = args.expect_variant
            data["problems"] = problems
        print(json.dumps(data, indent=2))
    else:
        print_report(report, problems, args.expect_variant)
    return 1 if problems else 0


def print_report(report: wheels.WheelReport, problems: list[str], variant: str | None) -> None:
    console = Console(width=None if sys.stdout.isatty() else 120)
    table = Table(title=report.wheel, show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    info = report.build_info or {}
    table.add_row("distribution", f"{report.name} {report.version}")
    table.add_row("tags", ", ".join(report.tags))
    table.add_row("torch pin", report.torch_requirement or "(none)")
    table.add_row("built against", f"torch {info.get('torch_version', '?')} "
                                   f"({info.get('torch_git_version', '?')})")
    table.add_row("variant", str(info.get("variant", "?")))
    table.add_row("backends", ", ".join(info.get("backends") or []) or "?")
    table.add_row("CUDA", f"{info.get('cuda_version') or '-'}, arch list "
                          f"{info.get('cuda_arch_list') or '-'}")
    table.add_row("CUDA archs embedded", ", ".join(report.cuda_archs) or "-")
    table.add_row("Metal", f"sources: {len(report.metal_sources)}, metallibs: "
                           f"{len(report.metallibs)}, embedded: "
                           f"{any(lib.embedded_metal for lib in report.libraries)}")
    for lib in report.libraries:
        table.add_row(f"library {lib.path}", f"{lib.size / 1e6:.1f} MB; links "
                                             f"{', '.join(lib.needed) or '?'}")
    console.print(table)
    if variant:
        if problems:
            for problem in problems:
                console.print(f"[red]✗[/red] contradicts variant {variant}: {problem}")
        else:
            console.print(f"[green]✓[/green] consistent with variant {variant}")
