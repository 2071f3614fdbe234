"""What runs inside the environment under test (the smoke probe, the bench's side) needs
nothing of opforge there: the standard library, torch and the extension's recipes only."""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from opforge.smoke.archive import PACKAGES, ROOT, probe_archive

ALLOWED = set(sys.stdlib_module_names) | {"torch"}


def _imports(path: Path, package: str):
    """(absolute module name, line) of every import in ``path``, relative ones resolved."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from ((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                yield ".".join(base + ([node.module] if node.module else [])), node.lineno
            else:
                yield node.module, node.lineno


@pytest.mark.parametrize("shipped", PACKAGES)
def test_shipped_code_imports_the_standard_library_torch_and_the_probe_only(shipped):
    package = "opforge." + shipped.replace("/", ".")
    # the probe depends on nothing else of opforge; the bench's side on itself and the probe
    inside = ("opforge.smoke.probe",) if shipped == "smoke/probe" else \
        ("opforge.smoke.probe", package)
    wrong = []
    for path in sorted((ROOT / shipped).glob("*.py")):
        for name, line in _imports(path, package):
            top = name.split(".")[0]
            if top == "opforge" and not name.startswith(inside) or \
                    top != "opforge" and top not in ALLOWED:
                wrong.append(f"{path.relative_to(ROOT)}:{line}: {name}")
    assert wrong == []


def test_the_archive_runs_each_mode_without_opforge_or_site_packages(tmp_path):
    archive = probe_archive(tmp_path / "probe.pyz")
    names = zipfile.ZipFile(archive).namelist()
    assert "_opforge/bench/target/serve.py" in names and "_opforge/smoke/probe/main.py" in names
    for mode, option in (([], "--out"), (["bench"], "--bench"), (["serve"], "--recipes")):
        # -S -I: no site-packages, no user site, no PYTHONPATH: opforge cannot be imported
        done = subprocess.run([sys.executable, "-S", "-I", str(archive), *mode, "--help"],
                              cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert option in done.stdout
