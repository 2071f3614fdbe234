"""``opforge build``: build one variant's wheel as matrix.yaml declares it."""

from __future__ import annotations

import argparse
import sys

from opforge import build
from opforge.matrix import load_matrix


def register(subparsers: argparse._SubParsersAction) -> None:
    b = subparsers.add_parser("build", help="build one variant's wheel",
                              description="Build one variant's wheel as matrix.yaml declares it.")
    b.add_argument("--variant", required=True, help="variant name from matrix.yaml (cpu, cu130, ...)")
    b.add_argument("--file", metavar="PATH", help="matrix file (default: $OPFORGE_MATRIX, else "
                                                  "matrix.yaml from the working directory up)")
    b.add_argument("--out", metavar="DIR", help="wheel directory (default: dist/<variant>)")
    b.add_argument("--work-dir", metavar="DIR",
                   help="build cache (default: build/<variant>; kept, so rebuilds only relink)")
    b.add_argument("--python", metavar="PATH",
                   help="build in this interpreter's environment instead of a fresh one "
                        "(torch and the build tools are installed into it first)")
    b.add_argument("--no-install", action="store_true",
                   help="with --python: install nothing, build with the environment as it is")
    b.add_argument("--torch", metavar="SPEC", help="torch requirement (default: the matrix's)")
    b.add_argument("--torch-index", metavar="URL",
                   help="where torch comes from: 'pypi', a URL or a directory "
                        "(default: $OPFORGE_TORCH_INDEX, else the matrix's index)")
    b.add_argument("--omit-kernels", metavar="OP:BACKEND,...",
                   help="fault injection: leave these kernels out (e.g. roi_align:cpu)")
    b.add_argument("--dry-run", action="store_true", help="print the plan, run nothing")
    b.set_defaults(func=run_build)


def run_build(args: argparse.Namespace) -> int:
    matrix = load_matrix(args.file)
    plan = build.plan_build(matrix, args.variant, out_dir=args.out, work_dir=args.work_dir,
                            torch_spec=args.torch, torch_index=args.torch_index,
                            omit_kernels=args.omit_kernels)
    if args.dry_run:
        print(plan.describe())
        return 0
    wheel = build.build_wheel(args.variant, matrix=matrix, python=args.python,
                              out_dir=args.out, work_dir=args.work_dir, torch_spec=args.torch,
                              torch_index=args.torch_index, omit_kernels=args.omit_kernels,
                              install=not args.no_install)
    problems = build.verify(wheel, plan.variant)
    if problems and not args.omit_kernels:
        for problem in problems:
            print(f"opforge build: {wheel.name}: {problem}", file=sys.stderr)
        return 1
    print(wheel)
    return 0
