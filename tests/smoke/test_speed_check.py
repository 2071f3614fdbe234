"""The smoke speed check, end to end through `opforge smoke --python`: a device kernel 20x
slower than the CPU fails with its op, device, both times and the ratio; one only as fast as
the CPU passes. The second device is Meta (OPFORGE_SPEED_EXTRA_DEVICES), whose kernel the
planted extension makes slow; the interpreter is this one (it has torch), so no environment is
created and each case costs one probe run (a few seconds)."""

from __future__ import annotations

import json
import sys

import pytest
from planted import write_planted

from opforge.cli import main

pytest.importorskip("torch")


def _smoke(tmp_path, monkeypatch, slowdown: int, *extra: str) -> tuple[int, dict]:
    root, recipes = write_planted(tmp_path / "src", slowdown)
    monkeypatch.setenv("PYTHONPATH", str(root))
    monkeypatch.setenv("OPFORGE_SPEED_EXTRA_DEVICES", "meta")
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    out = tmp_path / "doc.json"
    code = main(["smoke", "--python", sys.executable, "--package", "planted", "--namespace",
                 "planted", "--recipes", str(recipes), "--json", str(out), *extra])
    return code, json.loads(out.read_text())


def _speed(doc: dict) -> list[dict]:
    return [c for c in doc["checks"] if c["category"] == "speed"]


def test_a_planted_slow_kernel_fails_with_op_device_times_and_ratio(tmp_path, monkeypatch):
    code, doc = _smoke(tmp_path, monkeypatch, slowdown=30)
    (check,) = _speed(doc)
    assert code == 1 and check["status"] == "fail", check
    assert check["id"] == "speed:work:meta" and check["op"] == "work" and check["device"] == "meta"
    assert check["ratio"] > 10 and check["device_s"] > 10 * check["cpu_s"]
    assert "x the CPU's time" in check["message"] and "more than the 10x allowed" in check["message"]


def test_a_kernel_as_fast_as_the_cpu_passes(tmp_path, monkeypatch):
    code, doc = _smoke(tmp_path, monkeypatch, slowdown=1)
    (check,) = _speed(doc)
    assert check["status"] == "pass" and check["ratio"] < 10, check
    assert code == 0, [c for c in doc["checks"] if c["status"] == "fail"]


def test_speed_check_skip_times_nothing(tmp_path, monkeypatch):
    code, doc = _smoke(tmp_path, monkeypatch, 30, "--speed-check", "skip")
    assert code == 0 and not _speed(doc)
