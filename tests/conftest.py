"""How the harness and kernel tests share out between pytest-xdist workers.

``nox -s tests`` runs ``pytest -n auto --dist loadgroup tests extension/tests``; the scheduler
below decides what must stay on one worker:

- a module of tests/: its module- and session-scoped fixtures (a built wheel, a fake nightly
  index, an adopted project's build environment under build/) are made once, and two
  workers never build into the same directory;
- the tests of one emulation of extension/tests (cuda_emu and cuda_stable_emu with
  test_cuda.py, metal_emu with test_metal_emu.py, whose module fixtures load them): one worker builds the
  emulation while the others run the rest, and no two compile into its cache together;
- every other kernel test goes to whichever worker is free.

The groups are read from the test ids here rather than from ``xdist_group`` marks: xdist
3.8 carries a mark's group in ``item._nodeid``, which pytest 9.2 no longer reads, so marked
tests were spread out silently. Without xdist none of this runs.
"""

from __future__ import annotations

import re

import pytest

# an emulated backend -> its group and the module whose fixtures also load it (both CUDA
# builds on one worker: test_cuda.py's module fixture loads the two)
EMULATIONS = {"cuda_emu": ("cuda_emu", "test_cuda.py"), "cuda_stable_emu": ("cuda_emu", "test_cuda.py"),
              "metal_emu": ("metal_emu", "test_metal_emu.py")}
KERNEL_TESTS = "extension/tests/"


def worker_group(nodeid: str) -> str | None:
    """The group a test must share a worker with, or None (any worker)."""
    path, _, rest = nodeid.partition("::")
    if path.startswith(KERNEL_TESTS):
        for emulation, (group, module) in EMULATIONS.items():
            # the backend is one part of the parameter id: [cuda_emu], [groups-float32-cuda_emu]
            if path.rsplit("/", 1)[-1] == module or re.search(rf"[\[-]{emulation}[\]-]", rest):
                return group
        return None
    return path


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class Scheduling(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return worker_group(nodeid) or super()._split_scope(nodeid)

    return Scheduling(config, log)
