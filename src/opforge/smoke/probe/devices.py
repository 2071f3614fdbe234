"""Which devices are really usable: a tiny allocation and computation on each."""

from __future__ import annotations

from .common import ALWAYS_LISTED, DEVICES, Report, first_line


def probe_devices(report: Report, args, torch_mod) -> list[str]:
    """A device is present only when a tiny allocation and computation on it succeed."""
    present = []
    for dev in DEVICES:
        entry: dict = {}
        if dev == "cuda":
            entry["built"] = torch_mod.version.cuda is not None or \
                getattr(torch_mod.version, "hip", None) is not None
            entry["available"] = bool(torch_mod.cuda.is_available())
        elif dev == "mps":
            mps = getattr(torch_mod.backends, "mps", None)
            entry["built"] = bool(mps and mps.is_built())
            entry["available"] = bool(mps and mps.is_available())
        elif dev == "xpu":
            xpu = getattr(torch_mod, "xpu", None)
            compiled = getattr(xpu, "_is_compiled", None)
            entry["built"] = bool(compiled and compiled())
            entry["available"] = bool(entry["built"] and xpu.is_available())
        else:
            entry["built"] = entry["available"] = True
        if dev not in ALWAYS_LISTED and not entry["built"]:
            continue  # a torch without this backend: not a column of every report
        if entry["available"]:
            try:
                x = torch_mod.arange(64, dtype=torch_mod.float32, device=dev)
                total = float((x * 2).sum().cpu())
                if total != 4032.0:
                    raise RuntimeError(f"2*sum(arange(64)) gave {total}, expected 4032")
                entry["present"] = True
                if dev in ("cuda", "xpu"):
                    module = getattr(torch_mod, dev)
                    entry["name"] = module.get_device_name(0)
                    entry["count"] = module.device_count()
            except Exception as exc:  # noqa: BLE001
                entry["present"] = False
                entry["detail"] = (f"{dev} reports available but a 256-byte allocation and sum "
                                   f"failed: {first_line(exc)}")
        else:
            entry["present"] = False
            entry["detail"] = (f"torch {torch_mod.__version__} has no {dev} support" if not entry["built"]
                               else f"no {dev} device on this machine")
        if dev != "cpu" and entry["present"] and args.device_checks == "skip":
            entry["detail"] = "present, device checks disabled (--device-checks skip)"
        report.doc["devices"][dev] = entry
        if entry["present"] and (dev == "cpu" or args.device_checks != "skip"):
            present.append(dev)
    return present
