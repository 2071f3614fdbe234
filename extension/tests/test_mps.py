"""opforge ops on a real Apple GPU (MPS): what is particular to MPS (registrations, autocast,
the crossover to the CPU kernels, errors). Every op's forward and backward, small against its
reference and large against the CPU kernels, run on the mps backend of the op's own test file
(tests/backends.py).

Device tests skip with "no MPS device" anywhere else; the registration checks
run wherever the installed build says it has the mps backend.  Every device
test forces the Metal path (OPFORGE_MPS_CPU_BELOW=0) so that small inputs are
not routed to the CPU kernel by the crossover rule; one test checks that rule.
"""

from __future__ import annotations

import os

import pytest
import torch

opforge_ops = pytest.importorskip("opforge_ops", reason="opforge_ops is not built/installed")
from ops_table import BACKWARD_OPS, FORWARD_OPS  # noqa: E402

HAS_MPS_BUILD = "mps" in opforge_ops.build_info().get("backends", [])
HAS_MPS_DEVICE = hasattr(torch.backends, "mps") and torch.backends.mps.is_available()

needs_build = pytest.mark.skipif(
    not HAS_MPS_BUILD, reason="this opforge_ops build has no mps backend"
)
needs_device = pytest.mark.skipif(not (HAS_MPS_BUILD and HAS_MPS_DEVICE), reason="no MPS device")


def has_kernel(op: str, key: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(f"opforge::{op}", key)


@needs_build
@pytest.mark.parametrize("op", FORWARD_OPS)
def test_forward_ops_register_mps_and_autocast_mps(op):
    assert has_kernel(op, "MPS"), f"opforge::{op} has no MPS kernel"
    assert has_kernel(op, "AutocastMPS"), f"opforge::{op} has no AutocastMPS kernel"


@needs_build
@pytest.mark.parametrize("op", BACKWARD_OPS)
def test_backward_ops_register_mps(op):
    assert has_kernel(op, "MPS"), f"opforge::{op} has no MPS kernel"


@needs_build
def test_build_info_records_mps():
    info = opforge_ops.build_info()
    assert info["mps"] is True


@pytest.fixture
def metal_path(monkeypatch):
    """Force the Metal kernels even for tiny inputs (read by the C++ on every call)."""
    monkeypatch.setenv("OPFORGE_MPS_CPU_BELOW", "0")
    for key in [k for k in os.environ if k.startswith("OPFORGE_MPS_CPU_BELOW_")]:
        monkeypatch.delenv(key)


MPS = torch.device("mps")


def rois_for(gen, K, batch, H, W):
    b = torch.randint(0, batch, (K, 1), generator=gen).float()
    xy = torch.rand(K, 2, generator=gen) * torch.tensor([W, H]) * 0.8
    wh = torch.rand(K, 2, generator=gen) * torch.tensor([W, H]) * 0.5 + 0.5
    return torch.cat([b, xy, xy + wh], 1)


@needs_device
def test_autocast_mps_runs_in_float32_and_returns_input_dtype(metal_path):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(1, 4, 16, 16, generator=gen)
    rois = rois_for(gen, 50, 1, 16, 16)
    ref = torch.ops.opforge.roi_align(x, rois, 1.0, 4, 4, 2, True)
    with torch.autocast("mps", dtype=torch.float16):
        out = torch.ops.opforge.roi_align(x.half().to(MPS), rois.half().to(MPS), 1.0, 4, 4, 2, True)
    assert out.dtype == torch.float16
    torch.testing.assert_close(out.cpu().float(), ref, rtol=1e-2, atol=1e-2)


@needs_device
def test_small_problems_route_to_cpu_with_the_same_result(monkeypatch):
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(1, 2, 8, 8, generator=gen)
    rois = rois_for(gen, 3, 1, 8, 8)
    ref = torch.ops.opforge.roi_align(x, rois, 1.0, 2, 2, 2, False)
    monkeypatch.setenv("OPFORGE_MPS_CPU_BELOW_ROI_ALIGN", "1000000")
    routed = torch.ops.opforge.roi_align(x.to(MPS), rois.to(MPS), 1.0, 2, 2, 2, False)
    monkeypatch.setenv("OPFORGE_MPS_CPU_BELOW_ROI_ALIGN", "0")
    metal = torch.ops.opforge.roi_align(x.to(MPS), rois.to(MPS), 1.0, 2, 2, 2, False)
    assert routed.device.type == "mps"
    torch.testing.assert_close(routed.cpu(), ref)
    torch.testing.assert_close(metal.cpu(), ref, rtol=1e-5, atol=1e-5)


@needs_device
def test_bad_batch_index_is_one_clear_error(metal_path):
    x = torch.randn(2, 1, 8, 8, device=MPS)
    rois = torch.tensor([[5.0, 0, 0, 4, 4]], device=MPS)
    with pytest.raises(RuntimeError, match=r"rois\[0, 0\] = 5 is not a batch index"):
        torch.ops.opforge.roi_align(x, rois, 1.0, 2, 2, 2, False)


@needs_device
def test_bfloat16_is_refused_with_advice(metal_path):
    try:
        x = torch.randn(1, 1, 4, 4).to(torch.bfloat16).to(MPS)
        rois = torch.tensor([[0.0, 0, 0, 2, 2]]).to(torch.bfloat16).to(MPS)
    except (RuntimeError, TypeError) as exc:  # bfloat16 on MPS needs macOS 14
        pytest.skip(f"this MPS device has no bfloat16 tensors: {exc}")
    with pytest.raises(RuntimeError, match="float32 or float16"):
        torch.ops.opforge.roi_align(x, rois, 1.0, 2, 2, 2, False)
