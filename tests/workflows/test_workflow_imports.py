"""The workflow checks do not import the CLI: the CLI hands its commands in (no import circle)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import opforge.workflows

PACKAGE = Path(opforge.workflows.__file__).parent
ROOT = Path(__file__).resolve().parents[2]


def test_no_module_of_the_workflow_checks_imports_the_cli():
    importers = []
    for path in sorted(PACKAGE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if isinstance(node, ast.ImportFrom) and node.module == "opforge":
                names = [f"opforge.{a.name}" for a in node.names]
            importers += [f"{path.name}:{node.lineno}: {n}" for n in names
                          if n == "opforge.cli" or n.startswith("opforge.cli.")]
    assert importers == []


def test_checking_this_repository_leaves_the_cli_unimported():
    # a fresh interpreter: the checks run with a command table, and opforge.cli never loads
    code = ("import argparse, sys\n"
            "from opforge.workflows import check_repository\n"
            "parser = argparse.ArgumentParser(prog='opforge')\n"
            "sub = parser.add_subparsers(dest='command')\n"
            "sub.add_parser('matrix').add_argument('--github', action='store_true')\n"
            f"result = check_repository({str(ROOT)!r}, commands={{'matrix': sub.choices['matrix']}})\n"
            "assert result.checked, result\n"
            "assert any(\"'opforge smoke' is not an opforge command\" in p\n"
            "           for p in result.problems), result.problems[:5]\n"
            "loaded = sorted(m for m in sys.modules if m == 'opforge.cli' or m.startswith('opforge.cli.'))\n"
            "assert not loaded, loaded\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
