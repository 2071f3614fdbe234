"""The ``opforge`` command line: one module per command, all under one error boundary.

Every command module exposes ``register(subparsers)``; its handler returns an exit code or
raises. ``main`` turns what is raised into one line on stderr and a documented exit code
(``opforge.errors.EXIT_CODES``): an ``OpforgeError`` into ``opforge <command>: error: ...``
and its code, a signal (SIGINT, SIGTERM, SIGHUP) into 128+N after ``finally`` blocks and the
commands' own handlers have stopped their children, a closed stdout (``| head``) into a quiet
141, and anything else into a short "this is a bug" line naming the log file that holds the
traceback. A traceback is never printed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator, Sequence
from pathlib import Path

from opforge import __version__, progress
from opforge.cli import (
    bench,
    bisect,
    build,
    cache,
    index,
    init,
    inspect,
    matrix,
    recipes,
    smoke,
    workflows,
)
from opforge.cli.environment import check_environment
from opforge.errors import EXIT_BUG, EXIT_SIGNAL, Interrupted, OpforgeError, UsageError
from opforge.paths import cache_dir

# in `opforge --help` order; each registers one subcommand of the same name
COMMANDS = {"init": init, "matrix": matrix, "build": build, "inspect": inspect,
            "smoke": smoke, "recipes": recipes, "bench": bench, "bisect": bisect, "cache": cache,
            "index": index, "workflows": workflows}
_STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP")
                      if hasattr(signal, name))


class _Parser(argparse.ArgumentParser):
    """argparse that raises UsageError instead of printing usage and exiting."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="opforge",
        description="Build, smoke-test and bisect PyTorch op extensions.",
    )
    parser.add_argument("--version", action="version", version=f"opforge {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    subparsers.required = True
    for module in COMMANDS.values():
        module.register(subparsers)
    parser.add_argument(*QUIET_FLAGS, action="store_true", help=QUIET_HELP)
    _add_quiet(subparsers)
    return parser


QUIET_FLAGS = ("-q", "--quiet")
QUIET_HELP = "no progress lines (reports, results and errors are still printed)"


def _add_quiet(subparsers: argparse._SubParsersAction) -> None:
    """-q after any command word too (opforge build -q, opforge cache list -q)."""
    for sub in dict.fromkeys(subparsers.choices.values()):
        # SUPPRESS: a command's own -q sets it, its absence leaves `opforge -q CMD`'s alone
        sub.add_argument(*QUIET_FLAGS, action="store_true", default=argparse.SUPPRESS,
                         help=QUIET_HELP)
        for action in sub._actions:
            if isinstance(action, argparse._SubParsersAction):
                _add_quiet(action)


def command_of(argv: Sequence[str]) -> str | None:
    """The subcommand argv names (its first word that is not an option), if it is one."""
    for word in argv:
        if not word.startswith("-"):
            return word if word in COMMANDS else None
    return None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = command_of(argv)
    prog = f"opforge {command}" if command else "opforge"
    with _stop_signals_raise():
        try:
            parser = build_parser()
            args = parser.parse_args(argv)
            args.command_parser = parser  # opforge workflows check parses steps with it
            progress.set_quiet(getattr(args, "quiet", False))
            check_environment()  # a bad OPFORGE_* value: one line, before anything is made
            code = int(args.func(args) or 0)
            sys.stdout.flush()  # a closed pipe shows here, inside the boundary
            return code
        except SystemExit as exc:  # --help, --version
            return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
        except OpforgeError as exc:
            _say(f"{prog}: error: {exc}")
            return exc.exit_code
        except KeyboardInterrupt as exc:
            signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
            _say(f"{prog}: interrupted ({signal.Signals(signum).name})")
            return EXIT_SIGNAL + signum
        except BrokenPipeError:
            _silence_stdout()
            return EXIT_SIGNAL + getattr(signal, "SIGPIPE", 13)
        except OSError as exc:
            # the system refused something mid-run (disk full, permissions changed)
            where = f"{exc.filename}: " if exc.filename else ""
            _say(f"{prog}: error: {where}{exc.strerror or exc}")
            return 1
        except Exception as exc:  # noqa: BLE001 - the boundary: a bug, told in one line
            log = _write_crash_log(prog, argv)
            _say(f"{prog}: internal error (a bug in opforge {__version__}): "
                 f"{type(exc).__name__}: {_one_line(str(exc))}; the traceback is in {log} "
                 "- please report it")
            return EXIT_BUG
        finally:
            progress.set_quiet(False)  # main called again in one process starts afresh


@contextlib.contextmanager
def _stop_signals_raise() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP raise Interrupted in the main thread while a command runs.

    Only the first one raises: a second Ctrl-C while the first one's cleanup runs (children
    stopped, the state saved) is noted and ignored, so the cleanup finishes and the command
    still ends with one line and 128+N; a third stops the process at once (exit 128+N).
    """
    received: list[int] = []

    def handler(signum, _frame):
        received.append(signum)
        if len(received) == 1:
            raise Interrupted(signum)
        if len(received) == 2:
            with contextlib.suppress(OSError):
                os.write(2, b"opforge: cleaning up after the interrupt; press Ctrl-C again to "
                            b"stop at once\n")
            return
        os._exit(EXIT_SIGNAL + signum)

    previous = {}
    try:
        for signum in _STOP_SIGNALS:
            try:
                previous[signum] = signal.signal(signum, handler)
            except ValueError:  # not the main thread (an embedding application): leave them
                break
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


def _say(line: str) -> None:
    with contextlib.suppress(OSError):
        print(_one_line(line), file=sys.stderr, flush=True)


_BREAKS = re.compile(r"\s*(?:\r\n|\r|\n)\s*")
_INVISIBLE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\x85\u2028\u2029]")


def _one_line(text: str) -> str:
    """Line breaks joined with a space; other control characters (which terminals and
    ``str.splitlines`` take as breaks too) shown escaped, like repr does."""
    text = _BREAKS.sub(" ", text.strip())
    return _INVISIBLE.sub(lambda m: repr(m.group())[1:-1], text)


def _silence_stdout() -> None:
    # later flushes (at exit) must not raise a second BrokenPipeError
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def crash_log_dir() -> Path:
    return cache_dir() / "logs"


def _write_crash_log(prog: str, argv: Sequence[str]) -> str:
    body = (f"{prog} (opforge {__version__}, Python {sys.version.split()[0]})\n"
            f"argv: {list(argv)!r}\n\n{traceback.format_exc()}")
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    for folder in (crash_log_dir, lambda: Path(tempfile.gettempdir())):
        try:
            directory = folder()
            directory.mkdir(parents=True, exist_ok=True)
            fd, path = tempfile.mkstemp(prefix=f"opforge-crash-{stamp}-", suffix=".log",
                                        dir=directory)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(body)
            return path
        except OSError:
            continue
    return "(no log file could be written)"


if __name__ == "__main__":
    raise SystemExit(main())
