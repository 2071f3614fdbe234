"""One stable-ABI wheel, built once by `opforge build`, across torch releases.

The tiny extension (tests/builds/stable_ext.py) is built for the stable ABI against torch
2.13.0 (CPU) with its floor, inspected, and smoke-tested beside each torch of a list in fresh
environments. The planted violation (a shim function newer than the floor) is caught by the
build's inspect before any install, and the compat smoke on an older torch names the symbol
and the first torch that ships it.

The fast ones use the torches this machine holds (2.13.0 CPU, 2.14.1); the `realtorch` ones
download releases (nox -s realtorch).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.version import Version
from stable_ext import write_project

from opforge import abi

ROOT = Path(__file__).resolve().parents[2]
SRC = str(ROOT / "src")

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    shutil.which("g++") is None or not abi.available() or not sys.platform.startswith("linux"),
    reason="builds a C++ extension on Linux; the audit needs torch-abi-audit (Python >= 3.11)")]


def opforge(*args: str, cwd: Path, env: dict | None = None, timeout: float = 1800):
    full = {**os.environ, "PYTHONPATH": SRC, "OPFORGE_TORCH_INDEX": "pypi",
            "MAX_JOBS": os.environ.get("MAX_JOBS", "2"), **(env or {})}
    for name in ("OPFORGE_MATRIX", "GITHUB_STEP_SUMMARY", "GITHUB_OUTPUT"):
        full.pop(name, None)
    return subprocess.run([sys.executable, "-m", "opforge", *args], cwd=cwd, env=full,
                          capture_output=True, text=True, timeout=timeout)


def build(project: Path) -> tuple[subprocess.CompletedProcess, Path | None]:
    result = opforge("build", "--variant", "cpu_stable", cwd=project)
    wheels = sorted((project / "dist" / "cpu_stable").glob("*.whl"))
    return result, wheels[0] if wheels else None


def compat(project: Path, wheel: Path, torches: str, env: dict | None = None):
    out = project / f"compat-{torches.replace(',', '_')}.json"
    result = opforge("smoke", "--compat", "--wheel", str(wheel), "--variant", "cpu_stable",
                     "--compat-torch", torches, "--json", str(out), cwd=project, env=env)
    doc = json.loads(out.read_text()) if out.exists() else {}
    return result, {row["torch"]: row for row in doc.get("compat", [])}


@pytest.fixture(scope="module")
def clean_wheel(tmp_path_factory) -> tuple[Path, Path]:
    project = tmp_path_factory.mktemp("stable")
    write_project(project, floor="2.10")
    result, wheel = build(project)
    assert result.returncode == 0 and wheel is not None, result.stdout[-3000:] + result.stderr
    return project, wheel


@pytest.fixture(scope="module")
def planted_wheel(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess, Path | None]:
    """Floor 2.13, but the library calls torch_has_storage, first shipped in torch 2.14."""
    project = tmp_path_factory.mktemp("planted")
    write_project(project, floor="2.13", plant="torch_has_storage")
    result, wheel = build(project)
    return project, result, wheel


def test_stable_build_is_one_abi3_wheel_requiring_its_floor(clean_wheel):
    project, wheel = clean_wheel
    assert "-cp310-abi3-manylinux" in wheel.name and "+cpu.stable" in wheel.name
    # built on this host, not in the manylinux_2_28 image: its glibc floor is accepted here
    result = opforge("inspect", str(wheel), "--json", "--expect-variant", "cpu_stable",
                     "--allow-host-floor",
                     cwd=project)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["torch_requirement"] == "torch>=2.10" and report["problems"] == []
    assert report["build_info"]["abi"] == "stable"
    assert report["build_info"]["torch_version"].startswith("2.13.0")
    [lib] = report["libraries"]
    audit = lib["abi"]
    assert audit["libtorch_cxx"] == [] and audit["cpython_other"] == []
    # the shim functions it calls first shipped in 2.10: the computed floor is the declared one
    assert report["min_torch"] == "2.10.0" and "torch_library_impl" in audit["stable_shim"]


def test_one_stable_wheel_passes_the_smoke_on_torch_2_13_and_2_14(clean_wheel):
    project, wheel = clean_wheel
    result, rows = compat(project, wheel, "2.13.0,2.14.1")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert rows["2.13.0"]["installed"].startswith("2.13.0")
    assert rows["2.14.1"]["installed"].startswith("2.14.1")
    for row in rows.values():
        assert row["status"] == "pass"
        checks = {c["id"]: c["status"] for c in row["document"]["checks"]}
        # the full census and op runs, not just an import
        assert checks["import"] == "pass" and checks["torch-match"] == "pass"
        assert checks["run:twice:cpu"] == "pass" and checks["fake:twice"] == "pass"
    assert "torch compat:" in result.stdout and "2.14.1" in result.stdout


def test_planted_newer_shim_function_is_caught_by_inspect_before_any_install(planted_wheel):
    project, result, wheel = planted_wheel
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr
    assert "torch_has_storage" in result.stderr and "needs torch >= 2.14.0" in result.stderr
    assert wheel is not None  # left for inspection, refused by the build's exit code
    inspected = opforge("inspect", str(wheel), cwd=project)
    assert inspected.returncode == 1
    assert "torch_has_storage first shipped in torch 2.14.0" in " ".join(inspected.stdout.split())


def test_planted_violation_load_failure_names_the_symbol_and_first_torch(planted_wheel):
    project, _, wheel = planted_wheel
    result, rows = compat(project, wheel, "2.13.0")
    assert result.returncode == 1
    checks = {c["id"]: c for c in rows["2.13.0"]["document"]["checks"]}
    assert checks["import"]["status"] == "fail"
    named = checks["shim-torch_has_storage"]["message"]
    assert "first shipped in torch 2.14.0" in named and "2.13.0" in named


REAL_ENV = {"PIP_CONSTRAINT": "/dev/null"}  # lifts this machine's torch<=2.14.1 cap


@pytest.mark.realtorch
@pytest.mark.parametrize("release", ["2.10.0", "2.15.0"], ids=["floor", "newest"])
def test_stable_wheel_on_its_floor_and_the_newest_release(clean_wheel, release):
    """The wheel built against 2.13.0 loads and runs on torch 2.10.0 (its floor) and on
    2.15.0 (the newest release the registry serves)."""
    project, wheel = clean_wheel
    result, rows = compat(project, wheel, release, env=REAL_ENV)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert rows[release]["installed"].startswith(release)
    checks = {c["id"]: c["status"] for c in rows[release]["document"]["checks"]}
    assert checks["run:twice:cpu"] == "pass" and checks["torch-match"] == "pass"


@pytest.mark.realtorch
def test_planted_violation_on_an_older_release_names_symbol_and_first_torch(tmp_path):
    """Floor 2.10, a call to a 2.13 shim function: inspect refuses it, torch 2.12.0 cannot
    load it, and the report says which function and which torch first has it."""
    write_project(tmp_path, floor="2.10", plant="torch_exception_get_what_without_backtrace")
    result, wheel = build(tmp_path)
    assert result.returncode == 1 and "needs torch >= 2.13.0" in result.stderr
    result, rows = compat(tmp_path, wheel, "2.12.0,2.13.0", env=REAL_ENV)
    assert result.returncode == 1 and rows["2.13.0"]["status"] == "pass"
    checks = {c["id"]: c for c in rows["2.12.0"]["document"]["checks"]}
    named = checks["shim-torch_exception_get_what_without_backtrace"]["message"]
    assert "first shipped in torch 2.13.0" in named and "2.12.0" in named


@pytest.mark.realtorch
def test_opforge_ops_stable_wheel_on_every_torch_of_its_compat_list(tmp_path):
    """This repository's own cpu_stable wheel (every op, built once against torch 2.13.0) beside
    each torch of matrix.yaml's compat_torch: the floor 2.10.0, 2.13.0, 2.14.1 and the newest
    release the registry serves; every promised kernel is registered and every op runs."""
    matrix = ROOT / "matrix.yaml"
    result = opforge("build", "--file", str(matrix), "--variant", "cpu_stable",
                     "--work-dir", str(tmp_path / "work"), "--out", str(tmp_path / "dist"), cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    out = tmp_path / "compat.json"
    result = opforge("smoke", "--compat", "--wheel", str(wheel), "--file", str(matrix),
                     "--variant", "cpu_stable", "--json", str(out), cwd=tmp_path, env=REAL_ENV)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    rows = {row["torch"]: row for row in json.loads(out.read_text())["compat"]}
    assert set(rows) == {"2.10.0", "2.13.0", "2.14.1", "latest"}
    assert Version(rows["latest"]["installed"]) >= Version("2.15.0")
    for torch_spec, row in rows.items():
        checks = {c["id"]: c["status"] for c in row["document"]["checks"]}
        assert row["status"] == "pass" and checks["import"] == "pass", torch_spec
        ran = [name for name, status in checks.items() if name.startswith("run:") and name.endswith(":cpu")]
        assert len(ran) == 6 and all(checks[name] == "pass" for name in ran), (torch_spec, ran)
