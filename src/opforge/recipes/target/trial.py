"""``probe.pyz derive``: call an op (or a module's function) with the arguments the search
proposes, on the CPU, twice, and say whether it ran and gave the same finite result both
times (the smoke fails a CPU run whose output is nan or inf).

Protocol, one JSON object per line on the real stdout (whatever the extension prints goes to
stderr): first ``{"ready": true, "torch": version}`` once torch and the package imported (or
``{"error": message}`` and exit 1); then for each request one answer:

  {"schema": op, "overload": "default"}   -> {"schema": "op(Tensor src, ...) -> Tensor"}
  {"call": key, "kind": "op" | "function", "overload": ..., "inputs": "lambda dtype: [...]",
   "mutates": [i, ...]}                    -> {"ok": true, "result": "..."} or
                                              {"ok": false, "error": "Type: message"}

A call that hangs or kills the interpreter is the caller's to time out and restart.
Standard library and torch only, like the rest of the probe.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import sys
import warnings

from ...smoke.probe.common import first_line, own_stdout
from ...smoke.probe.modules import resolve
from ...smoke.probe.rejections import beyond_inputs
from ...smoke.probe.values import compare, outputs_of

RANDOM = "results differ between two calls"   # clues.RANDOM reads this
NONFINITE = "returned non-finite values"      # and clues.NONFINITE this


def parse_args(argv):
    p = argparse.ArgumentParser(description="opforge derive: trial calls")
    p.add_argument("--package", default="")
    p.add_argument("--namespace", required=True)
    return p.parse_args(argv)


def error_text(exc: BaseException) -> str:
    """The exception's type and message, without torch's C++ backtrace; bounded."""
    text = str(exc).split("\nException raised from", 1)[0].strip()
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return first_line(exc)
    return f"{type(exc).__name__}: {' '.join(line.strip() for line in lines[:6])}"[:1500]


def summary(t, values) -> str:
    parts = []
    for v in values:
        if isinstance(v, t.Tensor):
            parts.append(f"{str(v.dtype).replace('torch.', '')}{list(v.shape)}")
        else:
            parts.append(type(v).__name__)
    return ", ".join(parts) or "None"


_PY_TYPES = {"torch.Tensor": "Tensor", "Tensor": "Tensor", "int": "int", "float": "float",
             "bool": "bool", "str": "str", "List[int]": "int[]", "list[int]": "int[]",
             "List[float]": "float[]", "list[float]": "float[]",
             "List[torch.Tensor]": "Tensor[]", "list[torch.Tensor]": "Tensor[]",
             "Optional[torch.Tensor]": "Tensor?", "torch.Tensor | None": "Tensor?",
             "Optional[int]": "int?", "Optional[float]": "float?"}


def _pybind_signature(fn) -> str | None:
    """``name(arg0: torch.Tensor, k: int = 3) -> torch.Tensor`` from a pybind11 docstring, as
    schema arguments; None when a type is unknown."""
    doc = (getattr(fn, "__doc__", None) or "").strip().splitlines()
    head = doc[0] if doc else ""
    name = getattr(fn, "__name__", "")
    if not head.startswith(f"{name}(") or ")" not in head:
        return None
    inner = head[len(name) + 1:head.rindex(")")]
    if "->" in inner:
        inner = inner[:inner.index(")")] if ")" in inner else inner
    out = []
    for i, part in enumerate(p.strip() for p in inner.split(",") if p.strip()):
        decl, _, default = part.partition("=")
        pname, _, ptype = decl.partition(":")
        kind = _PY_TYPES.get(ptype.strip())
        if kind is None:
            return None
        out.append(f"{kind} {pname.strip() or f'arg{i}'}"
                   + (f"={default.strip()}" if default.strip() else ""))
    return f"{name}({', '.join(out)})"


def signature_of(fn) -> str | None:
    """A module function's parameters as a schema: a pybind11 function's docstring, else the
    Python signature (annotations read; an unannotated parameter without a default is a
    tensor, one with a default has its default's type)."""
    found = _pybind_signature(fn)
    if found:
        return found
    doc = (getattr(fn, "__doc__", None) or "").lstrip()
    if doc.startswith(f"{getattr(fn, '__name__', '')}(") and "->" in doc.split("\n")[0]:
        return None   # a pybind11 signature with a type no call can be made for
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    out = []
    for p in sig.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.KEYWORD_ONLY):
            continue
        note = p.annotation
        note = note if isinstance(note, str) else getattr(note, "__name__", None) \
            if note is not p.empty else None
        kind = _PY_TYPES.get(note or "") or _PY_TYPES.get(f"torch.{note}" if note else "")
        default = "" if p.default is p.empty else repr(p.default)
        if kind is None:
            if p.default is p.empty or p.default is None:
                kind = "Tensor?" if p.default is None else "Tensor"
            else:
                kind = {bool: "bool", int: "int", float: "float", str: "str"}.get(
                    type(p.default))
                if kind is None:
                    return None
        out.append(f"{kind} {p.name}" + (f"={default}" if default else ""))
    return f"{getattr(fn, '__name__', 'fn')}({', '.join(out)})"


