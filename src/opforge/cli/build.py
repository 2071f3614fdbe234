"""``opforge build``: build one variant's wheel as matrix.yaml declares it."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from opforge import build, compiler_cache, variants
from opforge.errors import UsageError
from opforge.matrix import load_matrix
from opforge.progress import quiet


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
    b.add_argument("--build-env", metavar="NAME=VALUE", action="append",
                   help="one more variable in the extension's build environment, e.g. a switch "
                        "of its own build for fault injection; recorded in the build record "
                        "(build_env), and `opforge inspect` flags such a wheel (repeatable)")
    b.add_argument("--no-compiler-cache", action="store_true",
                   help="compile every file, without sccache (also: OPFORGE_COMPILER_CACHE=off)")
    b.add_argument("--variants", action="store_true",
                   help="also write the wheel's wheel variant (PEP 825, a draft) into "
                        "<out>/variants/: the variant-labelled wheel with the properties its "
                        "backend maps the variant to (cuXYZ: CUDA floor and architectures; "
                        "cpu/mps: the null variant, plus a plain copy), written by variantlib "
                        "for `opforge index`")
    b.add_argument("--variants-only", action="store_true",
                   help="build nothing: write the wheel variants of the wheel the last build "
                        "left in <out> (what --variants adds to a build, as a later step)")
    b.add_argument("--dry-run", action="store_true", help="print the plan, run nothing")
    b.add_argument("-v", "--verbose", action="store_true",
                   help="show every line of the wheel repair (auditwheel's INFO lines too)")
    b.set_defaults(func=run_build)


def run_build(args: argparse.Namespace) -> int:
    matrix = load_matrix(args.file)
    spec = None
    if args.variants_only and (args.dry_run or args.variants):
        raise UsageError("--variants-only builds nothing: it goes without --dry-run and "
                         "--variants")
    if args.variants or args.variants_only:  # refused (exit 2) before anything is built
        spec = variants.preflight(matrix.variant(args.variant), matrix.variants)
    if args.variants_only:
        return variants_of_built(args, matrix)
    extra_env = build.parse_build_env(args.build_env)
    plan = build.plan_build(matrix, args.variant, out_dir=args.out, work_dir=args.work_dir,
                            torch_spec=args.torch, torch_index=args.torch_index,
                            extra_env=extra_env)
    if spec is not None:  # the drafts' line, once the input is known good
        print(f"opforge build: {variants.status_line(variants.require_variantlib())}",
              file=sys.stderr)
    if args.dry_run:
        print(plan.describe())
        if spec is not None:
            print(variants.describe(spec))
        return 0
    # the plan printed by --dry-run is the one built: made once, here
    wheel = build.build_wheel(args.variant, matrix=matrix, python=args.python, plan=plan,
                              install=not args.no_install,
                              compiler_cache=not args.no_compiler_cache,
                              verbose=args.verbose, log=_silent if quiet() else print)
    write_summary(plan.variant.name, compiler_cache.read_stats(plan.work_dir))
    # a wheel built with --build-env is flagged by inspect; here it is what was asked for
    problems = build.verify(wheel, plan.variant, matrix.pythons, extra_env_ok=bool(extra_env))
    if problems:
        for problem in problems:
            print(f"opforge build: {wheel.name}: {problem}", file=sys.stderr)
        return 1
    print(wheel)
    if spec is not None:
        for path in variants.make_variant_wheels(wheel, plan.variant,
                                                 wheel.parent / variants.SUBDIR,
                                                 matrix.variants):
            print(path)
    return 0


def _silent(*_args, **_kwargs) -> None:
    """-q: the build's step lines are progress too."""


def write_summary(variant: str, stats: compiler_cache.CacheStats | None) -> None:
    """The compiler cache's hit rate in a GitHub Actions job summary, when there is one."""
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if not summary or stats is None:
        return
    rate = "n/a" if stats.hit_rate is None else f"{stats.hit_rate:.0%}"
    with open(summary, "a", encoding="utf-8") as fh:
        fh.write(f"### opforge build {variant}: compiler cache\n\n"
                 "| hits | misses | hit rate | not cacheable |\n| ---: | ---: | ---: | ---: |\n"
                 f"| {stats.hits} | {stats.misses} | {rate} | {stats.not_cacheable} |\n\n")


def variants_of_built(args: argparse.Namespace, matrix) -> int:
    """``--variants-only``: the wheel variants of the wheel a build left in ``--out``."""
    # --variants-only only: not at startup
    from opforge.matrix.dist import wheel_record

    variant = matrix.variant(args.variant)
    out = Path(args.out) if args.out else matrix.dist_dir(variant)
    wheels = sorted(out.glob("*.whl"))
    if len(wheels) != 1:
        raise UsageError(f"--variants-only: {out} holds {len(wheels)} wheels, expected the one "
                         f"`opforge build --variant {variant.name}` left there")
    built_for = (wheel_record(wheels[0]) or {}).get("variant")
    if built_for != variant.name:
        raise UsageError(f"--variants-only: {wheels[0].name} was built for variant "
                         f"{built_for!r}, not {variant.name!r}")
    print(f"opforge build: {variants.status_line(variants.require_variantlib())}",
          file=sys.stderr)
    for path in variants.make_variant_wheels(wheels[0], variant, out / variants.SUBDIR,
                                             matrix.variants):
        print(path)
    return 0
