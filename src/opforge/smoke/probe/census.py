"""The census: every op of the namespace against the dispatch keys it must (and does) have."""

from __future__ import annotations

import difflib

from .common import BACKEND_KEYS, DEVICE_KEY, OBSERVED_KEYS, Report
from .registrations import op_names


def namespace_ops(torch_mod, namespace: str) -> list[str]:
    """The ops of ``namespace`` that have a schema (a kernel for an undefined name is no op)."""
    prefix = namespace + "::"
    return sorted(q[len(prefix):] for q in op_names(torch_mod) if q.startswith(prefix))


def has_key(torch_mod, qualname: str, key: str) -> str | None:
    """The key that serves ``key`` for this op (itself or a composite alias), or None."""
    has = torch_mod._C._dispatch_has_kernel_for_dispatch_key
    if has(qualname, key):
        return key
    if key == "Autograd":
        for alias in ("AutogradCPU", "AutogradCUDA", "CompositeImplicitAutograd"):
            if has(qualname, alias):
                return alias
        return None
    if key.startswith("Autocast"):
        return None
    for alias in ("CompositeExplicitAutograd", "CompositeImplicitAutograd",
                  "CompositeExplicitAutogradNonFunctional"):
        if has(qualname, alias):
            return alias
    return None


def missing_key_message(ns: str, op: str, key: str) -> str:
    q = f"{ns}::{op}"
    if key in DEVICE_KEY.values():
        dev = key.lower()
        return (f"{op} has no {key} kernel: on a {dev} tensor torch.ops.{ns}.{op} fails with "
                f"\"Could not run '{q}' with arguments from the '{key}' backend\"")
    if key == "Meta":
        return (f"{op} has no Meta (fake) kernel: FakeTensorMode, torch.compile and torch.export "
                f"fail with \"{q}: attempted to run this operator with Meta tensors, but there "
                "was no fake impl or Meta kernel registered\"")
    if key == "Autograd":
        return (f"{op} has no Autograd kernel: loss.backward() does not reach its inputs "
                f"(torch warns \"an autograd kernel was not registered to the Autograd key(s)\" "
                "and the gradients stay None or raise)")
    if key.startswith("Autocast"):
        dev = key[len("Autocast"):].lower()
        return (f"{op} has no {key} kernel: under torch.autocast('{dev}') it receives "
                "reduced-precision inputs uncast, so mixed float16/bfloat16 and float32 inputs "
                "fail with a dtype mismatch")
    return f"{op} has no {key} kernel"


def expectations(spec: dict, found: list[str]) -> dict[str, dict]:
    """op -> {"keys": [...], "backward": bool, "declared": bool} from the spec.

    Declared ops carry their own keys (the matrix resolves each op's keys for the variant);
    with no op declared, every op found is expected to have the default keys (a backward-only
    op, named with a leading underscore, its backend keys and Meta).
    """
    op_keys = spec.get("op_keys") or {}
    backward = set(spec.get("backward_ops") or [])
    default = list(spec.get("default_keys") or [])
    out = {op: {"keys": list(keys), "backward": op in backward, "declared": True}
           for op, keys in op_keys.items()}
    for op in found:
        if op in out:
            continue
        if op_keys:
            out[op] = {"keys": [], "backward": False, "declared": False}
        else:
            internal = op.startswith("_")
            backward_keys = [k for k in default if k in BACKEND_KEYS or k == "Meta"]
            out[op] = {"keys": backward_keys if internal else default,
                       "backward": internal, "declared": True}
    return out


def run_census(report: Report, spec: dict, namespace: str, torch_mod) -> dict[str, dict]:
    ns = namespace
    known = getattr(torch_mod._C, "DispatchKey", None)
    found = namespace_ops(torch_mod, ns)
    plan = expectations(spec, found)
    wanted = list(dict.fromkeys(k for entry in plan.values() for k in entry["keys"]))
    unknown = [k for k in wanted if known is not None and k not in known.__members__]
    if unknown:
        report.check("census-keys", "census", "fail",
                     f"torch {torch_mod.__version__} has no dispatch key {', '.join(unknown)}: "
                     "check the expected keys in matrix.yaml (or --expect-keys)")
    keys = list(dict.fromkeys([*(spec.get("default_keys") or []), *wanted, *OBSERVED_KEYS]))
    keys = [k for k in keys if k not in unknown]
    report.doc["census"]["keys"] = keys
    rows = {}
    for op, entry in plan.items():
        expected = [k for k in entry["keys"] if k not in unknown]
        declared = entry["declared"]
        qualname = f"{ns}::{op}"
        row = {"op": op, "qualname": qualname, "found": op in found,
               "internal": entry["backward"], "declared": declared, "expected": expected,
               "keys": {}}
        rows[op] = row
        report.doc["census"]["ops"].append(row)
        if op not in found:
            for key in keys:
                row["keys"][key] = {"status": "missing" if key in expected else "absent"}
            status = "fail" if declared else "warn"
            near = difflib.get_close_matches(op, found, n=1, cutoff=0.6)
            report.check(f"census:{op}", "census", status,
                         f"{qualname} is not registered"
                         + (f" ({ns} defines {near[0]}: did you mean it?)" if near else "")
                         + f": torch.ops.{ns}.{op} fails with "
                         f"\"AttributeError: '_OpNamespace' '{ns}' object has no attribute "
                         f"'{op}'\" and a fake registration for it with \"operator {qualname} "
                         "does not exist\"", op=op)
            continue
        if not declared:
            row["keys"] = {k: {"status": "present" if has_key(torch_mod, qualname, k) else "absent"}
                           for k in keys}
            continue
        for key in keys:
            via = has_key(torch_mod, qualname, key)
            if via:
                cell = {"status": "ok" if key in expected else "present"}
                if via != key:
                    cell["via"] = via
            else:
                cell = {"status": "missing" if key in expected else "absent"}
            row["keys"][key] = cell
            if key in expected:
                report.check(f"census:{op}:{key}", "census", "pass" if via else "fail",
                             f"{op} has a {key} kernel" + (f" (via {via})" if via and via != key else "")
                             if via else missing_key_message(ns, op, key), op=op, key=key)
    return rows
