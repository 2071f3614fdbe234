"""opforge init under generated bad input: hostile extension trees (see contract.py).

Every case runs with --dry-run or into a tree whose files are watched: a refused tree (exit 2)
leaves every file as it was, and nothing blocks on a FIFO named like a source file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from contract import PATH_KINDS, check, examples, make_path
from hypothesis import given
from hypothesis import strategies as st
from test_contract_matrix import NASTY

SOURCES = ["pyproject.toml", "setup.py", "setup.cfg", "csrc/ops.cpp", "csrc/kernel.cu",
           "demo/__init__.py", "demo/ops.py", "CMakeLists.txt"]
GOOD = {
    "pyproject.toml": b"[build-system]\nrequires = ['setuptools', 'torch']\n"
                      b"build-backend = 'setuptools.build_meta'\n[project]\nname = 'demo'\n"
                      b"version = '0.1'\n",
    "setup.py": b"from setuptools import setup\nfrom torch.utils.cpp_extension import "
                b"CppExtension, BuildExtension\nsetup(name='demo', ext_modules=[CppExtension("
                b"'demo._C', ['csrc/ops.cpp'])], cmdclass={'build_ext': BuildExtension})\n",
    "csrc/ops.cpp": b"#include <torch/library.h>\nTORCH_LIBRARY(demo, m) {\n"
                    b"  m.def(\"twice(Tensor x) -> Tensor\");\n}\n",
    "demo/__init__.py": b"",
}
CONTENT = st.one_of(st.binary(max_size=200), NASTY.map(str.encode),
                    st.text(max_size=120).map(lambda t: t.encode("utf-8", "surrogatepass")),
                    st.sampled_from([b"TORCH_LIBRARY(", b"TORCH_LIBRARY(x, m) { m.def(\"(\"); }",
                                     b"[project\nname=", b"\xff\xfe\x00\x00", b"\x00" * 64,
                                     b"TORCH_LIBRARY(" + b"a" * 5000 + b", m) {}"]))


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("contract-init")


def _tree(root: Path, files: dict[str, bytes]) -> Path:
    import shutil

    shutil.rmtree(root, ignore_errors=True)
    for name, data in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


@examples(60)
@given(edits=st.dictionaries(st.sampled_from(SOURCES), CONTENT, max_size=3),
       drop=st.lists(st.sampled_from(sorted(GOOD)), max_size=2),
       dry=st.booleans())
def test_init_on_hostile_trees(work, edits, drop, dry):
    files = {k: v for k, v in GOOD.items() if k not in drop}
    files.update(edits)
    root = _tree(work / "ext", files)
    argv = ["init", str(root), "--workflows-ref", "a" * 40, *(["--dry-run"] if dry else [])]
    result = check(argv, {0, 2}, watch=(root,), changes_allowed=not dry)
    if result.code == 0 and not dry:
        assert (root / "matrix.yaml").is_file()


SPECIALS = ["fifo", "symlink-loop", "dangling-symlink", "directory", "char-device"]


@pytest.mark.parametrize("kind", SPECIALS)
@pytest.mark.parametrize("name", ["csrc/ops.cpp", "pyproject.toml", "setup.py"])
def test_init_with_a_special_file_where_a_source_is(tmp_path, kind, name):
    root = _tree(tmp_path / "ext", {k: v for k, v in GOOD.items() if k != name})
    target = root / name
    target.parent.mkdir(parents=True, exist_ok=True)
    if kind == "char-device":
        os.symlink(os.devnull, target)
    else:
        made = make_path(kind, target.parent, target.name)
        assert made == target
    check(["init", str(root), "--dry-run"], {0, 2}, watch=(root,))


@pytest.mark.parametrize("kind", PATH_KINDS)
def test_init_path_of_every_kind(tmp_path, kind):
    path = make_path(kind, tmp_path)
    check(["init", str(path), "--dry-run"], {2}, watch=(tmp_path,))


@pytest.mark.parametrize("option, value", [("--torch", "banana"), ("--torch", "2.13.0\n"),
                                           ("--python", "2.7"), ("--python", "3.11\n"),
                                           ("--python", "x")])
def test_init_bad_options(tmp_path, option, value):
    root = _tree(tmp_path / "ext", GOOD)
    check(["init", str(root), option, value], {2}, watch=(root,))
