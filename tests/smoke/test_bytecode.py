"""The bytecode a fresh environment's interpreter wrote goes to the next one with the same
sources, and nowhere else (opforge.bytecode)."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import os
import py_compile
import subprocess
import sys
from pathlib import Path

import pytest

from opforge import bytecode
from opforge.smoke.runner import _clean_env

PY = f"python{sys.version_info[0]}.{sys.version_info[1]}"


def _record_line(site: Path, rel: str) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256((site / rel).read_bytes()).digest())
    return f"{rel},sha256={digest.rstrip(b'=').decode()},{(site / rel).stat().st_size}"


def make_env(root: Path, dist: str, version: str, files: dict[str, str],
             hashes: bool = True) -> Path:
    """An environment's site-packages with one installed distribution and its RECORD."""
    site = root / "lib" / PY / "site-packages"
    for rel, text in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)
    info = site / f"{dist}-{version}.dist-info"
    info.mkdir(parents=True)
    lines = [_record_line(site, rel) if hashes else f"{rel},," for rel in files]
    # a console script outside site-packages names the environment: not part of the key
    lines.append(f"../../../bin/{dist}-cli,sha256={hashlib.sha256(str(root).encode()).hexdigest()},9")
    (info / "RECORD").write_text("\n".join(lines) + "\n")
    return site


def compile_all(site: Path, files) -> None:
    for rel in files:
        py_compile.compile(str(site / rel), doraise=True)


@pytest.fixture(autouse=True)
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / bytecode.STORE


FILES = {"demo/__init__.py": "X = 1\n", "demo/sub/mod.py": "Y = 2\n"}


def test_the_next_environment_with_the_same_sources_gets_the_bytecode(tmp_path):
    first = make_env(tmp_path / "env1", "demo", "1.0", FILES)
    compile_all(first, FILES)
    assert bytecode.save(tmp_path / "env1") == 2
    second = make_env(tmp_path / "env2", "demo", "1.0", FILES)
    assert bytecode.restore(tmp_path / "env2") == 2
    for rel in FILES:
        source = second / rel
        pyc = Path(importlib.util.cache_from_source(str(source)))
        assert pyc.is_file(), rel
        assert pyc.read_bytes() == Path(importlib.util.cache_from_source(
            str(first / rel))).read_bytes()


def test_other_sources_never_get_it(tmp_path):
    first = make_env(tmp_path / "env1", "demo", "1.0", FILES)
    compile_all(first, FILES)
    bytecode.save(tmp_path / "env1")
    changed = {**FILES, "demo/__init__.py": "X = 3\n"}  # same size, other content
    make_env(tmp_path / "env2", "demo", "1.0", changed)
    assert bytecode.restore(tmp_path / "env2") == 0
    assert not list((tmp_path / "env2").rglob("*.pyc"))


def test_a_record_without_hashes_and_the_wheel_under_test_are_not_kept(tmp_path, store):
    site = make_env(tmp_path / "env1", "demo", "1.0", FILES, hashes=False)
    compile_all(site, FILES)
    assert bytecode.save(tmp_path / "env1") == 0
    site = make_env(tmp_path / "env2", "mine", "0.1+cpu", {"mine/__init__.py": "Z = 1\n"})
    compile_all(site, ["mine/__init__.py"])
    assert bytecode.save(tmp_path / "env2", exclude="mine") == 0
    assert not list(store.rglob("*.pyc"))


def _loads_from_pyc(site: Path, module: str) -> bool:
    """Whether Python takes ``module``'s code from its pyc (-v says "matches") or recompiles."""
    out = subprocess.run([sys.executable, "-B", "-v", "-c", f"import {module}"], cwd=site,
                         capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(site)})
    return any(line.startswith("# ") and " matches " in line and "/demo/" in line
               for line in out.stderr.splitlines())


def test_python_uses_it_beside_uvs_hard_links_and_recompiles_beside_new_files(tmp_path):
    first = make_env(tmp_path / "env1", "demo", "1.0", FILES)
    compile_all(first, FILES)
    bytecode.save(tmp_path / "env1")
    # uv's environments: the same inodes (so the same mtimes) from its cache
    linked = make_env(tmp_path / "env2", "demo", "1.0", FILES)
    for rel in FILES:
        (linked / rel).unlink()
        (linked / rel).hardlink_to(first / rel)
    bytecode.restore(tmp_path / "env2")
    assert _loads_from_pyc(linked, "demo.sub.mod")
    # new files (pip's): the pyc's recorded mtime is not theirs, Python compiles the source
    copied = make_env(tmp_path / "env3", "demo", "1.0", FILES)
    for rel in FILES:
        stamp = (first / rel).stat().st_mtime + 7
        os.utime(copied / rel, (stamp, stamp))
    assert bytecode.restore(tmp_path / "env3") == 2
    assert not _loads_from_pyc(copied, "demo.sub.mod")


def test_a_fresh_environments_interpreter_writes_its_bytecode(monkeypatch):
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.setenv("PYTHONPYCACHEPREFIX", "/elsewhere")
    assert "PYTHONDONTWRITEBYTECODE" not in _clean_env(True)
    assert "PYTHONPYCACHEPREFIX" not in _clean_env(True)
    assert _clean_env(False)["PYTHONDONTWRITEBYTECODE"] == "1"
