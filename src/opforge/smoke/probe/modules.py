"""The census of compiled modules: the pybind11 modules and per-backend libraries a variant
promises (spec["modules"]), each checked on its own, whatever the package's Python swallows.

A module (``load: import``) must import and export its functions; a library (``load:
library``) must load with ``torch.ops.load_library`` in a fresh interpreter (libraries of one
package often register the same ops, so they cannot share a process) and register its ops.
Then FUNCTIONS, the recipes file's calls of module functions (or of the package's own
wrappers), run on each present device their recipe names: a device registry that fails only
at call time ("implementation for device cuda:0 not found") fails here.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys

from .common import Report, err_text, first_line
from .crashes import Breadcrumb, recipe_kind, report_crash
from .recipes import RecipeError, check_fields, where
from .rejections import REJECTED, classify, op_message
from .values import compare, outputs_of, to_device

FUNCTION_FIELDS = {"inputs", "dtypes", "devices", "expected", "atol", "rtol", "stub", "skip",
                   "derived"}
# A fresh interpreter per library: import torch and load one library, print its new ops.
_LOAD_ONE = (
    "import json, sys, torch\n"
    "before = set(torch._C._dispatch_get_all_op_names())\n"
    "try:\n"
    "    torch.ops.load_library(sys.argv[1])\n"
    "except BaseException as exc:\n"
    "    print(json.dumps({'error': f'{type(exc).__name__}: {exc}'})); sys.exit(0)\n"
    "print(json.dumps({'ops': sorted(set(torch._C._dispatch_get_all_op_names()) - before)}))\n"
)


def library_file(name: str, compiled: bool = True) -> str | None:
    """The file of a compiled module ``pkg._lib`` (any module's, unless ``compiled``),
    found without importing it."""
    package, _, leaf = name.rpartition(".")
    paths = None
    if package:
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            return None
        paths = list(spec.submodule_search_locations or []) if spec else None
        if not paths:
            return None
    spec = importlib.machinery.PathFinder.find_spec(leaf, paths)
    if spec is not None and spec.origin and (not compiled or spec.origin.endswith(
            tuple(importlib.machinery.EXTENSION_SUFFIXES) + (".so", ".dylib", ".pyd"))):
        return spec.origin
    for folder in paths or sys.path:  # a plain lib<name>.so / name.so beside the package
        for candidate in (f"{leaf}.so", f"lib{leaf}.so", f"{leaf}.dylib"):
            path = os.path.join(folder, candidate)
            if os.path.isfile(path):
                return path
    return None


def _check_module(report: Report, entry: dict, variant: str, row: dict) -> None:
    name = entry["name"]
    who = f"{name} ({entry.get('backend', 'cpu')} module{variant})"
    try:
        module = importlib.import_module(name)
    except BaseException as exc:  # noqa: BLE001 - the module's own error is the evidence
        row["imported"], row["error"] = False, err_text(exc)
        found = library_file(name, compiled=False)
        hidden = " (the package's own import hides this when it catches ImportError)"
        cause = f"the file is there ({found}) but does not import" if found else \
            "the wheel has no such module: it was not built"
        report.check(f"module:{name}", "modules", "fail",
                     f"{who} does not import: {first_line(exc)}; {cause}{hidden}. Fix: build "
                     "the variant with the toolkit its backend needs (FORCE_CUDA / the "
                     "variant's cuda) and check the build log for the module", module=name)
        for fn in entry.get("functions") or []:
            row["functions"][fn] = "missing"
        return
    row["imported"] = True
    row["file"] = getattr(module, "__file__", None)
    missing = []
    for fn in entry.get("functions") or []:
        ok = callable(getattr(module, fn, None))
        row["functions"][fn] = "ok" if ok else "missing"
        if not ok:
            missing.append(fn)
    exported = sorted(n for n in dir(module) if not n.startswith("_"))
    if missing:
        report.check(f"module:{name}", "modules", "fail",
                     f"{who} imports but does not export {', '.join(missing)} (it exports: "
                     f"{', '.join(exported) or 'nothing'}): a source file missing from its "
                     "build, or an m.def left out for this backend", module=name)
    else:
        report.check(f"module:{name}", "modules", "pass",
                     f"{who} imports and exports {len(entry.get('functions') or [])} "
                     "function(s)", module=name)


def _check_library(report: Report, entry: dict, variant: str, row: dict, namespace: str) -> None:
    name = entry["name"]
    who = f"{name} ({entry.get('backend', 'cpu')} library{variant})"
    path = library_file(name)
    row["file"] = path
    if path is None:
        row["imported"] = False
        for fn in entry.get("functions") or []:
            row["functions"][fn] = "missing"
        report.check(f"module:{name}", "modules", "fail",
                     f"{who} is not in the wheel: the package loads one library per backend "
                     "with torch.ops.load_library, and this backend's was not built",
                     module=name)
        return
    try:
        out = subprocess.run([sys.executable, "-c", _LOAD_ONE, path], capture_output=True,
                             text=True, timeout=300)
        result = json.loads(out.stdout.strip().splitlines()[-1]) if out.stdout.strip() \
            else {"error": (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]}
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        result = {"error": first_line(exc)}
    if "error" in result:
        row["imported"], row["error"] = False, result["error"]
        report.check(f"module:{name}", "modules", "fail",
                     f"{who} does not load with torch.ops.load_library: "
                     f"{result['error'][:600]}", module=name)
        return
    row["imported"] = True
    ops = {q.split("::", 1)[1].split(".", 1)[0] for q in result["ops"]
           if q.startswith(namespace + "::")}
    row["registers"] = sorted(ops)
    missing = [fn for fn in entry.get("functions") or [] if fn not in ops]
    for fn in entry.get("functions") or []:
        row["functions"][fn] = "missing" if fn in missing else "ok"
    if missing:
        report.check(f"module:{name}", "modules", "fail",
                     f"{who} loads but registers no {', '.join(missing)} in torch.ops."
                     f"{namespace} (it registers: {', '.join(sorted(ops)) or 'nothing'})",
                     module=name)
    else:
        report.check(f"module:{name}", "modules", "pass",
                     f"{who} loads on its own and registers {len(ops)} op(s) of torch.ops."
                     f"{namespace}", module=name)


def run_modules(report: Report, spec: dict, namespace: str, outside: str | None = None) -> None:
    """The census of the modules the variant promises. ``outside``: the package whose import
    failed; then only the modules that are not inside it are checked (``pkg_cpu`` beside
    ``pkg``, which imports without it: its absence is often why the package's import fails)."""
    entries = [e for e in spec.get("modules") or []
               if outside is None or e["name"].split(".")[0] != outside.split(".")[0]]
    table = report.doc.setdefault("modules", [])
    variant = f" the {report.doc['variant']} variant promises" if report.doc.get("variant") \
        else " the variant promises"
    for entry in entries:
        row = {"module": entry["name"], "backend": entry.get("backend", "cpu"),
               "load": entry.get("load", "import"), "functions": {}}
        table.append(row)
        if row["load"] == "library":
            _check_library(report, entry, variant, row, namespace)
        else:
            _check_module(report, entry, variant, row)


# --------------------------------------------------------------------------- FUNCTIONS

def resolve(dotted: str):
    """``pkg.mod.fn`` -> the callable (the longest importable module prefix, then attributes);
    an ImportError names the longest prefix that failed to import, if any."""
    parts = dotted.split(".")
    failed = None
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError as exc:
            failed = failed or f"import {'.'.join(parts[:cut])} fails: {first_line(exc)}"
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr, None)
            if obj is None:
                raise ImportError(failed or f"{dotted}: no attribute {attr!r}")
        return obj
    raise ImportError(failed or f"no module of {dotted!r} imports")


def function_recipes(path: str | None) -> dict:
    """FUNCTIONS of the recipes file the probe has loaded (RECIPES' module), or {}."""
    module = sys.modules.get("opforge_smoke_recipes")
    if not path or module is None:
        return {}
    functions = getattr(module, "FUNCTIONS", None)
    if functions is None:
        return {}
    if not isinstance(functions, dict):
        raise RecipeError(f"{path}: FUNCTIONS must be a dict (\"module.function\" -> recipe)")
    return functions


def run_functions(report: Report, t, devices: list[str], path: str | None,
                  import_ok: bool, crumb: Breadcrumb | None = None,
                  crashed: dict | None = None) -> None:

    crumb = crumb or Breadcrumb(None)

    try:
        functions = function_recipes(path)
    except RecipeError as exc:
        report.check("recipes:FUNCTIONS", "run", "fail", str(exc), recipe_error=True)
        return
    for key, recipe in functions.items():
        problem = check_fields(f"{path}: FUNCTIONS[{key!r}]", recipe, FUNCTION_FIELDS) \
            if isinstance(recipe, dict) else f"{path}: FUNCTIONS[{key!r}] must be a dict"
        if problem:
            report.check(f"call:{key}", "run", "fail", problem, recipe_error=True)
            continue
        if not import_ok:
            report.check(f"call:{key}", "run", "skip", "import failed", reason="import-failed")
            continue
        if recipe.get("stub"):
            report.check(f"stub:{key}", "run", "warn",
                         f"the recipe for {key} is the stub opforge init wrote from its "
                         "signature: it calls it once per device; edit it (known answers, "
                         "the package's own wrapper on every device) and drop \"stub\"",
                         reason="stub")
        if report_crash(report, crashed or {}, "function", key, "", path):
            continue
        wanted = list(recipe.get("devices") or ["cpu"])
        fn = None
        if any(device in devices for device in wanted):  # else every device is skipped below
            try:
                fn = resolve(key)
            except Exception as exc:  # noqa: BLE001
                report.check(f"call:{key}", "run", "fail", f"{key} cannot be reached: "
                             f"{exc if isinstance(exc, ImportError) else first_line(exc)}")
                continue
        _call_on_devices(report, t, key, recipe, fn, wanted, devices, path, crumb)
        crumb.clear()


def _call_on_devices(report: Report, t, key: str, recipe: dict, fn, wanted: list[str],
                     devices: list[str], path: str | None, crumb: Breadcrumb) -> None:
    """One module function called on each device its recipe names, compared with the CPU."""
    cpu_out = refused = None
    for device in wanted:
        check_id = f"call:{key}:{device}"
        if refused:
            report.check(check_id, "run", "skip", f"{key} refused the stub's inputs on cpu "
                         f"({refused}): nothing to check until its recipe is written",
                         device=device, reason="stub-rejected")
            continue
        if device not in devices:
            entry = report.doc["devices"].get(device) or {}
            report.check(check_id, "run", "skip", f"skipped-no-device: "
                         f"{entry.get('detail') or device + ' is not present'}",
                         device=device, reason="no-device")
            continue
        reason = (recipe.get("skip") or {}).get("run")
        if reason:
            report.check(check_id, "run", "skip", f"recipe: {reason}", device=device,
                         reason="recipe")
            continue
        try:
            args = recipe["inputs"](t.float32)
        except Exception as exc:  # noqa: BLE001
            report.check(check_id, "run", "fail", f"recipe {key!r} inputs raised "
                         f"{first_line(exc)} at {where(exc, path or '')}", recipe_error=True)
            break
        args = [to_device(t, a, device) for a in args]
        crumb.at(kind="function", name=key, check="run", device=device,
                 recipe=recipe_kind(recipe))
        try:
            out = fn(*args)
        except Exception as exc:  # noqa: BLE001 - the call-time failure is the finding
            kind, _ = classify(exc)
            if recipe.get("stub") and kind == REJECTED:  # the function's own checks
                said = op_message(exc)
                report.check(check_id, "run", "warn", f"stub inputs rejected by {key}"
                             + ("" if device == "cpu" else f" on {device}")
                             + f": \"{said}\" \u2014 write a recipe for {key} in {path} "
                             "(FUNCTIONS; docs/adopt.md#2-fill-in-the-recipes) or run "
                             "opforge recipes --derive", device=device,
                             reason="stub-rejected", rejected=said)
                refused = check_id if device == "cpu" else None
                continue
            report.check(check_id, "run", "fail", f"{key} on {device} raised "
                         f"{first_line(exc)}", device=device, error_kind=kind)
            continue
        got = [o.cpu() if isinstance(o, t.Tensor) else o for o in outputs_of(out)]
        problem = None
        if device == "cpu" or cpu_out is None:
            cpu_out = got if device == "cpu" else cpu_out
            if "expected" in recipe and device == "cpu":
                want = recipe["expected"]
                problem = compare(t, outputs_of(want), got, recipe.get("atol", 1e-4),
                                  recipe.get("rtol", 1e-3))
        else:
            problem = compare(t, cpu_out, got, recipe.get("atol", 1e-4),
                              recipe.get("rtol", 1e-3))
        report.check(check_id, "run", "fail" if problem else "pass",
                     f"{key} on {device}: {problem}" if problem else
                     f"{key} runs on {device}" + (" and matches the CPU" if
                                                  device != "cpu" and cpu_out else ""),
                     device=device)
