"""``opforge inspect``: read a wheel without installing it."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from opforge import floor, variants, wheel_checks, wheels
from opforge.errors import UsageError
from opforge.matrix import load_matrix


def register(subparsers: argparse._SubParsersAction) -> None:
    i = subparsers.add_parser("inspect", help="read a wheel without installing it",
                              description="Show a wheel's tags, torch pin, build info, "
                                          "libraries, embedded CUDA architectures and each "
                                          "library's ABI audit (stable shim / libtorch C++ / "
                                          "CPython / CUDA runtime symbols, minimum torch). "
                                          "Exit 1 when the audit contradicts what the wheel "
                                          "declares (abi3 tag, torch>=floor) or the variant. "
                                          "A wheel variant (PEP 825 draft) shows its label "
                                          "and properties, checked against its build record "
                                          "(and --expect-variant): a FAIL line and exit 1 "
                                          "when they disagree.")
    i.add_argument("wheel", help="path to a .whl")
    i.add_argument("--json", action="store_true", help="print JSON")
    i.add_argument("--expect-variant", metavar="NAME",
                   help="exit 1 if the wheel contradicts this matrix variant")
    i.add_argument("--file", metavar="PATH", help="matrix file for --expect-variant (default: "
                                                  "$OPFORGE_MATRIX, else found upwards)")
    i.add_argument("--torch-wheel", metavar="PATH_OR_NAME",
                   help="take torch's floor from this torch wheel's platform tag (a file name "
                        "is enough) instead of opforge's table of PyTorch's wheels")
    i.add_argument("--allow-host-floor", action="store_true",
                   help="accept a wheel that needs a newer glibc / macOS than its torch (built "
                        "on this host, for local use only: it is not a wheel to publish)")
    i.set_defaults(func=run_inspect)


def run_inspect(args: argparse.Namespace) -> int:
    if args.file and not args.expect_variant:
        raise UsageError("--file names the matrix for --expect-variant; give --expect-variant")
    matrix = load_matrix(args.file) if args.expect_variant else None
    variant = matrix.variant(args.expect_variant) if matrix else None
    report = wheels.inspect_wheel(args.wheel)
    problems = wheel_checks.check_against_variant(report, variant, matrix.pythons) if variant \
        else report.abi_problems()
    system = floor_check(report, args.torch_wheel, args.allow_host_floor)
    problems += system.problems
    found = variants.read_variant(Path(args.wheel))
    variant_problems = variants.check_variant_wheel(Path(args.wheel), variant) if found else []
    if args.json:
        data = report.to_json()
        if found is not None:
            data["wheel_variant"] = {"label": found.label or variants.NULL_LABEL,
                                     "plain_copy": found.label is None,
                                     "properties": list(found.properties),
                                     "providers": found.providers,
                                     "build_record": found.declared,
                                     "problems": variant_problems}
        if args.expect_variant:
            data["expect_variant"] = args.expect_variant
        data["floor"] = {"needed": system.needed, "torch": system.torch, "notes": system.notes}
        data["problems"] = problems + [f"wheel variant: {p}" for p in variant_problems]
        print(json.dumps(data, indent=2))
    else:
        print_report(report, problems, args.expect_variant, system, found, variant_problems)
    return 1 if problems or variant_problems else 0


def floor_check(report: wheels.WheelReport, torch_wheel: str | None = None,
                allow_host: bool = False) -> floor.FloorCheck:
    """The wheel's floor (glibc / libstdc++ / macOS) against its tags and its torch's."""
    info = report.build_info if report.build_info and "error" not in report.build_info else {}
    target = info.get("macos_deployment_target")
    return floor.check(report.libraries, report.tags, floor.version_of(report.torch_requirement),
                       torch_wheel=torch_wheel, allow_host=allow_host,
                       deployment_target=target if isinstance(target, str) else None)


def print_report(report: wheels.WheelReport, problems: list[str], variant: str | None,
                 system: floor.FloorCheck | None = None,
                 found: variants.WheelVariant | None = None,
                 variant_problems: list[str] = ()) -> None:
    console = Console(width=None if sys.stdout.isatty() else 120)
    table = Table(title=escape(report.wheel), show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    info = report.build_info or {}

    def row(field: str, value: str) -> None:
        table.add_row(Text(field), Text(value))  # a wheel's text is never rich markup

    if "error" in info:
        row("build info", str(info["error"]))
    row("distribution", f"{report.name} {report.version}" + (
        " (no local label: PyPI accepts it)" if report.pypi_clean else ""))
    row("tags", ", ".join(report.tags))
    row("torch pin", report.torch_requirement or "(none)")
    row("built against", f"torch {info.get('torch_version', '?')} "
                                   f"({info.get('torch_git_version', '?')})")
    row("variant", str(info.get("variant", "?")))
    row("backends", ", ".join(info.get("backends") or []) or "?")
    row("CUDA", f"{info.get('cuda_version') or '-'}, arch list "
                          f"{info.get('cuda_arch_list') or '-'}")
    row("CUDA archs embedded", ", ".join(report.cuda_archs) or "-")
    row("Metal", f"sources: {len(report.metal_sources)}, metallibs: "
                           f"{len(report.metallibs)}, embedded: "
                           f"{any(lib.embedded_metal for lib in report.libraries)}")
    row("torch needed", f"{report.min_torch or '-'} (from the stable shim functions; "
                        f"declared: {report.torch_requirement or 'none'})")
    if system is not None and system.needed:
        row("floor", f"{system.needed}; torch: {system.torch or '-'}")
    if found is not None:
        what = (f"{found.label or variants.NULL_LABEL}" + (" (the null variant's plain copy, for "
                "installers without variant support)" if found.label is None else ""))
        row("wheel variant", what)
        for prop in found.properties:
            row("  property", prop)
    for lib in report.libraries:
        row(f"library {lib.path}", f"{lib.size / 1e6:.1f} MB; " + (
            lib.note or f"links {', '.join(lib.needed) or '?'}"))
        if lib.abi is not None:
            row("  ABI", lib.abi.summary())
    console.print(table)
    for note in system.notes if system is not None else ():
        console.print(f"[yellow]![/yellow] {escape(note)}")
    against = f"variant {variant}" if variant else "what the wheel declares"
    for problem in problems:
        console.print(f"[red]✗[/red] contradicts {against}: {escape(problem)}")
    if found is not None:
        drafts = variants.status_line(variants.require_variantlib())
        console.print(f"[yellow]![/yellow] {escape(drafts)}", soft_wrap=True)
    for problem in variant_problems:
        console.print(f"[red]FAIL[/red] wheel variant: {escape(problem)}", soft_wrap=True)
    if found is not None and not variant_problems:
        console.print(f"[green]✓[/green] wheel variant {found.label or variants.NULL_LABEL} "
                      "agrees with its build record")
    if not problems:
        console.print(f"[green]✓[/green] consistent with {against}")
