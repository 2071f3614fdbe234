"""How the harness and kernel tests share out between pytest-xdist workers.

``nox -s tests`` runs ``pytest -n auto --dist loadgroup tests extension/tests``; the scheduler
below decides what must stay on one worker:

- a module of tests/: its module- and session-scoped fixtures (a built wheel, a fake nightly
  index, an adopted project's build environment under build/) are made once, and two
  workers never build into the same directory;
- the tests of one emulation of extension/tests (cuda_emu, cuda_stable_emu, metal_emu with
  test_metal_emu.py, whose module fixtures load it; test_cuda.py's emulation tests go with the
  ABI they are parametrized with): one worker builds the emulation while the others run the
  rest. The two CUDA builds are two groups, so two workers compile them at once
  (cuda_emu.load locks each build: a test elsewhere that loads one waits, never compiles
  into it too);
- every other kernel test goes to whichever worker is free.

The groups are read from the test ids here rather than from ``xdist_group`` marks: xdist
3.8 carries a mark's group in ``item._nodeid``, which pytest 9.2 no longer reads, so marked
tests were spread out silently. Without xdist none of this runs.
"""

from __future__ import annotations

import re

import pytest

# an emulated backend, named in a kernel test's parameter id -> its group
EMULATIONS = {"cuda_emu": "cuda_emu", "cuda_stable_emu": "cuda_stable_emu", "metal_emu": "metal_emu"}
# a module whose fixtures load an emulation -> (parameter word -> group, the group otherwise):
# test_cuda.py's emu fixture is parametrized by the ABI it loads ([legacy], [stable])
MODULES = {"test_cuda.py": ({"stable": "cuda_stable_emu"}, "cuda_emu"),
           "test_metal_emu.py": ({}, "metal_emu")}
KERNEL_TESTS = "extension/tests/"


def _names(params: str, word: str) -> bool:
    """Whether `word` is one part of the parameter id: [cuda_emu], [groups-float32-cuda_emu]."""
    return re.search(rf"[\[-]{re.escape(word)}[\]-]", params) is not None


def worker_group(nodeid: str) -> str | None:
    """The group a test must share a worker with, or None (any worker)."""
    path, _, rest = nodeid.partition("::")
    if path.startswith(KERNEL_TESTS):
        module = path.rsplit("/", 1)[-1]
        if module in MODULES:
            by_param, default = MODULES[module]
            return next((group for word, group in by_param.items() if _names(rest, word)), default)
        return next((group for emulation, group in EMULATIONS.items() if _names(rest, emulation)),
                    None)
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
