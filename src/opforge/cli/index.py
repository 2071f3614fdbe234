"""``opforge index``: a static package index per variant from ``dist/<variant>/`` wheels."""

from __future__ import annotations

import argparse
import stat
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement

from opforge.errors import UsageError
from opforge.files import lookup


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "index", help="write (or add to) a static package index per variant",
        description="Add the wheels of DIST/<variant>/ to a static package index tree at --out: "
                    "a PEP 503 simple index per variant (<variant>/<project>/ with sha256 "
                    "fragments, data-requires-python and PEP 658 .metadata files) and a "
                    "find-links page per torch version and variant (torch-2.14.1+cu130.html). "
                    "Wheels already in the tree are kept. The wheel variants that opforge build "
                    "--variants wrote (DIST/<variant>/variants/) go to wheel-variants/: one "
                    "index URL for every build, with each version's variants JSON (PEP 825, a "
                    "draft), the per-variant pages unchanged. Exit 1, writing nothing, when a "
                    "published file name would get different bytes; exit 2 on bad input.")
    p.add_argument("dist", nargs="?", type=Path, default=Path("dist"),
                   help="folder of <variant>/*.whl (default: dist)")
    p.add_argument("--out", type=Path, metavar="SITE",
                   help="the index tree: created, or merged into when it exists (e.g. a "
                        "checkout of the published site); required unless --resolve")
    p.add_argument("--merge-from", metavar="URL",
                   help="first copy the wheels the index published at URL serves into --out "
                        "(checked against their pages' sha256), so nothing published is lost "
                        "when the tree is deployed anew (GitHub Pages); a 404 is an empty index")
    p.add_argument("--pypi-out", type=Path, metavar="DIR",
                   help="also copy DIST's wheels that carry no local label (the pypi: true "
                        "variant's, which PyPI accepts) into DIR, for the PyPI upload")
    p.add_argument("--dry-run", action="store_true", help="say what would change; write nothing")
    r = p.add_argument_group("resolve", "which file a variant-aware installer takes on this host")
    r.add_argument("--resolve", metavar="NAME==VERSION",
                   help="print the file of NAME VERSION that variantlib's resolution picks from "
                        "the wheel-variants/ index at --index-url, asking the provider plugins "
                        "installed in --host-python (exit 1: none fits this host); the platform "
                        "tags are this interpreter's")
    r.add_argument("--index-url", metavar="URL", help="with --resolve: <site>/wheel-variants/")
    r.add_argument("--host-python", metavar="PATH",
                   help="with --resolve: the interpreter whose provider plugins describe the "
                        "host (default: this one)")
    p.set_defaults(func=run_index)


def run_resolve(args: argparse.Namespace) -> int:
    # the index and variant modules (~20 ms), imported when the command runs: not at startup
    from opforge import variant_index, variants

    try:
        req = Requirement(args.resolve)
        pins = list(req.specifier)
        if len(pins) != 1 or pins[0].operator != "==" or req.extras or req.marker:
            raise InvalidRequirement("one exact pin")
    except InvalidRequirement:
        raise UsageError(f"--resolve {args.resolve!r}: give NAME==VERSION") from None
    if not args.index_url:
        raise UsageError("--resolve needs --index-url (the published <site>/wheel-variants/)")
    if args.host_python and not Path(args.host_python).is_file():
        raise UsageError(f"--host-python {args.host_python}: no such interpreter")
    print(f"opforge index: {variants.status_line(variants.require_variantlib())}")
    print(variant_index.resolve(args.index_url, req.name, pins[0].version,
                                python=args.host_python))
    return 0


def run_index(args: argparse.Namespace) -> int:
    # the index and variant modules (~20 ms), imported when the command runs: not at startup
    from opforge import variant_index, variants
    from opforge.index import (
        build_index,
        check_site,
        collect_dist,
        copy_pypi_clean,
        fetch_published,
    )

    if args.resolve:
        return run_resolve(args)
    if args.index_url or args.host_python:
        raise UsageError("--index-url and --host-python go with --resolve")
    if args.out is None:
        raise UsageError("--out SITE is required (the index tree to write)")
    check_site(args.out)  # an unusable --out is a usage error, before any work
    if args.merge_from:
        if args.dry_run:
            raise UsageError("--merge-from writes the published wheels into --out; it does not "
                             "go with --dry-run")
        collect_dist(args.dist)  # bad input is refused before anything is fetched
        variant_index.collect_dist(args.dist)
        count = fetch_published(args.merge_from, args.out)
        count += variant_index.fetch_published(args.merge_from, args.out)
        print(f"opforge index: {count} published wheel(s) fetched from {args.merge_from}")
    # the wheel variants are planned (and refused) before the index writes anything
    given = lookup(args.dist, what="DIST")  # an unusable name: one line, exit 2
    plan = variant_index.plan(args.dist, args.out) \
        if given is not None and stat.S_ISDIR(given.st_mode) else None
    if plan is not None:
        print(f"opforge index: {variants.status_line(variants.require_variantlib())}")
    result = build_index(args.dist, args.out, dry_run=args.dry_run)
    if plan is not None and not args.dry_run:
        variant_index.write(plan, args.out)
    if args.pypi_out is not None and not args.dry_run:
        check_site(args.pypi_out)
        copied = copy_pypi_clean(collect_dist(args.dist), args.pypi_out)
        print(f"opforge index: {len(copied)} PyPI-clean wheel(s) copied to {args.pypi_out}")
    verb = "would add" if args.dry_run else "added"
    for entry in result.added:
        print(f"{verb} {entry.path}")
    names = sorted({e.variant for e in result.added + result.unchanged + result.kept})
    if plan is not None:
        for item in plan.added:
            print(f"{verb} {item.entry.path}")
    print(f"opforge index: {len(result.added)} wheel(s) {verb}, {len(result.unchanged)} "
          f"already published, {len(result.kept)} kept; variants: {', '.join(names)}; "
          f"{len(result.pages)} pages" + ("" if args.dry_run else f" in {args.out}"))
    if plan is not None:
        print(f"opforge index: {len(plan.added)} wheel variant file(s) {verb} under "
              f"{variant_index.SITE_DIR}/ ({len(plan.files)} in all), "
              f"{sum(p.endswith('.json') for p in plan.documents)} variants JSON file(s): "
              f"one index URL for every build")
    return 0
