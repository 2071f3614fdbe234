"""opforge's own command line as data, for code outside ``main``: the workflow checks parse
each ``opforge ...`` step of a workflow with the parsers ``opforge`` itself uses.

Not imported by ``opforge.cli`` (it imports it): ``opforge workflows check`` is handed the
parser ``main`` parsed with instead.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from opforge.cli import build_parser
from opforge.workflows import Checked
from opforge.workflows import check_repository as _check
from opforge.workflows.project import subcommand_parsers


def commands() -> dict[str, argparse.ArgumentParser]:
    """opforge's subcommands and their parsers: what ``opforge ...`` steps are parsed with."""
    return subcommand_parsers(build_parser())


def check_repository(root: str | Path, matrix_file: str | Path | None = None,
                     every: bool = False) -> Checked:
    """``opforge.workflows.check_repository`` with this CLI's commands."""
    return _check(root, matrix_file, every, commands=commands())


def check_workflows(repo_root: str | Path) -> list[str]:
    """The problems ``check_repository`` finds, one line each; [] when all is well."""
    return check_repository(repo_root).problems
