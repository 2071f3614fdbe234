"""``python -m opforge.workflows [REPO]``: print the workflow problems; exit 1 if any."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from opforge.errors import OpforgeError
from opforge.workflows import check_workflows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m opforge.workflows",
        description="Check .github/workflows against matrix.yaml, the noxfile and CI hygiene.")
    parser.add_argument("repo", nargs="?", default=".", type=Path,
                        help="repository root (default: .)")
    args = parser.parse_args(argv)
    try:
        problems = check_workflows(args.repo)
    except OpforgeError as exc:
        print(f"opforge: error: {exc}", file=sys.stderr)
        return exc.exit_code
    for problem in problems:
        print(problem)
    if problems:
        print(f"{len(problems)} workflow problem(s)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
