"""opforge init on hostile trees: links, FIFOs and folders planted where it writes, decoy
``.git`` files, and source values that would not survive being copied into YAML or Python.

What must hold (issue 29): nothing outside the tree is ever written (a planted link never
sends a file elsewhere), nothing blocks on a FIFO, a refused tree (exit 2) is left exactly as
it was, and what init writes reads back the same: matrix.yaml lists the ops the sources
define, the recipes file is the stub and nothing else.
"""

from __future__ import annotations

import ast
import os
import shutil
from pathlib import Path

import pytest
import yaml
from contract import check, examples, snapshot
from hypothesis import given
from hypothesis import strategies as st

REF = ["--workflows-ref", "c" * 40]
PYPROJECT = (b"[build-system]\nrequires = ['setuptools', 'torch']\n"
             b"build-backend = 'setuptools.build_meta'\n[project]\nname = 'demo'\nversion = '0.1'\n")
CXX = b'#include <torch/library.h>\nTORCH_LIBRARY(demo, m) {\n  m.def("twice(Tensor x) -> Tensor");\n}\n'
FILE_TARGETS = ["ext/matrix.yaml", "ext/opforge_recipes.py", "ext/noxfile.py",
                ".github/workflows/opforge-ci.yml"]
FOLDER_TARGETS = [".github", ".github/workflows"]
SCRATCH = ["ext/.noxfile.py.opforge-init", "ext/.matrix.yaml.opforge-init"]  # the old fixed names
KINDS = ["link-to-file", "link-to-folder", "dangling-link", "fifo", "directory", "file"]


def _tree(base: Path, ext_files: dict[str, bytes] | None = None) -> tuple[Path, Path, Path]:
    """(the repository, the extension in it, a folder outside both holding a victim file)."""
    shutil.rmtree(base, ignore_errors=True)
    repo, outside = base / "repo", base / "outside"
    (repo / ".git").mkdir(parents=True)
    (outside / "folder").mkdir(parents=True)
    (outside / "victim.txt").write_text("do not touch\n")
    ext = repo / "ext"
    files = {"pyproject.toml": PYPROJECT, "csrc/ops.cpp": CXX, "demo/__init__.py": b""}
    files.update(ext_files or {})
    for name, data in files.items():
        (ext / name).parent.mkdir(parents=True, exist_ok=True)
        (ext / name).write_bytes(data)
    return repo, ext, outside


def _plant(repo: Path, outside: Path, where: str, kind: str) -> bool:
    """Put ``kind`` at ``where``; False when an earlier plant is in the way."""
    path = repo / where
    if path.exists() or path.is_symlink() or any(p.is_symlink() for p in path.parents):
        return False
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError:  # a FIFO or a file planted where a folder goes
        return False
    if kind == "link-to-file":
        os.symlink(outside / "victim.txt", path)
    elif kind == "link-to-folder":
        os.symlink(outside / "folder", path)
    elif kind == "dangling-link":
        os.symlink(outside / "nothing-here", path)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        path.write_text("an earlier file\n")
    return True


def _refused(plants: list[tuple[str, str]], force: bool) -> bool:
    for where, kind in plants:
        if where in FILE_TARGETS and (kind != "file" or not force):
            return True
        if where in FOLDER_TARGETS and kind not in ("directory",):
            return True
    return False


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("hostile-init")


@examples(60)
@given(plants=st.lists(st.tuples(st.sampled_from(FILE_TARGETS + FOLDER_TARGETS + SCRATCH),
                                 st.sampled_from(KINDS)), min_size=1, max_size=3,
                       unique_by=lambda p: p[0]),
       force=st.booleans())
