"""Import the package and, when that fails (or hides a failure), say why: dlopen diagnosis."""

from __future__ import annotations

import ctypes
import importlib
import os
import re
import shutil
import subprocess
import sys
import time
import traceback
import warnings

from .common import Report, base_version, err_text, first_line, release
from .facts import RECORD_NAME, package_dir, read_build_facts
from .registrations import Observer, loaded_paths

# Libraries only a CUDA build of torch ships or loads: missing one means a CUDA build of the
# extension was installed beside a torch that has no CUDA.
CUDA_LIBS = ("libcudart", "libc10_cuda", "libtorch_cuda", "libcublas", "libcudnn", "libnvrtc",
             "libcusparse", "libcufft", "libcurand", "libcusolver", "libnccl", "libnvToolsExt",
             "libnvJitLink", "libcupti")
TORCH_LIBS = ("libc10", "libtorch", "libtorch_cpu", "libtorch_python", "libshm")
LIB_SUFFIXES = (".so", ".pyd", ".dylib")


def _outside(path: str | None, pkg_dir: str | None) -> bool:
    if not path or not pkg_dir:
        return True
    return not os.path.realpath(path).startswith(os.path.join(os.path.realpath(pkg_dir), ""))


def compiled_libraries(pkg_dir: str, recorded: list[str]) -> list[str]:
    found = []
    for root, _dirs, files in os.walk(pkg_dir):
        for name in files:
            if name.endswith(LIB_SUFFIXES) or ".so." in name:
                found.append(os.path.join(root, name))

    # the libraries the build record lists first: their error is the one that explains the import
    def rank(path: str) -> tuple[int, str]:
        return (0 if os.path.basename(path) in recorded else 1, path)
    return sorted(found, key=rank)


def other_python(path: str) -> str | None:
    """``CPython 3.12`` when ``path`` is an extension module tagged for another interpreter."""
    m = re.search(r"\.(cpython|cp)-?(\d)(\d+)[a-z]*-", os.path.basename(path))
    if not m:
        return None
    tag = (int(m.group(2)), int(m.group(3)))
    if sys.implementation.name == "cpython" and tag == sys.version_info[:2]:
        return None
    return f"CPython {tag[0]}.{tag[1]}"


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
    # Long by design: one branch per kind of load error, tried in order, each with its
    # message; a table of functions would hide the order that decides between them.
    name = os.path.basename(lib)
    built = build.get("built_against_torch")
    running = torch_mod.__version__
    versions = (f"built against torch {built} ({build.get('source')}), running torch {running}"
                if built else f"running torch {running}; the build's torch is unknown "
                              f"(no {RECORD_NAME} build record and no torch==X pin)")
    other = other_python(lib)
    if other:
        message = (f"{name} is an extension module for {other}, and this is Python "
                   f"{sys.version_info.major}.{sys.version_info.minor}: the wheel was built for "
                   f"another Python. Fix: install the wheel built for this Python (or rebuild "
                   "it here).")
        return {"kind": "other_python", "library": lib, "message": message, "error": error}
    m = re.search(r"version `((?:GLIBC|GLIBCXX|CXXABI)_[\d.]+)' not found(?: \(required by "
                  r"([^)]+)\))?", error)
    if m:
        needed, by = m.group(1), os.path.basename(m.group(2) or lib)
        message = (f"{by} needs {needed}, newer than this system's C/C++ runtime provides: "
                   f"the library was built on a newer system than it runs on. Fix: build the "
                   "wheel in an older image (manylinux_2_28) and check its floor with opforge "
                   "inspect, or run on a system with that runtime.")
        return {"kind": "runtime_too_new", "library": lib, "symbol": needed, "message": message,
                "error": error}
    if re.search(r"invalid ELF header|file too short|wrong ELF class|not a mach-o file|"
                 r"ELF file's phentsize|incompatible architecture", error):
        why = error.split(": ", 1)[-1] if error.startswith(lib) else error
        message = (f"{name} is not a loadable library for this machine ({why.strip()}): "
                   "a truncated or foreign file shipped in the wheel. Fix: rebuild the wheel "
                   f"on {os.uname().machine if hasattr(os, 'uname') else 'this platform'} and "
                   "check it with opforge inspect.")
        return {"kind": "not_a_library", "library": lib, "message": message, "error": error}
    m = re.search(r"undefined symbol: (\S+)", error) or re.search(r"Symbol not found: (\S+)", error)
    if m:
        symbol = m.group(1).rstrip(",")
        pretty = demangle(symbol)
        drift = built is not None and base_version(built) != base_version(running)
        stable = (build.get("build_info") or {}).get("abi") == "stable"
        if stable:
            floor = (build.get("build_info") or {}).get("torch_floor")
            message = (f"{name} needs {pretty}, which torch {running} does not export: a "
                       f"stable-ABI wheel (requires torch>={floor}) calling a function newer "
                       f"than torch {running}; {versions}. Fix: raise the wheel's torch floor "
                       "or build without that function for older torch.")
            return {"kind": "stable_symbol_missing", "library": lib, "symbol": symbol,
                    "demangled": pretty, "message": message, "error": error}
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
    observer = Observer(torch_mod, pkg_dir)
    ops0, orphans0 = observer.snapshot()
    try:
        with warnings.catch_warnings(record=True) as caught, observer:
            warnings.simplefilter("always")
            module = importlib.import_module(package)
        info["warnings"] = sorted({str(w.message).splitlines()[0] for w in caught})[:10]
        info["ok"] = True
        info["file"] = getattr(module, "__file__", None)
        info["version"] = getattr(module, "__version__", None)
    except BaseException as exc:  # noqa: BLE001 - SystemExit from a package is a failed import too
        exc_info = exc
        info["ok"] = False
        info["error"] = err_text(exc)
        info["traceback"] = traceback.format_exception(type(exc), exc, exc.__traceback__)[-8:]
    info["seconds"] = round(time.monotonic() - t0, 3)
    ops1, orphans1 = observer.snapshot()
    # what importing the package added to the dispatcher, and how (the causes read this)
    info["registered"] = {"ops": sorted(ops1 - ops0),
                          "orphans": {n: k for n, k in orphans1.items() if orphans0.get(n) != k},
                          "loads": [e for e in observer.loads if not _outside(e["path"], pkg_dir)
                                    or e["added_ops"] or e["added_orphans"]],
                          "python": observer.python}
    mapped = loaded_paths(torch_mod) | {e["path"] for e in observer.loads if not e["error"]}

    libs, diagnoses = _load_libraries(info, observer, mapped, pkg_dir, build, torch_mod)
    diagnosis = _import_diagnosis(info, package, pkg_dir, libs, diagnoses, exc_info)
    info["diagnosis"] = diagnosis
    ok = info["ok"] and not diagnoses
    report.check("import", "import", "pass" if ok else "fail", diagnosis["message"],
                 kind=diagnosis["kind"])

    _torch_match(report, package, build, torch_mod, ok)
    return info["ok"]