class Trial:
    def __init__(self, t, namespace: str):
        self.t, self.namespace = t, namespace

    def target(self, request: dict):
        if request.get("kind") == "function":
            return resolve(request["call"])
        packet = getattr(getattr(self.t.ops, self.namespace), request["call"])
        return getattr(packet, request.get("overload") or "default")

    def schema(self, request: dict) -> dict:
        try:
            fn = self.target({"call": request["schema"], "kind": request.get("kind"),
                              "overload": request.get("overload")})
            if request.get("kind") == "function":
                found = signature_of(fn)
                return {"schema": found} if found else {"error": "no readable signature"}
            return {"schema": str(fn._schema)}
        except Exception as exc:  # noqa: BLE001 - no such op: the caller says so
            return {"error": error_text(exc)}

    def call(self, request: dict) -> dict:
        t = self.t
        try:
            fn = self.target(request)
            make = eval(request["inputs"], {"torch": t})  # noqa: S307 - the search's own text
        except Exception as exc:  # noqa: BLE001
            return {"ok": False, "error": error_text(exc), "stage": "setup", "final": True}
        results = []
        for _ in range(2):
            try:
                args = list(make(t.float32))
            except Exception as exc:  # noqa: BLE001 - an input the search could not build
                return {"ok": False, "error": error_text(exc), "stage": "inputs"}
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    out = fn(*args)
            except Exception as exc:  # noqa: BLE001 - the op's own message is the clue
                return {"ok": False, "error": error_text(exc), "stage": "call",
                        "final": beyond_inputs(exc)}
            mutates = request.get("mutates") or []
            values = [args[i] for i in mutates if i < len(args)] if mutates else outputs_of(out)
            # tensors only: a function may also return what differs by nature (timings,
            # a profile dict), which says nothing of the inputs
            results.append([v.detach().clone() for v in values if isinstance(v, t.Tensor)])
            shown = values
        try:
            problem = compare(t, results[0], results[1], 1e-5, 1e-4)
        except Exception as exc:  # noqa: BLE001 - results that do not compare
            problem = error_text(exc)
        if problem:
            return {"ok": False, "error": f"{RANDOM}: {problem}", "stage": "repeat"}
        # the smoke fails a CPU run whose floating output is nan or inf: not a working call
        bad = sum(int((~t.isfinite(v)).sum()) for v in results[0] if v.is_floating_point())
        if bad:
            return {"ok": False, "error": f"{NONFINITE}: {bad} nan or inf", "stage": "repeat"}
        return {"ok": True, "result": summary(t, shown)}


def main(argv=None) -> int:
    args = parse_args(argv)
    say = own_stdout()  # the protocol owns the real stdout; the extension's prints go to stderr

    # torch (~1 s): imported once the trial process starts, in the target
    try:
        import torch

        if args.package:
            importlib.import_module(args.package)
    except BaseException as exc:  # noqa: BLE001 - the import of torch or the package failed
        say({"error": f"import {args.package or 'torch'} fails: {error_text(exc)}"})
        return 1
    trial = Trial(torch, args.namespace)
    say({"ready": True, "torch": torch.__version__})
    for line in sys.stdin:
        try:
            request = json.loads(line)
            say(trial.schema(request) if "schema" in request else trial.call(request))
        except Exception as exc:  # noqa: BLE001 - a malformed request
            say({"ok": False, "error": error_text(exc), "stage": "request"})
    return 0
