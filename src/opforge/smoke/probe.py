"""opforge smoke probe: runs inside the environment under test and writes one JSON document.

Run as a script by a fresh interpreter (``python probe.py --package P --namespace N --out F``).
It imports only the standard library and torch, so it runs on any target without opforge
installed. Every finding is a *check* (pass / fail / warn / skip) with a message a user can act
on; docs/smoke.md documents the JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import importlib
import importlib.metadata
import importlib.util
import io
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
import traceback
import warnings

SCHEMA = 1
# Columns the census always shows, expected or not, so a reader sees what a wheel holds.
OBSERVED_KEYS = ("CPU", "CUDA", "MPS", "Meta", "Autograd", "AutocastCPU", "AutocastCUDA",
                 "AutocastMPS")
BACKEND_KEYS = ("CPU", "CUDA", "MPS", "XPU", "Meta")
DEVICES = ("cpu", "cuda", "mps")
DEVICE_KEY = {"cpu": "CPU", "cuda": "CUDA", "mps": "MPS"}
AUTOCAST_KEY = {"cpu": "AutocastCPU", "cuda": "AutocastCUDA", "mps": "AutocastMPS"}
# Libraries only a CUDA build of torch ships or loads: missing one means a CUDA build of the
# extension was installed beside a torch that has no CUDA.
CUDA_LIBS = ("libcudart", "libc10_cuda", "libtorch_cuda", "libcublas", "libcudnn", "libnvrtc",
             "libcusparse", "libcufft", "libcurand", "libcusolver", "libnccl", "libnvToolsExt",
             "libnvJitLink", "libcupti")
TORCH_LIBS = ("libc10", "libtorch", "libtorch_cpu", "libtorch_python", "libshm")
LIB_SUFFIXES = (".so", ".pyd", ".dylib")


def _err(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text if len(text) < 1500 else text[:1500] + " ..."


def _first_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    text = lines[0] if lines else ""
    # the dispatcher's "Could not run" error goes on for a paragraph after its first sentence
    text = text.split(" This could be because the operator", 1)[0]
    return f"{type(exc).__name__}: {text}".strip()


class Report:
    def __init__(self, args: argparse.Namespace):
        self.started = time.monotonic()
        self.doc: dict = {
            "schema": SCHEMA,
            "package": args.package,
            "namespace": args.namespace,
            "expected_keys": list(args.expect_keys),
            "internal_keys": [k for k in args.expect_keys if k in BACKEND_KEYS],
            "expected_ops": list(args.ops),
            "expected_internal_ops": list(args.internal_ops),
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


# --------------------------------------------------------------------------- the package on disk


def base_version(version: str | None) -> str | None:
    return version.split("+", 1)[0] if version else None


def package_dir(package: str) -> str | None:
    """The package's directory, found without executing it."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return list(spec.submodule_search_locations)[0]
    return os.path.dirname(spec.origin) if spec.origin else None


def compiled_libraries(pkg_dir: str, main_library: str | None) -> list[str]:
    found = []
    for root, _dirs, files in os.walk(pkg_dir):
        for name in files:
            if name.endswith(LIB_SUFFIXES) or ".so." in name:
                found.append(os.path.join(root, name))
    # The library the build info names first: its error is the one that explains the import.
    def rank(path: str) -> tuple[int, str]:
        stem = os.path.basename(path).split(".", 1)[0]
        return (0 if main_library and stem == main_library else 1, path)
    return sorted(found, key=rank)


def read_build_facts(package: str, pkg_dir: str | None) -> dict:
    """What the package was built against: _build_info.json, else the wheel's torch pin."""
    facts: dict = {"build_info": None, "distribution": None, "distribution_version": None,
                   "torch_requirement": None, "built_against_torch": None, "source": None}
    if pkg_dir:
        path = os.path.join(pkg_dir, "_build_info.json")
        if os.path.isfile(path):
            try:
                with open(path, encoding="utf-8") as fh:
                    facts["build_info"] = json.load(fh)
            except (OSError, ValueError) as exc:
                facts["build_info_error"] = f"{path}: {exc}"
    try:
        dists = importlib.metadata.packages_distributions().get(package, [])
    except Exception:  # noqa: BLE001 - a broken metadata directory must not stop the probe
        dists = []
    for dist_name in dists:
        try:
            dist = importlib.metadata.distribution(dist_name)
        except importlib.metadata.PackageNotFoundError:
            continue
        facts["distribution"] = dist.metadata["Name"]
        facts["distribution_version"] = dist.version
        for req in dist.requires or []:
            # "torch==2.13.0", "torch (>=2.14.0)"; requirements behind a marker (extras) do not count
            m = re.match(r"^\s*torch\s*\(?\s*([=<>!~][^;()]*)\)?\s*$", req)
            if m:
                facts["torch_requirement"] = "torch" + re.sub(r"\s+", "", m.group(1))
        break
    info = facts["build_info"] or {}
    if info.get("torch_version"):
        facts["built_against_torch"] = info["torch_version"]
        facts["source"] = f"{package}/_build_info.json"
    elif facts["torch_requirement"]:
        pin = re.match(r"^torch\s*==\s*([\w.+!-]+)$", facts["torch_requirement"])
        if pin:
            facts["built_against_torch"] = pin.group(1)
            facts["source"] = f"{facts['distribution']} wheel pin {facts['torch_requirement']}"
    return facts


