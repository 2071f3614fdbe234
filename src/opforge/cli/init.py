"""``opforge init [PATH]``: write matrix.yaml, a recipes stub, a noxfile and the CI workflows
for an extension."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "init", help="write an extension's opforge configuration from its sources",
        description="Read an op extension's sources (TORCH_LIBRARY / STABLE_TORCH_LIBRARY "
                    "blocks, torch::RegisterOperators chains, PYBIND11_MODULE modules, "
                    "torch.library registrations, its build configuration) and write "
                    "matrix.yaml, recipes that call every op once (stubs), noxfile.py and .github/workflows/opforge-{ci,nightly,bisect}.yml "
                    "(callers of opforge's reusable workflows, pinned by commit). Writes all "
                    "files or none; never overwrites without --force; edits none of the "
                    "extension's own files. Exit 2 on bad input.")
    p.add_argument("path", nargs="?", default=".", type=Path,
                   help="the extension's directory (default: the working directory)")
    p.add_argument("--force", action="store_true", help="replace files that exist")
    p.add_argument("--dry-run", action="store_true", help="print the files, write nothing")
    p.add_argument("--torch", default=None, metavar="VERSION",
                   help="the torch release the wheels are built against (default: 2.13.0)")
    p.add_argument("--python", default=f"{sys.version_info[0]}.{sys.version_info[1]}",
                   metavar="X.Y", help="the Python the matrix builds for (default: this one)")
    p.add_argument("--workflows-ref", metavar="COMMIT",
                   help="the 40-hex commit of opforge's repository the workflows call "
                        "(default: the one this opforge release was cut from; a development "
                        "checkout or git install is not a release and needs this)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # the application, imported when the command runs: not at startup (~35 ms)
    from opforge import init

    scan, files = init.plan_files(args.path, torch_version=args.torch or init.DEFAULT_TORCH,
                                  python=args.python, workflows_ref=args.workflows_ref)
    written = [] if args.dry_run else init.write_files(files, force=args.force)
    namespace = init.choose_namespace(scan)
    ops = scan.namespaces.get(namespace, {})
    print(f"opforge init: {scan.distribution} (package {scan.package}, build backend "
          f"{scan.build_backend or 'setuptools (setup.py)'}), torch.ops.{namespace}: "
          f"{len(ops)} op(s): {', '.join(ops) or '-'}; {len(scan.modules)} compiled "
          f"module(s) checked on their own: {', '.join(scan.modules) or '-'}", file=sys.stderr)
    for rel, found in sorted(scan.found.items()):
        for what in found:
            print(f"opforge init: {rel}: {what}", file=sys.stderr)
    for line in init.no_kernel_proposals(scan):
        print(f"opforge init: proposed: {line}", file=sys.stderr)
    for line in scan.by_hand:
        print(f"opforge init: by hand: {line}", file=sys.stderr)
    for note in scan.notes:
        print(f"opforge init: note: {note}", file=sys.stderr)
    if args.dry_run:
        for path, text in files.items():
            print(f"--- {path} ---\n{text}")
    for path in written:
        print(f"wrote {path}")
    if written:
        print("opforge init: next: opforge build --variant V, then opforge recipes --derive "
              "--variant V (a call that runs, for each stub recipe), then opforge smoke "
              "--variant V", file=sys.stderr)
    return 0
