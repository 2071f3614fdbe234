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
