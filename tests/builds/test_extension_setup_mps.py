"""extension/setup.py's checks for the stable-ABI MPS build (the build itself needs macOS)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytest.importorskip("torch", reason="extension/setup.py imports torch")


def _setup(**env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("OPFORGE_", "FORCE_"))}
    return subprocess.run([sys.executable, "setup.py", "--version"], cwd=ROOT / "extension",
                          env={**clean, **env}, capture_output=True, text=True, timeout=120)


def test_stable_mps_below_214_names_the_shim_function_that_sets_the_floor():
    result = _setup(OPFORGE_ABI="stable", FORCE_MPS="1", OPFORGE_VARIANT="mps_stable",
                    OPFORGE_TORCH_FLOOR="2.10")
    assert result.returncode != 0
    assert "torch_mps_set_arg_bytes" in result.stderr
    assert "set OPFORGE_TORCH_FLOOR=2.14" in result.stderr
    assert "Traceback" not in result.stderr


def test_mps_stable_request_needs_the_stable_abi():
    # setup.py keeps no variant list: a stable request is a torch floor, and it needs the ABI
    result = _setup(FORCE_MPS="1", OPFORGE_VARIANT="mps_stable", OPFORGE_TORCH_FLOOR="2.14")
    assert result.returncode != 0
    assert "a torch floor is a stable-ABI wheel's; set OPFORGE_ABI=stable" in result.stderr
    assert "Traceback" not in result.stderr


def test_setup_compiles_what_the_backend_says_not_the_variant_name(tmp_path):
    # any variant name builds; the backend (or FORCE_*) decides, a contradiction is refused
    result = _setup(OPFORGE_VARIANT="anything_new", OPFORGE_BACKEND="cpu")
    assert result.returncode == 0, result.stderr
    result = _setup(OPFORGE_BACKEND="cuda", FORCE_MPS="1")
    assert result.returncode != 0
    assert "OPFORGE_BACKEND=cuda with FORCE_MPS=1" in result.stderr
    result = _setup(OPFORGE_BACKEND="rocm")
    assert result.returncode != 0
    assert "has kernels for cpu, cuda, mps only" in result.stderr
    assert "Traceback" not in result.stderr
