"""The ``opforge`` command line: matrix, build, inspect, smoke, bisect.

Each subsystem registers its own subcommand; this module only dispatches and turns
``OpforgeError`` into one line on stderr and its exit code (never a traceback).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from opforge import __version__
from opforge.errors import OpforgeError, UsageError

# subcommand -> module exposing register(subparsers)
_SUBSYSTEMS = (
    "opforge.matrix_cli",
    "opforge.build_cli",
    "opforge.smoke.cli",
    "opforge.bisect.cli",
)


class _Parser(argparse.ArgumentParser):
    """argparse that raises UsageError instead of printing usage and exiting."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message}")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="opforge",
        description="Build, smoke-test and bisect PyTorch op extensions.",
    )
    parser.add_argument("--version", action="version", version=f"opforge {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    subparsers.required = True
    for module_name in _SUBSYSTEMS:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        return int(args.func(args) or 0)
    except OpforgeError as exc:
        print(f"opforge: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("opforge: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
