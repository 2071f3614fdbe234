"""The probe's entry point: arguments, the order of the seams, the one JSON document."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import sys
import time
import traceback

from . import recipes as recipes_file
from .causes import diagnose
from .census import run_census
from .common import SCHEMA, Report, first_line
from .crashes import Breadcrumb
from .devices import probe_devices
from .load import probe_import
from .modules import run_functions, run_modules
from .runs import OpRunner


def environment(t) -> dict:
    return {
        "python": platform.python_version(),
        "executable": sys.executable,
        "prefix": sys.prefix,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cwd": os.getcwd(),
        "torch_version": t.__version__,
        "torch_git_version": getattr(t.version, "git_version", None),
        "torch_cuda_version": t.version.cuda,
        "torch_file": t.__file__,
        "cuda_available": bool(t.cuda.is_available()),
        "mps_available": bool(getattr(t.backends, "mps", None) and t.backends.mps.is_available()),
    }




def parse_args(argv):
    p = argparse.ArgumentParser(description="opforge smoke probe")
    p.add_argument("--package", required=True)
    p.add_argument("--namespace", required=True)
    # JSON: what the variant under test promises (the runner chose it): op_keys {op: [keys]},
    # backward_ops, default_keys, modules [{name, backend, load, functions}] (the compiled
    # modules to check); recipes (a path); speed {enabled, factor, op_factors, devices};
    # no_kernel {op: [devices]} (the devices an op has no kernel for by design); at (a path:
    # where the probe is, written before each call) and crashed {kind:name: where} (the calls
    # that killed an earlier probe: crashes.py)
    p.add_argument("--spec", type=_read_spec, default={})
    p.add_argument("--device-checks", choices=("auto", "skip"), default="auto")
    p.add_argument("--out", required=True)
    return p.parse_args(argv)


def _read_spec(path: str) -> dict:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def load_recipes(report: Report, path: str | None) -> dict | None:
    if not path:
        return None
    try:
        return recipes_file.load(path)
    except recipes_file.RecipeError as exc:
        report.check("recipes", "run", "fail", f"recipes file: {exc}", recipe_error=True)
        return None


def probe(args) -> dict:
    report = Report(args)
    try:
        t0 = time.monotonic()
        # torch (~1 s) is imported, and timed, here: the probe's first seam
        import torch
        report.doc["environment"] = environment(torch)
        report.doc["environment"]["torch_import_seconds"] = round(time.monotonic() - t0, 3)
    except BaseException as exc:  # noqa: BLE001
        report.doc["environment"] = {"python": platform.python_version(),
                                     "executable": sys.executable}
        report.check("import-torch", "import", "fail",
                     f"import torch fails in {sys.executable}: {first_line(exc)}")
        return report.finish()
    import_ok = probe_import(report, args, torch)
    rows = run_census(report, args.spec, args.namespace, torch)
    # the modules a variant promises, each on its own (pybind11, per-backend libs); where the
    # package does not import, those beside it still are
    run_modules(report, args.spec, args.namespace, outside=None if import_ok else args.package)
    devices = probe_devices(report, args, torch)
    path = args.spec.get("recipes")
    recipes = load_recipes(report, path) if import_ok else None
    crumb, crashed = Breadcrumb(args.spec.get("at")), args.spec.get("crashed") or {}
    OpRunner(report, torch, args.namespace, rows, devices, recipes, path,
             args.spec.get("speed"), args.spec.get("no_kernel"), crumb, crashed).run_all(import_ok)
    if recipes is not None:
        run_functions(report, torch, devices, path, import_ok, crumb, crashed)
    try:
        diagnose(report, torch, args.namespace, args.package, args.spec)
    except Exception as exc:  # noqa: BLE001 - the symptoms still stand without their cause
        report.check("diagnosis", "probe", "warn", "the probe could not decide the cause: "
                     + "".join(traceback.format_exception_only(type(exc), exc)).strip())
    return report.finish()


def main(argv=None) -> int:
    args = parse_args(argv)
    # stray prints from the package under test must not corrupt anything; keep them for the report
    captured = io.StringIO()
    with contextlib.redirect_stdout(captured):
        try:
            doc = probe(args)
        except BaseException as exc:  # noqa: BLE001 - the probe must always write its document
            doc = {"schema": SCHEMA, "package": args.package, "namespace": args.namespace,
                   "probe_error": "".join(traceback.format_exception(type(exc), exc,
                                                                     exc.__traceback__)),
                   "checks": [], "summary": {"status": "fail", "pass": 0, "fail": 1,
                                              "warn": 0, "skip": 0}}
    doc["stdout"] = captured.getvalue()[-4000:]
    with open(args.out, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=1, default=str)
    return 0 if doc["summary"]["status"] == "pass" else 1
