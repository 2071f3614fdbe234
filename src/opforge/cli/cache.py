"""``opforge cache``: list and prune the per-torch environments bisect keeps."""

from __future__ import annotations

import argparse
import json
import time

from opforge.bisect.cache import choose_evictions, human, list_envs, parse_size, remove
from opforge.errors import UsageError
from opforge.paths import cache_dir

DESCRIPTION = """\
The bisect cache holds one environment per torch build it tested (nightlies and releases),
reused by every later bisect. `list` shows them, least recently used first; `prune` removes
the least recently used until the cache fits --max-size, or those unused for --older-than
days, or --all. $OPFORGE_CACHE_MAX_SIZE bounds the cache while a bisect runs.
Exit status: 0 done (also when nothing needed removing), 2 bad arguments; nothing is removed
on bad arguments.
"""


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("cache", help="list and prune bisect's cached environments",
                              description=DESCRIPTION,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True
    listing = sub.add_parser("list", help="the cached environments, least recently used first")
    listing.add_argument("--json", action="store_true", help="as JSON on stdout")
    prune = sub.add_parser("prune", help="remove the least recently used environments")
    prune.add_argument("--max-size", metavar="SIZE",
                       help="keep at most SIZE (40G, 500M, bytes), least recently used go first")
    prune.add_argument("--older-than", type=float, metavar="DAYS",
                       help="remove environments unused for more than DAYS days")
    prune.add_argument("--all", action="store_true", help="remove every environment")
    prune.add_argument("--dry-run", action="store_true", help="say what would go; remove nothing")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    root = cache_dir()
    if args.action == "list":
        envs = list_envs(root)
        if args.json:
            print(json.dumps({"cache": str(root), "bytes": sum(e.size for e in envs),
                              "environments": [e.to_json() for e in envs]}, indent=2))
            return 0
        now = time.time()
        for env in envs:
            age = (now - env.last_used) / 86400
            print(f"{human(env.size):>10}  {age:6.1f} d  {env.torch or '(incomplete)':<28} "
                  f"{env.path.name}")
        print(f"{len(envs)} environments, {human(sum(e.size for e in envs))} in {root / 'envs'}")
        return 0
    chosen = [x for x in (args.max_size, args.older_than, args.all or None) if x is not None]
    if len(chosen) != 1:
        raise UsageError("prune: give exactly one of --max-size SIZE, --older-than DAYS, --all")
    if args.older_than is not None and not args.older_than >= 0:
        raise UsageError(f"--older-than {args.older_than:g}: must be 0 or more days")
    limit = parse_size(args.max_size, "--max-size") if args.max_size else None
    envs = list_envs(root)
    if args.all:
        doomed = envs
    elif limit is not None:
        doomed = choose_evictions(envs, limit)
    else:
        cutoff = time.time() - args.older_than * 86400
        doomed = [e for e in envs if e.last_used < cutoff]
    verb = "would remove" if args.dry_run else "removed"
    kept = []
    for env in doomed:
        if not args.dry_run and not remove(env):  # a running bisect uses it
            kept.append(env)
            print(f"kept {env.path.name}: a running bisect uses it")
            continue
        print(f"{verb} {env.path.name} ({env.torch or 'incomplete'}, {human(env.size)})")
    doomed = [e for e in doomed if e not in kept]
    left = sum(e.size for e in envs) - sum(e.size for e in doomed)
    print(f"{verb} {len(doomed)} of {len(envs)} environments; {human(left)} left")
    return 0
