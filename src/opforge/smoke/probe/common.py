"""The probe's report: checks (pass / fail / warn / skip) and the summary."""

from __future__ import annotations

import json
import os
import re
import sys
import time

SCHEMA = 1
# The dispatch-key vocabulary the probe needs: a copy of opforge.dispatch_keys' (the probe
# cannot import opforge), which tests/matrix/test_dispatch_keys.py keeps equal to it.
# Columns the census always shows, expected or not, so a reader sees what a wheel holds.
OBSERVED_KEYS = ("CPU", "CUDA", "MPS", "Meta", "Autograd", "AutocastCPU", "AutocastCUDA",
                 "AutocastMPS")
BACKEND_KEYS = ("CPU", "CUDA", "MPS", "XPU", "HIP", "PrivateUse1")
DEVICE_KEY = {"cpu": "CPU", "cuda": "CUDA", "mps": "MPS", "xpu": "XPU"}
AUTOCAST_KEY = {device: f"Autocast{key}" for device, key in DEVICE_KEY.items()}
DEVICES = ("cpu", "cuda", "mps", "xpu")  # the devices the probe runs ops on
# the devices every report lists (present or not); another is listed when torch is built for it
ALWAYS_LISTED = ("cpu", "cuda", "mps")


def err_text(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text if len(text) < 1500 else text[:1500] + " ..."


def first_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    text = lines[0] if lines else ""
    # the dispatcher's "Could not run" error goes on for a paragraph after its first sentence
    text = text.split(" This could be because the operator", 1)[0]
    return f"{type(exc).__name__}: {text}".strip()


def base_version(version: str | None) -> str | None:
    return version.split("+", 1)[0] if version else None


def release(version: str) -> tuple[int, ...]:
    """``2.14.1+cu130`` -> (2, 14, 1); ``2.10`` -> (2, 10, 0) (stdlib only: no packaging)."""
    parts = [int(x) for x in re.findall(r"\d+", version.split("+")[0].split("dev")[0])[:3]]
    return tuple(parts + [0] * (3 - len(parts)))


class Report:
    def __init__(self, args):
        self.started = time.monotonic()
        spec = getattr(args, "spec", None) or {}
        op_keys = spec.get("op_keys") or {}
        self.doc: dict = {
            "schema": SCHEMA,
            "package": args.package,
            "namespace": args.namespace,
            "expected_keys": list(spec.get("default_keys") or []),
            "op_keys": {op: list(keys) for op, keys in op_keys.items()},
            "expected_ops": [op for op in op_keys if op not in (spec.get("backward_ops") or [])],
            "expected_internal_ops": list(spec.get("backward_ops") or []),
            "recipes": spec.get("recipes"),
            "environment": {},
            "build": {},
            "import": {},
            "devices": {},
            "census": {"keys": [], "ops": []},
            "checks": [],
        }

    def check(self, check_id: str, category: str, status: str, message: str, **fields) -> dict:
        entry = {"id": check_id, "category": category, "status": status, "message": message}
        entry.update({k: v for k, v in fields.items() if v is not None})
        self.doc["checks"].append(entry)
        return entry

    def finish(self) -> dict:
        counts = {s: 0 for s in ("pass", "fail", "warn", "skip")}
        for c in self.doc["checks"]:
            counts[c["status"]] += 1
        self.doc["summary"] = dict(counts, status="fail" if counts["fail"] else "pass",
                                   duration_s=round(time.monotonic() - self.started, 3))
        return self.doc


def own_stdout():
    """Take the real stdout for a protocol of one JSON object per line (a target the host
    talks to: derive's trials, bench's workload server); whatever the extension prints goes to
    stderr from now on. Returns ``say(message)``."""
    protocol = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def say(message: dict) -> None:
        protocol.write(json.dumps(message) + "\n")
        protocol.flush()

    return say
