"""tests/conftest.py's xdist groups: what shares a build stays on one worker, the rest spreads."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("tests_conftest", Path(__file__).with_name("conftest.py"))
groups = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(groups)

K = "extension/tests/"


@pytest.mark.parametrize("nodeid, group", [
    # each CUDA ABI's emulation is built by one worker, the two by two workers at once
    (K + "test_nms.py::TestNms::test_matches_reference[1000boxes-torch.float32-cuda_emu]", "cuda_emu"),
    (K + "test_nms.py::TestNms::test_matches_reference[1000boxes-torch.float32-cuda_stable_emu]",
     "cuda_stable_emu"),
    (K + "test_roi_align.py::test_forward[cuda_stable_emu]", "cuda_stable_emu"),
    # test_cuda.py's emu fixture: the ABI it loads is its parameter
    (K + "test_cuda.py::test_emulated_nms_runs_blocks_of_threads_that_meet_at_barriers[legacy]",
     "cuda_emu"),
    (K + "test_cuda.py::test_emulated_nms_runs_blocks_of_threads_that_meet_at_barriers[stable]",
     "cuda_stable_emu"),
    (K + "test_cuda.py::test_nms_30k_boxes_matches_cpu", "cuda_emu"),
    (K + "test_metal_emu.py::test_anything[roi_align]", "metal_emu"),
    (K + "test_roi_align.py::test_forward[groups-float32-metal_emu]", "metal_emu"),
    # a kernel test of no emulation goes to any worker; a harness module keeps its own
    (K + "test_roi_align.py::test_forward[cpu]", None),
    (K + "test_roi_align.py::test_forward[cuda_emulated_elsewhere]", None),
    ("tests/smoke/test_causes_compiled.py::test_x", "tests/smoke/test_causes_compiled.py"),
])
def test_a_test_goes_with_what_shares_its_build(nodeid, group):
    assert groups.worker_group(nodeid) == group