def test_planted_links_fifos_and_folders_never_redirect_a_write(work, plants, force):
    repo, ext, outside = _tree(work / "case")
    plants = [(where, kind) for where, kind in plants if _plant(repo, outside, where, kind)]
    before_outside = snapshot(outside)
    result = check(["init", str(ext), *REF, *(["--force"] if force else [])], {0, 2},
                   watch=(repo,), changes_allowed=True)
    assert snapshot(outside) == before_outside, "a write escaped the tree"
    assert (result.code == 2) == _refused(plants, force), (plants, force, result.err)
    if result.code == 0:
        for where, kind in plants:  # a planted scratch name is left alone, never written through
            if where in SCRATCH:
                path = repo / where
                assert kind != "fifo" or path.is_fifo()
                assert not kind.endswith("link") or path.is_symlink()
        assert yaml.safe_load((ext / "matrix.yaml").read_text())["extension"]["namespace"] \
            == "demo"


@pytest.mark.parametrize("decoy", ["empty-file", "gitdir-nowhere", "link-to-folder"])
def test_a_decoy_git_in_an_ancestor_does_not_decide_where_workflows_go(tmp_path, decoy):
    repo, ext, outside = _tree(tmp_path / "case")
    shutil.rmtree(repo / ".git")
    decoy_path = repo / ".git"
    if decoy == "empty-file":
        decoy_path.write_text("")
    elif decoy == "gitdir-nowhere":
        decoy_path.write_text("gitdir: /nonexistent/worktree\n")
    else:
        os.symlink(outside / "folder", decoy_path)
    check(["init", str(ext), *REF], {0}, watch=(outside,), changes_allowed=True)
    assert (ext / ".github" / "workflows" / "opforge-ci.yml").is_file()
    assert not (repo / ".github").exists()


def test_init_force_over_a_noxfile_folder_replaces_nothing(tmp_path):
    repo, ext, _ = _tree(tmp_path / "case")
    check(["init", str(ext), *REF], {0}, watch=(repo,), changes_allowed=True)
    (ext / "matrix.yaml").write_text("# edited by hand\n")
    (ext / "noxfile.py").unlink()
    (ext / "noxfile.py").mkdir()
    result = check(["init", str(ext), *REF, "--force"], {2}, watch=(repo,))
    assert "noxfile.py" in result.err and "directory" in result.err
    assert (ext / "matrix.yaml").read_text() == "# edited by hand\n"


BREAKS = ["\n", "\r", "\r\n", "\x85", "\u2028", "\u2029", "\x0b", "\x0c", "\x00", "\x1b"]
CODE = ["import os; os.system('touch /tmp/opforge-pwned')", "- injected_op", '"""', "'''",
        "# comment", "}", "RECIPES = {}", "x: 1"]


@examples(60)
@given(where=st.sampled_from(["schema", "name"]), brk=st.sampled_from(BREAKS),
       code=st.sampled_from(CODE), style=st.sampled_from(["Library.define", "torch.library.define"]))
def test_a_schema_or_op_name_that_would_not_round_trip_is_refused(work, where, brk, code, style):
    name, schema = "twice", "(Tensor x) -> Tensor"
    if where == "schema":
        schema = schema + brk + code
    else:
        name = name + brk + code
    if style == "Library.define":
        source = (f"import torch\nlib = torch.library.Library('demo', 'DEF')\n"
                  f"lib.define({name + schema!r})\n")
    else:
        source = f"import torch\ntorch.library.define({'demo::' + name!r}, {schema!r})\n"
    repo, ext, _ = _tree(work / "copied", {"csrc/ops.cpp": b"", "demo/ops.py": source.encode()})
    result = check(["init", str(ext), *REF], {0, 2}, watch=(repo,), changes_allowed=True)
    if result.code == 2:
        return  # refused (naming the file), or not recognised as an op at all
    matrix = yaml.safe_load((ext / "matrix.yaml").read_text())
    ops = [next(iter(op)) if isinstance(op, dict) else op for op in matrix["ops"]]
    assert all(isinstance(op, str) and op.isidentifier() for op in ops), ops
    recipes = ast.parse((ext / "opforge_recipes.py").read_text())
    kinds = [type(node).__name__ for node in recipes.body]
    assert kinds == ["Expr", "Import", "Assign"], kinds  # the docstring, torch, RECIPES
    assert not Path("/tmp/opforge-pwned").exists()
