"""The smoke's plan reads matrix.yaml once per run: asked again for the same bytes, it gives the
same parsed object; a changed file is parsed again; a FIFO is never opened by it."""

from __future__ import annotations

import os

import pytest
from projectkit import matrix_yaml

import opforge.matrix
from opforge.errors import UsageError
from opforge.smoke import plan


def test_the_same_file_is_parsed_once_and_a_changed_one_again(tmp_path, monkeypatch):
    path = tmp_path / "matrix.yaml"
    path.write_text(matrix_yaml("ops_a", ["scale"]))
    parsed = []
    real = opforge.matrix.load_matrix
    monkeypatch.setattr(plan, "load_matrix", lambda p=None: parsed.append(p) or real(p))
    first = plan.load_matrix_of(path, required=True)
    assert plan.load_matrix_of(path, required=True) is first
    assert len(parsed) == 1
    path.write_text(matrix_yaml("ops_b", ["scale"]))  # same size, same second: other bytes
    assert plan.load_matrix_of(path, required=True).extension.package == "ops_b"
    assert len(parsed) == 2


def test_a_fifo_is_refused_by_the_parser_without_blocking(tmp_path):
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)
    with pytest.raises(UsageError, match="FIFO"):
        plan.load_matrix_of(fifo, required=True)
    assert plan.load_matrix_of(fifo, required=False) is None


def test_the_smoke_and_bench_applications_never_see_the_command_line():
    """cli/smoke.py and cli/bench.py turn the parsed arguments into frozen options; the modules
    of smoke/ and bench/ outside the target (where the probe parses its own argv) import no
    argparse."""
    import ast
    from pathlib import Path

    import opforge

    root = Path(opforge.__file__).parent
    seen = []
    for path in [*(root / "smoke").glob("*.py"), *(root / "bench").glob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) else []
            if "argparse" in names:
                seen.append(path.relative_to(root).as_posix())
    assert seen == []