# --------------------------------------------------------------------------- import diagnosis


def demangle(symbol: str) -> str:
    tool = shutil.which("c++filt")
    if not tool:
        return symbol
    try:
        out = subprocess.run([tool, symbol.lstrip("_") if sys.platform == "darwin" else symbol],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or symbol
    except (OSError, subprocess.SubprocessError):
        return symbol


def classify_load_error(lib: str, error: str, build: dict, torch_mod) -> dict:
    """Turn a dlopen error into a diagnosis: kind, message, what to do."""
    name = os.path.basename(lib)
    built = build.get("built_against_torch")
    running = torch_mod.__version__
    versions = (f"built against torch {built} ({build.get('source')}), running torch {running}"
                if built else f"running torch {running}; the build's torch is unknown "
                              "(no _build_info.json and no torch==X pin)")
    m = re.search(r"undefined symbol: (\S+)", error) or re.search(r"Symbol not found: (\S+)", error)
    if m:
        symbol = m.group(1).rstrip(",")
        pretty = demangle(symbol)
        drift = built is not None and base_version(built) != base_version(running)
        if drift:
            todo = (f"install the torch it was built against (pip install torch=={base_version(built)}) "
                    f"or rebuild {name} against torch {running}")
            message = (f"ABI drift: {name} needs symbol {pretty}, which torch {running} does not "
                       f"export; {versions}. Fix: {todo}.")
        else:
            message = (f"{name} needs symbol {pretty}, which no loaded library provides; {versions}. "
                       "The library was linked against a different torch or a library not "
                       "loaded here: rebuild it in this environment.")
        return {"kind": "abi_drift" if drift else "undefined_symbol", "library": lib,
                "symbol": symbol, "demangled": pretty, "message": message, "error": error}
    m = (re.search(r"([^\s:]+): cannot open shared object file", error)
         or re.search(r"Library not loaded: (\S+)", error))
    if m:
        missing = os.path.basename(m.group(1))
        torch_cuda = getattr(torch_mod.version, "cuda", None)
        if missing.startswith(CUDA_LIBS) and not torch_cuda:
            message = (f"{name} links {missing}, a CUDA library, but torch {running} is a CPU build: "
                       "a CUDA build of the extension was installed beside a CPU torch. Fix: "
                       "install the extension's CPU wheel, or a CUDA build of torch "
                       f"(built against: {built or 'unknown'}).")
            kind = "cuda_extension_cpu_torch"
        elif missing.startswith(CUDA_LIBS):
            message = (f"{name} links {missing}, which this CUDA {torch_cuda} torch does not "
                       "provide: the extension was built for another CUDA version "
                       f"(build info cuda_version: {(build.get('build_info') or {}).get('cuda_version')}). "
                       "Fix: install the extension variant that matches this torch's CUDA.")
            kind = "cuda_mismatch"
        elif missing.startswith(TORCH_LIBS):
            message = (f"{name} links {missing}, torch's own library, and cannot find it: "
                       f"torch {running} is not the build it was linked against ({versions}), "
                       "or torch was not imported first.")
            kind = "missing_library"
        else:
            message = (f"{name} links {missing}, which is neither installed on this system nor "
                       "bundled in the wheel. Fix: install the package that provides "
                       f"{missing}, or repair the wheel (auditwheel repair / delocate) so it "
                       "ships inside.")
            kind = "missing_library"
        return {"kind": kind, "library": lib, "missing": missing, "message": message,
                "error": error}
    return {"kind": "load_error", "library": lib, "error": error,
            "message": f"{name} failed to load: {error}"}


def probe_import(report: Report, args, torch_mod) -> bool:
    package = args.package
    info = report.doc["import"]
    pkg_dir = package_dir(package)
    build = read_build_facts(package, pkg_dir)
    report.doc["build"] = build
    info["package_dir"] = pkg_dir
    t0 = time.monotonic()
    exc_info = None
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            module = importlib.import_module(package)
        info["warnings"] = sorted({str(w.message).splitlines()[0] for w in caught})[:10]
        info["ok"] = True
        info["file"] = getattr(module, "__file__", None)
        info["version"] = getattr(module, "__version__", None)
    except BaseException as exc:  # noqa: BLE001 - SystemExit from a package is a failed import too
        exc_info = exc
        info["ok"] = False
        info["error"] = _err(exc)
        info["traceback"] = traceback.format_exception(type(exc), exc, exc.__traceback__)[-8:]
    info["seconds"] = round(time.monotonic() - t0, 3)

    libs = compiled_libraries(pkg_dir, (build.get("build_info") or {}).get("library")) \
        if pkg_dir else []
    info["libraries"] = []
    diagnoses = []
    for lib in libs:
        try:
            ctypes.CDLL(lib)
            info["libraries"].append({"path": lib, "loaded": True})
        except OSError as exc:
            diag = classify_load_error(lib, str(exc), build, torch_mod)
            info["libraries"].append({"path": lib, "loaded": False, "error": str(exc),
                                      "kind": diag["kind"]})
            diagnoses.append(diag)

    if pkg_dir is None:
        diagnosis = {"kind": "not_installed",
                     "message": f"no package {package!r} is importable by {sys.executable}: "
                                "install it in this environment (or check --package)."}
    elif diagnoses:
        diagnosis = diagnoses[0]
        if info["ok"]:
            diagnosis = dict(diagnosis, kind=diagnosis["kind"], message=(
                f"import {package} succeeded but hid a load failure: " + diagnosis["message"]))
    elif not info["ok"]:
        frames = traceback.extract_tb(exc_info.__traceback__) if exc_info else []
        # the package's own line that failed, not torch's __getattr__ it called
        root = os.path.join(os.path.realpath(pkg_dir), "")
        own = [f for f in frames if os.path.realpath(f.filename).startswith(root)]
        frame = (own or frames)[-1:]
        where = f" at {frame[0].filename}:{frame[0].lineno}" if frame else ""
        kind = "no_library" if not libs and isinstance(exc_info, (ImportError, OSError)) \
            else "python_error"
        if kind == "no_library":
            message = (f"{package} has no compiled library (no .so/.pyd/.dylib under {pkg_dir}) and "
                       f"its import fails with {_first_line(exc_info)}{where}: the wheel was built "
                       "without its extension or the file was removed. Fix: rebuild the wheel.")
        else:
            loaded = f"every compiled library ({len(libs)}) loads" if libs else \
                "there is no compiled library to blame"
            message = f"{loaded}, so the failure is in Python: {_first_line(exc_info)}{where}"
        diagnosis = {"kind": kind, "message": message}
    else:
        loads = {0: "no compiled library", 1: "its compiled library loads"}.get(
            len(libs), f"its {len(libs)} compiled libraries load")
        diagnosis = {"kind": "ok", "message": f"import {package} succeeded ({loads})"}
        if not libs:
            diagnosis["no_library"] = True
    info["diagnosis"] = diagnosis
    ok = info["ok"] and not diagnoses
    report.check("import", "import", "pass" if ok else "fail", diagnosis["message"],
                 kind=diagnosis["kind"])

    built, running = build.get("built_against_torch"), torch_mod.__version__
    env = report.doc["environment"]
    env["built_against_torch"] = built
    env["torch_matches_build"] = None if built is None else base_version(built) == base_version(running)
    if built is None:
        req = build.get("torch_requirement")
        report.check("torch-match", "environment", "skip",
                     f"the torch {package} was built against is unknown: no _build_info.json and "
                     + (f"its torch requirement {req} is not an exact pin" if req
                        else "no torch requirement"), reason="unknown")
    elif env["torch_matches_build"]:
        report.check("torch-match", "environment", "pass",
                     f"running torch {running}, built against {built} ({build['source']})")
    else:
        outcome = "and it loads" if ok else "and it does not load (see import)"
        report.check("torch-match", "environment", "warn",
                     f"{package} was built against torch {built} ({build['source']}) but torch "
                     f"{running} is running, {outcome}: C++ ABI across torch releases is not "
                     "guaranteed; use the wheel with the torch it pins.")
    return info["ok"]


# --------------------------------------------------------------------------- census


def namespace_ops(torch_mod, namespace: str) -> list[str]:
    prefix = namespace + "::"
    names = set()
    for qualname in torch_mod._C._dispatch_get_all_op_names():
        if qualname.startswith(prefix):
            names.add(qualname[len(prefix):].split(".", 1)[0])
    return sorted(names)


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
    if key in ("CPU", "CUDA", "MPS", "XPU"):
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


def run_census(report: Report, args, torch_mod) -> dict[str, dict]:
    ns = args.namespace
    known = getattr(torch_mod._C, "DispatchKey", None)
    unknown = [k for k in args.expect_keys if known is not None and k not in known.__members__]
    if unknown:
        report.check("census-keys", "census", "fail",
                     f"torch {torch_mod.__version__} has no dispatch key {', '.join(unknown)}: "
                     "check --expect-keys / the variant's expected_keys")
        args.expect_keys = [k for k in args.expect_keys if k not in unknown]
    found = namespace_ops(torch_mod, ns)
    declared_any = bool(args.ops or args.internal_ops)
    ops = list(dict.fromkeys([*args.ops, *args.internal_ops, *found]))
    keys = list(dict.fromkeys([*args.expect_keys, *OBSERVED_KEYS]))
    report.doc["census"]["keys"] = keys
    rows = {}
    for op in ops:
        internal = op in args.internal_ops or (not declared_any and op.startswith("_"))
        declared = op in args.ops or op in args.internal_ops or not declared_any
        expected = [k for k in args.expect_keys if k in BACKEND_KEYS] if internal \
            else list(args.expect_keys)
        qualname = f"{ns}::{op}"
        row = {"op": op, "qualname": qualname, "found": op in found, "internal": internal,
               "declared": declared, "keys": {}}
        rows[op] = row
        report.doc["census"]["ops"].append(row)
        if op not in found:
            for key in keys:
                row["keys"][key] = {"status": "missing" if key in expected else "absent"}
            status = "fail" if declared else "warn"
            report.check(f"census:{op}", "census", status,
                         f"{qualname} is not registered: torch.ops.{ns}.{op} fails with "
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


# --------------------------------------------------------------------------- devices


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
        else:
            entry["built"] = entry["available"] = True
        if entry["available"]:
            try:
                x = torch_mod.arange(64, dtype=torch_mod.float32, device=dev)
                total = float((x * 2).sum().cpu())
                if total != 4032.0:
                    raise RuntimeError(f"2*sum(arange(64)) gave {total}, expected 4032")
                entry["present"] = True
                if dev == "cuda":
                    entry["name"] = torch_mod.cuda.get_device_name(0)
                    entry["count"] = torch_mod.cuda.device_count()
            except Exception as exc:  # noqa: BLE001
                entry["present"] = False
                entry["detail"] = (f"{dev} reports available but a 256-byte allocation and sum "
                                   f"failed: {_first_line(exc)}")
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


# --------------------------------------------------------------------------- op recipes
# A recipe builds tiny CPU inputs for one op of the torchvision-style schema family and knows
# which arguments are tensors (moved to the device) and what the CPU answer must be.


def _boxes(torch_mod):
    dets = torch_mod.tensor([[0.0, 0.0, 10.0, 10.0], [1.0, 1.0, 11.0, 11.0],
                             [50.0, 50.0, 60.0, 60.0], [0.0, 0.0, 9.0, 10.0],
                             [52.0, 50.0, 62.0, 61.0]])
    scores = torch_mod.tensor([0.9, 0.8, 0.7, 0.95, 0.6])
    return dets, scores


def _rois(torch_mod):
    return torch_mod.tensor([[0.0, 0.5, 0.5, 4.5, 3.5], [0.0, 1.0, 0.0, 3.0, 4.0],
                             [1.0, 0.0, 0.0, 5.0, 5.0]])


def _features(torch_mod, channels):
    g = torch_mod.Generator().manual_seed(0)
    return torch_mod.rand(2, channels, 6, 6, generator=g)


def recipe_nms(t):
    dets, scores = _boxes(t)
    # boxes 3, 0, 1 overlap (IoU > 0.5): 3 wins; boxes 2 and 4 overlap: 2 wins
    return {"args": [dets, scores, 0.5], "grad": [], "known": t.tensor([3, 2])}


def recipe_roi_align(t):
    x = _features(t, 3)
    return {"args": [x, _rois(t), 1.0, 2, 2, 2, True], "grad": [0]}


def recipe_roi_pool(t):
    x = _features(t, 3)
    return {"args": [x, _rois(t), 1.0, 2, 2], "grad": [0]}


def recipe_ps_roi_align(t):
    return {"args": [_features(t, 8), _rois(t), 1.0, 2, 2, 2], "grad": [0]}


def recipe_ps_roi_pool(t):
    return {"args": [_features(t, 8), _rois(t), 1.0, 2, 2], "grad": [0]}


def recipe_deform_conv2d(t):
    g = t.Generator().manual_seed(1)
    x = t.rand(1, 2, 5, 5, generator=g)
    w = t.rand(3, 2, 3, 3, generator=g)
    b = t.rand(3, generator=g)
    offset = (t.rand(1, 18, 5, 5, generator=g) - 0.5)
    mask = t.rand(1, 9, 5, 5, generator=g)
    return {"args": [x, w, offset, mask, b, 1, 1, 1, 1, 1, 1, 1, 1, True], "grad": [0, 1, 2, 3, 4]}


# op name -> (recipe, schema argument names it was written for)
RECIPES = {
    "nms": (recipe_nms, ("dets", "scores", "iou_threshold")),
    "roi_align": (recipe_roi_align, ("input", "rois", "spatial_scale", "pooled_height",
                                     "pooled_width", "sampling_ratio", "aligned")),
    "roi_pool": (recipe_roi_pool, ("input", "rois", "spatial_scale", "pooled_height",
                                   "pooled_width")),
    "ps_roi_align": (recipe_ps_roi_align, ("input", "rois", "spatial_scale", "pooled_height",
                                           "pooled_width", "sampling_ratio")),
    "ps_roi_pool": (recipe_ps_roi_pool, ("input", "rois", "spatial_scale", "pooled_height",
                                         "pooled_width")),
    "deform_conv2d": (recipe_deform_conv2d, ("input", "weight", "offset", "mask", "bias",
                                             "stride_h", "stride_w", "pad_h", "pad_w",
                                             "dilation_h", "dilation_w", "groups",
                                             "offset_groups", "use_mask")),
}
AUTOCAST_OPS = ("nms", "roi_align")
KNOWN_ANSWERS = ("nms", "roi_align", "roi_pool", "deform_conv2d")


def known_answer(t, fn, op: str, args: list, out) -> str | None:
    """An independent check of the CPU result; None when it holds."""
    if op == "nms":
        if out.tolist() != [3, 2]:
            return f"nms kept {out.tolist()}, expected [3, 2]"
    elif op == "deform_conv2d":
        # zero offsets and a mask of ones make deformable convolution a plain convolution
        x, w, offset, mask, b = args[:5]
        got = fn(x, w, t.zeros_like(offset), t.ones_like(mask),
                                                    b, *args[5:])
        want = t.nn.functional.conv2d(x, w, b, stride=1, padding=1)
        if not t.allclose(got, want, atol=1e-5, rtol=1e-4):
            return (f"deform_conv2d with zero offsets differs from conv2d by "
                    f"{float((got - want).abs().max()):.3g}")
    elif op in ("roi_align", "roi_pool"):
        # a feature map constant per channel gives that constant in every bin
        x = t.arange(1.0, 1.0 + args[0].shape[1]).view(1, -1, 1, 1).expand_as(args[0]).contiguous()
        res = fn(x, *args[1:])
        res = res[0] if isinstance(res, (tuple, list)) else res
        want = t.arange(1.0, 1.0 + args[0].shape[1]).view(1, -1, 1, 1).expand_as(res)
        if not t.allclose(res, want, atol=1e-5):
            return f"{op} on a constant feature map did not return the constant"
    return None


def _to(t, value, device, dtype=None):
    if isinstance(value, t.Tensor):
        value = value.to(device)
        if dtype is not None and value.is_floating_point():
            value = value.to(dtype)
    return value


def _outputs(out) -> list:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def compare(t, op: str, want, got, atol=1e-4, rtol=1e-3) -> str | None:
    for i, (w, g) in enumerate(zip(_outputs(want), _outputs(got))):
        g = g.detach().cpu()
        w = w.detach().cpu()
        if w.shape != g.shape:
            return f"output {i} shape {tuple(g.shape)} != CPU {tuple(w.shape)}"
        if w.dtype != g.dtype:
            return f"output {i} dtype {g.dtype} != CPU {w.dtype}"
        if w.is_floating_point():
            if not t.allclose(w, g.to(w.dtype), atol=atol, rtol=rtol, equal_nan=True):
                return f"output {i} differs from CPU by {float((w - g).abs().max()):.3g}"
        elif op == "roi_pool" and i == 1:
            continue  # argmax ties may legitimately resolve differently per device
        elif not t.equal(w, g):
            return f"output {i} {g.tolist()} != CPU {w.tolist()}"
    return None


class _ExplainingReport:
    """Adds to a failing run the census gap that explains it (no CPU kernel, no Meta kernel)."""

    def __init__(self, report: Report, rows: dict[str, dict]):
        self.report, self.rows, self.doc = report, rows, report.doc

    def explanation(self, category: str, op: str, device: str | None) -> str | None:
        dev_key = DEVICE_KEY.get(device or "cpu")
        keys = {"run": [dev_key], "fake": ["Meta"], "compile": ["Meta", "CPU"],
                "backward": ["Autograd", dev_key],
                "autocast": [AUTOCAST_KEY.get(device or ""), dev_key]}.get(category, [])
        cells = self.rows.get(op, {}).get("keys", {})
        gaps = [k for k in keys if cells.get(k or "", {}).get("status") in ("missing", "absent")]
        return f"census: {op} has no {' and no '.join(gaps)} kernel" if gaps else None

    def check(self, check_id, category, status, message, **fields):
        if status == "fail" and fields.get("op"):
            why = self.explanation(category, fields["op"], fields.get("device"))
            if why:
                message, fields["explained_by"] = f"{message} [{why}]", why
        return self.report.check(check_id, category, status, message, **fields)


class OpRunner:
    def __init__(self, report: Report, args, t, rows: dict[str, dict], devices: list[str]):
        self.report = _ExplainingReport(report, rows)
        self.args, self.t, self.rows, self.devices = args, t, rows, devices
        self.ns = args.namespace

    def recipe_for(self, op: str) -> tuple[object, str | None]:
        entry = RECIPES.get(op)
        if entry is None:
            return None, "no call recipe for this op: census only"
        try:
            packet = getattr(getattr(self.t.ops, self.ns), op)
            schema = packet.default._schema
        except (AttributeError, RuntimeError) as exc:
            return None, f"no default overload to call ({_first_line(exc)}): census only"
        names = tuple(a.name for a in schema.arguments)
        if names != entry[1]:
            return None, f"schema {schema} differs from the recipe's ({', '.join(entry[1])}): census only"
        return packet.default, None

    def absent(self, device: str) -> tuple[str, str]:
        entry = self.report.doc["devices"][device]
        if entry.get("present"):
            return "present, device checks disabled (--device-checks skip)", "disabled"
        return f"skipped-no-device: {entry.get('detail')}", "no-device"

    def runnable(self, op: str, device: str) -> str | None:
        key = DEVICE_KEY[device]
        row = self.rows[op]
        cell = row["keys"].get(key, {})
        if cell.get("status") in ("ok", "present"):
            return None
        if cell.get("status") == "missing":
            return None  # promised: run it and show the user the real error
        return f"no {key} kernel registered and none expected"

    def run_all(self, import_ok: bool):
        t = self.t
        for op, row in self.rows.items():
            if not row["found"] or not row["declared"]:
                continue
            if row["internal"]:
                continue  # reached through the backward of its forward op
            if not import_ok:
                self.report.check(f"run:{op}", "run", "skip", "import failed", op=op,
                                  reason="import-failed")
                continue
            fn, why = self.recipe_for(op)
            if fn is None:
                self.report.check(f"run:{op}", "run", "skip", why, op=op, reason="no-recipe")
                continue
            try:
                recipe = RECIPES[op][0](t)
                cpu_out, _ = self.device_runs(op, fn, recipe)
                self.fake_run(op, fn, recipe, cpu_out)
                self.compile_run(op, fn, recipe, cpu_out)
                if op in AUTOCAST_OPS:
                    self.autocast_runs(op, fn, recipe)
            except Exception as exc:  # noqa: BLE001 - one op's surprise must not end the probe
                self.report.check(f"run:{op}", "run", "fail", f"probing {op} raised "
                                  f"{_first_line(exc)}", op=op)

    def device_runs(self, op, fn, recipe):
        t = self.t
        cpu_out = cpu_grads = None
        for device in DEVICES:
            check_id = f"run:{op}:{device}"
            if device not in self.devices:
                message, reason = self.absent(device)
                self.report.check(check_id, "run", "skip", message, op=op, device=device,
                                  reason=reason)
                if recipe["grad"]:
                    self.report.check(check_id + ":backward", "backward", "skip", message,
                                      op=op, device=device, reason=reason)
                continue
            why = self.runnable(op, device)
            if why:
                self.report.check(check_id, "run", "skip", why, op=op, device=device,
                                  reason="no-kernel")
                continue
            args = [_to(t, a, device) for a in recipe["args"]]
            try:
                out = fn(*args)
                if device != "cpu":
                    out = [o.cpu() for o in _outputs(out)]
                    problem = compare(t, op, cpu_out, out) if cpu_out is not None else \
                        "CPU run failed, nothing to compare with"
                    ok_message = f"{op} on {device} matches CPU"
                else:
                    cpu_out = out
                    problem = known_answer(t, fn, op, args, out)
                    ok_message = (f"{op} on cpu gives the known answer" if op in KNOWN_ANSWERS
                                  else f"{op} on cpu runs, finite output")
                    if problem is None and any(o.is_floating_point() and not bool(t.isfinite(o).all())
                                               for o in _outputs(out)):
                        problem = f"{op} on cpu returned non-finite values"
                self.report.check(check_id, "run", "fail" if problem else "pass",
                                  problem or ok_message, op=op, device=device)
            except Exception as exc:  # noqa: BLE001
                self.report.check(check_id, "run", "fail", f"{op} on {device}: {_first_line(exc)}",
                                  op=op, device=device)
                continue
            if recipe["grad"]:
                grads = self.backward(op, fn, recipe, device, cpu_grads)
                if device == "cpu":
                    cpu_grads = grads
        return cpu_out, cpu_grads

    def backward(self, op, fn, recipe, device, cpu_grads):
        t = self.t
        check_id = f"run:{op}:{device}:backward"
        row = self.rows[op]
        if row["keys"].get("Autograd", {}).get("status") not in ("ok", "present", "missing"):
            self.report.check(check_id, "backward", "skip", "no Autograd kernel registered and "
                              "none expected", op=op, device=device, reason="no-kernel")
            return None
        args = [_to(t, a, device) for a in recipe["args"]]
        leaves = []
        for i in recipe["grad"]:
            args[i] = args[i].detach().requires_grad_(True)
            leaves.append(args[i])
        try:
            with warnings.catch_warnings():
                # torch's autograd-fallback warning means backward silently skips the op
                warnings.filterwarnings("error", message=".*autograd kernel was not registered")
                out = _outputs(fn(*args))[0]
                g = t.Generator().manual_seed(2)
                weight = t.rand(out.shape, generator=g).to(device)
                grads = t.autograd.grad((out * weight).sum(), leaves, allow_unused=True)
            grads = [None if x is None else x.cpu() for x in grads]
            if any(x is None for x in grads):
                problem = "backward left some inputs without a gradient"
            elif device == "cpu":
                problem = next((f"gradient {i} is not finite" for i, x in enumerate(grads)
                                if not bool(t.isfinite(x).all())), None)
            elif cpu_grads is None:
                problem = "CPU backward failed, nothing to compare with"
            else:
                problem = compare(t, op, cpu_grads, grads, atol=1e-3, rtol=1e-3)
            self.report.check(check_id, "backward", "fail" if problem else "pass",
                              problem or f"{op} backward on {device} "
                              + ("runs" if device == "cpu" else "matches CPU"),
                              op=op, device=device)
            return grads
        except Exception as exc:  # noqa: BLE001
            self.report.check(check_id, "backward", "fail", f"{op} backward on {device}: "
                              f"{_first_line(exc)}", op=op, device=device)
            return None

    def fake_run(self, op, fn, recipe, cpu_out):
        t = self.t
        try:
            from torch._subclasses.fake_tensor import FakeTensorMode
            from torch.fx.experimental.symbolic_shapes import ShapeEnv
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with FakeTensorMode(shape_env=ShapeEnv()) as mode:
                    args = [mode.from_tensor(a) if isinstance(a, t.Tensor) else a
                            for a in recipe["args"]]
                    out = _outputs(fn(*args))
            problem = None
            if cpu_out is not None:
                for i, (f, r) in enumerate(zip(out, _outputs(cpu_out))):
                    static = [d if isinstance(d, int) else None for d in f.shape]
                    if f.dtype != r.dtype or len(static) != r.dim() or any(
                            s is not None and s != d for s, d in zip(static, r.shape)):
                        problem = (f"fake output {i} is {f.dtype}{list(f.shape)}, the real one "
                                   f"{r.dtype}{list(r.shape)}")
            self.report.check(f"fake:{op}", "fake", "fail" if problem else "pass",
                              problem or f"{op} runs under FakeTensorMode", op=op)
        except Exception as exc:  # noqa: BLE001
            self.report.check(f"fake:{op}", "fake", "fail", f"{op} under FakeTensorMode: "
                              f"{_first_line(exc)}", op=op)

    def compile_run(self, op, fn, recipe, cpu_out):
        t = self.t
        if "cpu" not in self.devices:
            return
        try:
            t._dynamo.reset()
            const = {i: a for i, a in enumerate(recipe["args"]) if not isinstance(a, t.Tensor)}
            tensors = [a for a in recipe["args"] if isinstance(a, t.Tensor)]

            def call(*ts):
                it = iter(ts)
                return fn(*[const[i] if i in const else next(it) for i in range(len(recipe["args"]))])

            compiled = t.compile(call, fullgraph=True, backend="aot_eager")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out = compiled(*tensors)
            problem = compare(t, op, cpu_out, out) if cpu_out is not None else None
            self.report.check(f"compile:{op}", "compile", "fail" if problem else "pass",
                              problem or f"{op} compiles with fullgraph=True, backend=aot_eager "
                                         "and matches eager", op=op)
        except Exception as exc:  # noqa: BLE001
            self.report.check(f"compile:{op}", "compile", "fail",
                              f"torch.compile(fullgraph=True, backend='aot_eager') of {op}: "
                              f"{_first_line(exc)}", op=op)

    def autocast_runs(self, op, fn, recipe):
        t = self.t
        for device in DEVICES:
            check_id = f"autocast:{op}:{device}"
            key = AUTOCAST_KEY[device]
            if device not in self.devices:
                message, reason = self.absent(device)
                self.report.check(check_id, "autocast", "skip", message, op=op, device=device,
                                  reason=reason)
                continue
            cell = self.rows[op]["keys"].get(key, {})
            if cell.get("status") not in ("ok", "present", "missing"):
                self.report.check(check_id, "autocast", "skip", f"no {key} kernel registered and "
                                  "none expected", op=op, device=device, reason="no-kernel")
                continue
            low = t.bfloat16 if device == "cpu" else t.float16
            # features in reduced precision, boxes in float32: the autocast kernel must cast
            args = [_to(t, a, device) for a in recipe["args"]]
            args[0] = args[0].to(low)
            try:
                with t.autocast(device, dtype=low):
                    out = fn(*args)
                ref = fn(*[_to(t, a, device) for a in recipe["args"]])
                if op == "nms":
                    problem = None if t.equal(out.cpu(), ref.cpu()) else \
                        f"nms under autocast kept {out.tolist()}, in float32 {ref.tolist()}"
                else:
                    problem = None if out.dtype == low else \
                        f"{op} under autocast returned {out.dtype}, expected {low}"
                    if problem is None and not t.allclose(out.float().cpu(), ref.cpu(),
                                                          atol=2e-2, rtol=2e-2):
                        problem = f"{op} under autocast differs from float32 beyond {low} precision"
                self.report.check(check_id, "autocast", "fail" if problem else "pass",
                                  problem or f"{op} under torch.autocast('{device}', {low}) with "
                                             "float32 boxes works", op=op, device=device)
            except Exception as exc:  # noqa: BLE001
                self.report.check(check_id, "autocast", "fail", f"{op} under torch.autocast("
                                  f"'{device}', {low}): {_first_line(exc)}", op=op, device=device)


# --------------------------------------------------------------------------- main


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


def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()] if text else []


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--package", required=True)
    p.add_argument("--namespace", required=True)
    p.add_argument("--ops", type=_csv, default=[])
    p.add_argument("--internal-ops", type=_csv, default=[])
    p.add_argument("--expect-keys", type=_csv, default=[])
    # {variant: [keys]}: with no --expect-keys, the keys of the variant the build info names
    p.add_argument("--variant-keys", type=json.loads, default={})
    p.add_argument("--device-checks", choices=("auto", "skip"), default="auto")
    p.add_argument("--out", required=True)
    return p.parse_args(argv)


def choose_variant_keys(report: Report, args) -> None:
    """An installed wheel says which variant it is; its promises then come from the matrix."""
    if args.expect_keys or not args.variant_keys:
        return
    variant = ((report.doc["build"] or {}).get("build_info") or {}).get("variant")
    if variant in args.variant_keys:
        args.expect_keys = list(args.variant_keys[variant])
        report.doc["variant"] = variant
        report.doc["variant_source"] = f"{args.package}/_build_info.json"
        report.doc["expected_keys"] = list(args.expect_keys)
        report.doc["internal_keys"] = [k for k in args.expect_keys if k in BACKEND_KEYS]


def probe(args) -> dict:
    report = Report(args)
    try:
        t0 = time.monotonic()
        import torch
        report.doc["environment"] = environment(torch)
        report.doc["environment"]["torch_import_seconds"] = round(time.monotonic() - t0, 3)
    except BaseException as exc:  # noqa: BLE001
        report.doc["environment"] = {"python": platform.python_version(),
                                     "executable": sys.executable}
        report.check("import-torch", "import", "fail",
                     f"import torch fails in {sys.executable}: {_first_line(exc)}")
        return report.finish()
    import_ok = probe_import(report, args, torch)
    choose_variant_keys(report, args)
    rows = run_census(report, args, torch)
    devices = probe_devices(report, args, torch)
    OpRunner(report, args, torch, rows, devices).run_all(import_ok)
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


if __name__ == "__main__":
    sys.exit(main())
