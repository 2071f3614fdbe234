"""The probe's devices: cpu, cuda and mps are always listed; xpu is listed (and its checks run)
when torch is built for it, and is present only when a tiny computation on it succeeds."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from opforge.smoke.probe import Report, runs
from opforge.smoke.probe.devices import probe_devices

torch = pytest.importorskip("torch")

ARGS = SimpleNamespace(package="p", namespace="p", spec={}, device_checks="auto")


def _probe(monkeypatch, compiled: bool, available: bool):
    monkeypatch.setattr(torch.xpu, "_is_compiled", lambda: compiled)
    monkeypatch.setattr(torch.xpu, "is_available", lambda: available)
    report = Report(ARGS)
    present = probe_devices(report, ARGS, torch)
    runner = runs.OpRunner(report, torch, "p", {}, present, None, None)
    return report.doc["devices"], present, runner.device_types()


def test_a_torch_without_xpu_lists_the_usual_three(monkeypatch):
    devices, present, types = _probe(monkeypatch, compiled=False, available=False)
    assert list(devices)[:3] == ["cpu", "cuda", "mps"] and "xpu" not in devices
    assert "cpu" in present and types == ["cpu", "cuda", "mps"]


def test_an_xpu_build_is_listed_and_checked_but_present_only_if_it_computes(monkeypatch):
    devices, present, types = _probe(monkeypatch, compiled=True, available=True)
    assert types == ["cpu", "cuda", "mps", "xpu"]
    xpu = devices["xpu"]
    assert xpu["built"] and xpu["available"]
    # this CPU torch cannot allocate on an XPU: available is not present
    assert xpu["present"] is False and "xpu reports available but" in xpu["detail"]
    assert "xpu" not in present


def test_an_xpu_build_without_a_device_says_so(monkeypatch):
    devices, _, _ = _probe(monkeypatch, compiled=True, available=False)
    assert devices["xpu"] == {"built": True, "available": False, "present": False,
                              "detail": "no xpu device on this machine"}
