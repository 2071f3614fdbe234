"""The allow-list for ``run:`` steps: what a step may run, and how its commands are split.

A step runs, one plain command per line, only:

* ``[python -m] pip install`` of ``nox``, ``uv``, ``opforge`` or the harness from the checkout (``.``);
* ``[python -m] nox -s SESSION [...] [-- ARGS]``;
* ``[python -m] opforge COMMAND [ARGS]``.

``python`` may be any interpreter (``python3.11``, ``/opt/python/cp311-cp311/bin/python``, or
``"$CELL_PYTHON"`` set from the matrix). No ``;``, ``&&``, ``||``, pipes, redirections,
command substitution, subshells or ``VAR=value`` prefixes: whatever CI runs, a laptop runs
by pasting the same line. (No ``echo``/``cat`` either: ``opforge smoke`` and ``opforge
bisect`` write the step summary themselves.)
"""

from __future__ import annotations

import functools
import re
import shlex
from dataclasses import dataclass

from packaging.requirements import InvalidRequirement, Requirement

from opforge.workflows.expressions import EXPRESSION

PIP_PACKAGES = ("nox", "opforge", "uv")  # uv: nox's fast backend
PIP_OPTIONS = ("-U", "--upgrade", "-q", "--quiet")
NOX_FORBIDDEN = ("-f", "--noxfile", "--envdir")  # another noxfile would escape the session check
_OPERATORS = set(";&|<>()")
# an interpreter: python, python3.11, /opt/python/cp311-cp311/bin/python, or "$CELL_PYTHON"
_PYTHON = re.compile(r"((^|/)python(\d+(\.\d+)?t?)?(\.exe)?|^\$\{?[A-Za-z_]\w*\}?)$")


class ScriptError(ValueError):
    """A ``run:`` script that is not on the allow-list; the message says why."""


def commands(script: str) -> list[list[str]]:
    """The argv of each command in a ``run:`` script; ``${{ }}`` expressions stay whole."""
    return [list(argv) for argv in _commands(script)]


@functools.lru_cache(maxsize=4096)  # each step is split once per cell: the same text, often
def _commands(script: str) -> tuple[tuple[str, ...], ...]:
    out = []
    for raw in re.sub(r"\\\n", " ", script).splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        # expressions may hold '&&' or '||' of their own: hide them from the shell checks
        masked = EXPRESSION.sub("__expression__", line)
        if "`" in masked or "$(" in masked:
            raise ScriptError(f"command substitution in {line!r}: one plain command per line")
        lexer = shlex.shlex(masked, posix=True, punctuation_chars="".join(sorted(_OPERATORS)))
        lexer.whitespace_split = True
        try:
            tokens = list(lexer)
        except ValueError as exc:
            raise ScriptError(f"cannot split {line!r}: {exc}") from None
        operators = [t for t in tokens if set(t) <= _OPERATORS]
        if operators:
            raise ScriptError(f"shell operator {operators[0]!r} in {line!r}: one plain command "
                              "per line")
        if re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", tokens[0]):
            raise ScriptError(f"{tokens[0]!r} prefix in {line!r}: set variables in env:")
        out.append(tuple(_split(line)))
    return tuple(out)


def _split(line: str) -> list[str]:
    """shlex.split, keeping each ``${{ }}`` whole (its quotes are the expression's own)."""
    found: list[str] = []

    def hide(m: re.Match) -> str:
        found.append(m.group(0))
        return f"__expression{len(found) - 1}__"

    argv = shlex.split(EXPRESSION.sub(hide, line))
    return [re.sub(r"__expression(\d+)__", lambda m: found[int(m.group(1))], arg) for arg in argv]


@dataclass(frozen=True)
class Command:
    """One allowed command: ``tool`` is pip, nox or opforge; ``args`` follow the tool's name."""

    tool: str
    args: tuple[str, ...]
    sessions: tuple[str, ...] = ()   # nox
    posargs: tuple[str, ...] = ()    # nox, after --

    @property
    def subcommand(self) -> str | None:
        return self.args[0] if self.tool == "opforge" and self.args else None

    def option(self, name: str) -> str | None:
        """The value of ``--name V`` / ``--name=V`` (in nox's posargs for nox)."""
        args = self.posargs if self.tool == "nox" else self.args
        for i, arg in enumerate(args):
            if arg == name and i + 1 < len(args):
                return args[i + 1]
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
        return None


def classify(argv: list[str]) -> Command:
    """Place an argv on the allow-list, or raise ScriptError saying why it is not on it."""
    prog, args = argv[0], list(argv[1:])
    if _PYTHON.search(prog):
        if len(args) < 2 or args[0] != "-m":
            raise ScriptError(f"{' '.join(argv)!r}: Python only as 'python -m pip|nox|opforge'")
        prog, args = args[1], args[2:]
    if prog in ("pip", "pip3"):
        return _pip(argv, args)
    if prog == "nox":
        return _nox(argv, args)
    if prog == "opforge":
        if not args or args[0].startswith("-"):
            raise ScriptError(f"{' '.join(argv)!r}: name the opforge command")
        return Command("opforge", tuple(args))
    raise ScriptError(f"{' '.join(argv)!r} is not a pip install of nox/opforge, a nox session "
                      "or an opforge command")


def _pip(argv: list[str], args: list[str]) -> Command:
    if not args or args[0] != "install":
        raise ScriptError(f"{' '.join(argv)!r}: only 'pip install' is allowed")
    for arg in args[1:]:
        if arg.startswith("-"):
            if arg not in PIP_OPTIONS:
                raise ScriptError(f"pip option {arg!r} is not allowed (allowed: "
                                  f"{', '.join(PIP_OPTIONS)})")
            continue
        if re.fullmatch(r"\.(\[[\w,-]+\])?", arg):
            continue  # the harness from the checkout
        try:
            name = Requirement(arg).name.lower()
        except InvalidRequirement:
            raise ScriptError(f"pip install {arg!r}: not a requirement") from None
        if name not in PIP_PACKAGES:
            raise ScriptError(f"pip install {arg!r}: workflows install only "
                              f"{', '.join(PIP_PACKAGES)} or the harness ('.'); anything "
                              "else belongs in a nox session")
    return Command("pip", tuple(args))


def _nox(argv: list[str], args: list[str]) -> Command:
    sessions: list[str] = []
    posargs: list[str] = []
    collecting = False
    for i, arg in enumerate(args):
        if arg == "--":
            posargs = args[i + 1:]
            break
        if arg in ("-s", "-e", "--session", "--sessions"):
            collecting = True
        elif arg.split("=", 1)[0] in NOX_FORBIDDEN:
            raise ScriptError(f"{' '.join(argv)!r}: nox option {arg} is not allowed")
        elif arg.startswith("-"):
            collecting = False
        elif collecting:
            sessions.append(arg)
        else:
            raise ScriptError(f"{' '.join(argv)!r}: unexpected argument {arg!r}")
    if not sessions:
        raise ScriptError(f"{' '.join(argv)!r}: name the session (nox -s NAME)")
    return Command("nox", tuple(args), tuple(sessions), tuple(posargs))