def _load_libraries(info: dict, observer, mapped: set, pkg_dir, build: dict,
                    torch_mod) -> tuple[list[str], list[dict]]:
    """Each compiled library of the package loaded (one the import left alone is loaded here
    and what it registers recorded): (the libraries, the diagnoses of those that fail)."""
    recorded = [os.path.basename(lib.get("path", ""))
                for lib in (build.get("build_info") or {}).get("libraries") or []]
    libs = compiled_libraries(pkg_dir, recorded) if pkg_dir else []
    info["libraries"] = []
    diagnoses = []
    for lib in libs:
        by_import = os.path.realpath(lib) in mapped
        entry = {"path": lib, "loaded": True, "loaded_by_import": by_import}
        info["libraries"].append(entry)
        # a library the import left alone is loaded here, and what it registers recorded
        event = len(observer.loads)
        try:
            observer.around(lib, "probe", lambda lib=lib: ctypes.CDLL(lib)) if not by_import \
                else ctypes.CDLL(lib)
        except OSError as exc:
            diag = classify_load_error(lib, str(exc), build, torch_mod)
            entry.update(loaded=False, error=str(exc), kind=diag["kind"])
            diagnoses.append(diag)
        if not by_import and len(observer.loads) > event:
            entry["added_ops"] = observer.loads[-1]["added_ops"]
            entry["added_orphans"] = observer.loads[-1]["added_orphans"]
    return libs, diagnoses


def _import_diagnosis(info: dict, package: str, pkg_dir, libs: list[str],
                      diagnoses: list[dict], exc_info) -> dict:
    """Why the import failed (or that it did not): a load failure first, then no library,
    then the package's own Python line."""
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
                       f"its import fails with {first_line(exc_info)}{where}: the wheel was built "
                       "without its extension or the file was removed. Fix: rebuild the wheel.")
        else:
            loaded = f"every compiled library ({len(libs)}) loads" if libs else \
                "there is no compiled library to blame"
            message = f"{loaded}, so the failure is in Python: {first_line(exc_info)}{where}"
        diagnosis = {"kind": kind, "message": message}
    else:
        loads = {0: "no compiled library", 1: "its compiled library loads"}.get(
            len(libs), f"its {len(libs)} compiled libraries load")
        diagnosis = {"kind": "ok", "message": f"import {package} succeeded ({loads})"}
        if not libs:
            diagnosis["no_library"] = True
    return diagnosis


def _torch_match(report: Report, package: str, build: dict, torch_mod, ok: bool) -> None:
    """The torch-match check: the running torch against the one the wheel was built with."""
    built, running = build.get("built_against_torch"), torch_mod.__version__
    env = report.doc["environment"]
    env["built_against_torch"] = built
    env["torch_matches_build"] = None if built is None else base_version(built) == base_version(running)
    record = build.get("build_info") or {}
    if record.get("abi") == "stable":
        # one wheel for every torch from its floor: a different torch is the point, not drift
        floor = record.get("torch_floor")
        above = floor is None or release(running) >= release(floor)
        report.check("torch-match", "environment", "pass" if above else "fail",
                     f"stable-ABI wheel (built against torch {built}, requires "
                     f"torch>={floor}); running torch {running}"
                     + ("" if above else f", below its floor {floor}"))
    elif built is None:
        req = build.get("torch_requirement")
        report.check("torch-match", "environment", "skip",
                     f"the torch {package} was built against is unknown: no {RECORD_NAME} and "
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


