"""The build's preflight: the torch a build environment resolved must be the variant's build
(cuXYZ: torch.version.cuda X.Y(Z); rocm: torch.version.hip; cpu: any), else exit 2 in seconds,
before any tool is installed or anything compiles."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from opforge import build, platforms
from opforge.cli import main
from opforge.errors import EXIT_USAGE, UsageError
from opforge.matrix import load_matrix
from opforge.matrix.model import Variant

ROOT = Path(__file__).resolve().parents[2]
MATRIX = load_matrix(ROOT / "matrix.yaml")
execute = importlib.import_module("opforge.build.execute")  # the package re-exports execute()
CPU_TORCH = {"torch_version": "2.13.0+cpu", "cuda": None, "hip": None, "xpu": None}


def variant(backend: str, **fields) -> Variant:
    return Variant(name=f"v_{backend}", platforms=("linux-x86_64",), expected_keys=(),
                   backend=backend, **fields)


@pytest.mark.parametrize("torch_cuda, ok", [("13.0", True), ("13.0.2", True), ("12.8", False),
                                            ("13.1", False), (None, False)])
def test_a_cuda_variant_takes_only_a_torch_of_its_cuda(torch_cuda, ok):
    cuda = variant("cuda", toolkit="13.0", options=(("arch_list", "9.0"),))
    facts = {**CPU_TORCH, "torch_version": "2.14.1", "cuda": torch_cuda}
    problem = platforms.get("cuda").check_torch(cuda, facts)
    assert (problem is None) is ok, problem
    if not ok:
        assert "v_cuda needs a torch built for CUDA 13.0" in problem
        assert ("without CUDA" if torch_cuda is None else f"torch.version.cuda is {torch_cuda}") \
            in problem


@pytest.mark.parametrize("hip, ok", [("6.4.43482-0f2d60242", True), ("6.3.42131-fa1d09cbd", False),
                                     (None, False)])
def test_a_rocm_variant_takes_only_a_torch_of_its_rocm(hip, ok):
    rocm = variant("rocm", toolkit="6.4", options=(("arch_list", "gfx942"),))
    problem = platforms.get("rocm").check_torch(rocm, {**CPU_TORCH, "hip": hip})
    assert (problem is None) is ok, problem


def test_an_xpu_variant_takes_any_xpu_torch_and_no_cpu_one():
    xpu = variant("xpu", toolkit="2025.1", options=(("arch_list", "pvc"),))
    backend = platforms.get("xpu")
    assert backend.check_torch(xpu, {**CPU_TORCH, "xpu": "20250100"}) is None
    assert "needs a torch built for XPU 2025.1" in backend.check_torch(xpu, CPU_TORCH)


@pytest.mark.parametrize("torch_facts", [CPU_TORCH, {**CPU_TORCH, "cuda": "13.0"}])
def test_a_cpu_variant_takes_any_torch(torch_facts):
    assert platforms.get("cpu").check_torch(variant("cpu"), torch_facts) is None


def test_a_cpu_torch_for_cu130_is_refused_before_anything_compiles(tmp_path):
    """This interpreter's torch is a CPU build (2.13.0+cpu): the cu130 build stops at the
    preflight, names the torch and where it came from, and compiles nothing."""
    plan = build.plan_build(MATRIX, "cu130", out_dir=tmp_path / "out",
                            work_dir=tmp_path / "work", torch_index="https://example.test/cu130")
    logs: list[str] = []
    with pytest.raises(UsageError) as info:
        execute.execute(plan, sys.executable, install=False, log=logs.append)
    message = str(info.value)
    assert "variant cu130 needs a torch built for CUDA 13.0" in message
    assert "resolved torch 2.13.0" in message and "a build without CUDA" in message
    assert "the torch index https://example.test/cu130" in message
    assert "OPFORGE_TORCH_INDEX" in message and "torch_version" in message
    assert not (tmp_path / "work" / "build.log").exists()  # the compile never started
    assert not (tmp_path / "out").exists()
    assert not any("compile" in line for line in logs)


def test_the_matching_torch_passes_the_preflight_and_says_so(tmp_path):
    plan = build.plan_build(MATRIX, "cpu", out_dir=tmp_path / "out", work_dir=tmp_path / "work")
    logs: list[str] = []
    execute.preflight(plan, sys.executable, log=logs.append)
    assert logs == [f"opforge build: torch {execute.torch_facts(sys.executable)['torch_version']}"
                    " is cpu's build"]


def test_opforge_build_exits_2_with_one_line(tmp_path, capsys, monkeypatch):
    # the host check (nvcc 13.0 on this host) is not what this test is about
    monkeypatch.setattr(execute, "check_host", lambda matrix, v: None)
    code = main(["build", "--file", str(MATRIX.path), "--variant", "cu130", "--python",
                 sys.executable, "--no-install", "--work-dir", str(tmp_path / "work"),
                 "--out", str(tmp_path / "out"), "--torch-index", "pypi"])
    err = capsys.readouterr().err
    assert code == EXIT_USAGE
    assert "needs a torch built for CUDA 13.0" in err
    assert "pip's configured index (PyPI)" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
