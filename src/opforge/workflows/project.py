"""What the workflows are checked against: matrix.yaml, the noxfile's sessions, the CLI's
commands (given by the caller: the CLI hands its parser in, so nothing here imports it), and
whether the repository is opforge itself (elsewhere ``pip install .`` installs the extension)."""

from __future__ import annotations

import argparse
import importlib.util
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from opforge.matrix import Matrix, load_matrix

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

_LISTED = re.compile(r"^[*-] (\S+)(?: -> .*)?$")


@dataclass
class Project:
    root: Path
    matrix: Matrix | None                    # None: the repository has no matrix file
    distribution: str | None = None          # [project] name of the repository's pyproject.toml
    opforge_commands: dict[str, argparse.ArgumentParser] = field(default_factory=dict)

    @property
    def is_opforge(self) -> bool:
        """The repository is opforge's own: here ``pip install .`` installs opforge."""
        return self.distribution == "opforge"

    @cached_property
    def _listed(self) -> tuple[frozenset[str] | None, str | None]:
        return nox_sessions(self.root)  # asked only when a workflow runs nox

    @property
    def sessions(self) -> frozenset[str] | None:
        """The noxfile's session names; None when they could not be listed."""
        return self._listed[0]

    @property
    def session_error(self) -> str | None:
        return self._listed[1]

    @property
    def cells(self) -> list[dict[str, Any]]:
        """Every cell of the full matrix, as ``opforge matrix --github`` emits them."""
        return self.matrix.github_matrix()["include"] if self.matrix else []

    @property
    def fields(self) -> set[str]:
        return {name for cell in self.cells for name in cell}

    @property
    def runners(self) -> set[str]:
        if self.matrix is None:
            return set()
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


def subcommand_parsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """A command line's subcommands and their parsers (``opforge``'s: to check a step's
    arguments). The CLI passes its own parser in: this package never imports the CLI."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def distribution_name(root: Path) -> str | None:
    """The normalized ``[project] name`` of ``root/pyproject.toml`` (None: none readable)."""
    try:
        data = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None
    name = (data.get("project") or {}).get("name") if isinstance(data, dict) else None
    return canonicalize_name(name) if isinstance(name, str) else None


def load_project(root: Path, matrix_file: Path | None = None, *,
                 commands: Mapping[str, argparse.ArgumentParser]) -> Project:
    """Read the matrix (``matrix_file``, else ``root/matrix.yaml`` when there is one;
    MatrixError, exit 2, when it is malformed). Sessions are listed when first asked for.
    ``commands``: opforge's subcommands and their parsers (``subcommand_parsers``)."""
    path = matrix_file if matrix_file is not None else root / "matrix.yaml"
    matrix = load_matrix(path) if matrix_file is not None or path.is_file() else None
    return Project(root, matrix, distribution_name(root), dict(commands))
