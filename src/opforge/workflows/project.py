"""What the workflows are checked against: matrix.yaml, the noxfile's sessions, the CLI."""

from __future__ import annotations

import argparse
import importlib.util
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opforge.matrix import Matrix, load_matrix

_LISTED = re.compile(r"^[*-] (\S+)(?: -> .*)?$")


@dataclass
class Project:
    root: Path
    matrix: Matrix
    sessions: frozenset[str] | None          # None: could not be listed (session_error says why)
    session_error: str | None = None
    opforge_commands: dict[str, argparse.ArgumentParser] = field(default_factory=dict)

    @property
    def cells(self) -> list[dict[str, Any]]:
        """Every cell of the full matrix, as ``opforge matrix --github`` emits them."""
        return self.matrix.github_matrix()["include"]

    @property
    def fields(self) -> set[str]:
        return {name for cell in self.cells for name in cell}

    @property
    def runners(self) -> set[str]:
        return {p.runner for p in self.matrix.platforms.values()} | \
            {v.runner for v in self.matrix.variants if v.runner}


def nox_sessions(root: Path) -> tuple[frozenset[str] | None, str | None]:
    """The session names ``nox --list`` shows for ``root/noxfile.py``, or why it could not.

    Asking nox (instead of reading the file) sees sessions generated in loops, like the
    ``build_<variant>`` ones made from matrix.yaml. (``--list --json`` would show only the
    default sessions, so this reads the ``* name -> doc`` / ``- name -> doc`` lines.)
    """
    noxfile = root / "noxfile.py"
    if not noxfile.exists():
        return None, "noxfile.py does not exist"
    if importlib.util.find_spec("nox") is not None:
        cmd = [sys.executable, "-m", "nox"]
    elif shutil.which("nox"):
        cmd = [str(shutil.which("nox"))]
    else:
        return None, "nox is not installed here, so session names cannot be checked"
    try:
        # an empty --sessions selects nothing, so the noxfile's default sessions (which may
        # name one that no longer exists) do not stop the listing
        result = subprocess.run([*cmd, "--list", "--noxfile", str(noxfile), "--sessions"],
                                cwd=root, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return None, "nox --list timed out"
    names: set[str] = set()
    for line in result.stdout.splitlines():
        m = _LISTED.match(line)
        if m:
            names.add(m.group(1))
            names.add(re.sub(r"(-\d[\w.]*|\(.*\))$", "", m.group(1)))  # tests-3.11 -> tests
    if result.returncode != 0 or not names:
        tail = (result.stderr or result.stdout).strip().splitlines()[-1:]
        return None, f"nox --list failed: {' '.join(tail) or 'no sessions listed'}"
    return frozenset(names), None


def opforge_commands() -> dict[str, argparse.ArgumentParser]:
    """``opforge``'s subcommands and their parsers (to check a step's arguments)."""
    from opforge.cli import build_parser

    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def load_project(root: Path) -> Project:
    """Read matrix.yaml (MatrixError, exit 2, when it is malformed) and list the sessions."""
    matrix = load_matrix(root / "matrix.yaml")
    sessions, error = nox_sessions(root)
    return Project(root, matrix, sessions, error, opforge_commands())
