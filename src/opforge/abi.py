"""The ABI audit of a compiled library: which torch, CPython and CUDA interfaces it reaches.

Each undefined symbol is one of: a LibTorch stable C shim function (``aoti_torch_*``,
``torch_*``), a libtorch C++ symbol (``at::``, ``c10::``, ``torch::`` outside the stable and
header-only namespaces), a CPython symbol (in the limited API / stable ABI or not), a CUDA
runtime symbol, or something else (libc, libstdc++). The classification, the CPython stable
ABI set (abi3info, as abi3audit uses) and the torch version each shim function first shipped
in (a copy of PyTorch's own ``torch/csrc/stable/c/shim_function_versions.txt`` plus the 2.9.0
baseline) come from torch-abi-audit; opforge keeps no symbol table of its own. The library's
minimum torch is the newest first-shipped version among its shim functions.

``problems`` turns an audit into contradictions with what the wheel declares: a C++ libtorch
symbol in a stable wheel, a minimum torch above the declared floor, a non-limited CPython
symbol in an abi3 wheel, a CUDA runtime of another major than the variant's.
"""

from __future__ import annotations

import re
import shutil
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from packaging.version import Version

# shown when the audit cannot run: how to get it
NEEDS = "the ABI audit needs torch-abi-audit (Python >= 3.11) and nm (binutils / Xcode tools)"
_CUDA_RUNTIME = re.compile(r"libcudart\.so\.(\d+)")
_CUDA_SYMBOL = re.compile(r"_?_?cuda[A-Z_]")


@dataclass
class Audit:
    """One library's undefined symbols, by kind, and what they imply."""

    available: bool = True            # False: the tools were missing (``note`` says which)
    note: str = ""
    stable_shim: list[str] = field(default_factory=list)
    libtorch_cxx: list[str] = field(default_factory=list)
    cpython_limited: list[str] = field(default_factory=list)
    cpython_other: list[str] = field(default_factory=list)
    cuda_runtime: list[str] = field(default_factory=list)
    cuda_runtime_major: str | None = None   # from the libcudart.so.N the library links
    other: int = 0
    min_torch: str | None = None       # the newest first-shipped version of its shim functions
    min_torch_symbols: list[str] = field(default_factory=list)
    unknown_shim: list[str] = field(default_factory=list)  # newer than the version table

    def to_json(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        if not self.available:
            return f"ABI audit not run: {self.note}"
        parts = [f"{len(self.stable_shim)} stable shim",
                 f"{len(self.libtorch_cxx)} libtorch C++",
                 f"{len(self.cpython_limited)} CPython limited",
                 f"{len(self.cpython_other)} CPython non-limited",
                 f"{len(self.cuda_runtime)} CUDA runtime"
                 + (f" (libcudart.so.{self.cuda_runtime_major})"
                    if self.cuda_runtime_major else "")]
        floor = f"; minimum torch {self.min_torch}" if self.min_torch else ""
        if self.min_torch_symbols:
            floor += f" (set by {', '.join(self.min_torch_symbols[:3])})"
        return ", ".join(parts) + floor


def _tools():
    """torch-abi-audit's modules, or None where it cannot run (Python 3.10, no nm)."""
    # torch-abi-audit: absent below Python 3.11, and ~7 ms; abi is on the CLI's startup path
    try:
        from torch_abi_audit import cpython_abi, symbols, torch_abi, torch_versions
    except ImportError:
        return None
    if shutil.which("nm") is None or sys.platform == "win32":
        return None
    return cpython_abi, symbols, torch_abi, torch_versions


def available() -> bool:
    return _tools() is not None


def shim_version(symbol: str) -> str | None:
    """The torch release that first shipped stable shim function ``symbol`` (None: not a
    shim function torch's table lists)."""
    tools = _tools()
    if tools is None:
        return None
    _, _, _, versions = tools
    found = versions.stable_shim_versions().get(symbol.removeprefix("_") if
                                                symbol.startswith("__") else symbol)
    return versions.format_version(found) if found else None


def audit_library(path: Path, needed: list[str] | None = None) -> Audit:
    """Classify the undefined symbols of the compiled library at ``path``."""
    tools = _tools()
    if tools is None:
        return Audit(available=False, note=NEEDS)
    cpython_abi, symbols, torch_abi, versions = tools
    try:
        undefined = symbols.extract_undefined_symbols(path)
    except RuntimeError as exc:
        return Audit(available=False, note=str(exc))
    audit = Audit()
    limited = cpython_abi._stable_symbol_set()
    for symbol in undefined:
        name = symbol.split("@", 1)[0]
        kind = torch_abi.classify_symbol(name)
        if kind == "stable_shim":
            audit.stable_shim.append(name)
        elif kind == "unstable":
            audit.libtorch_cxx.append(name)
        elif cpython_abi._is_python_capi(name):
            (audit.cpython_limited if name in limited else audit.cpython_other).append(name)
        elif _CUDA_SYMBOL.match(name):
            audit.cuda_runtime.append(name)
        else:
            audit.other += 1
    majors = sorted({m.group(1) for lib in needed or () if (m := _CUDA_RUNTIME.match(lib))})
    audit.cuda_runtime_major = ",".join(majors) or None
    floor, defining, unknown = versions.minimum_version(audit.stable_shim)
    audit.min_torch = versions.format_version(floor) if floor else None
    audit.min_torch_symbols = list(defining)
    audit.unknown_shim = list(unknown)
    return audit


def problems(path: str, audit: Audit, *, stable: bool, abi3: bool, torch_floor: str | None,
             cuda_major: str | None) -> list[str]:
    """The contradictions between one library's audit and what its wheel declares
    (``cuda_major``: "" for a build without CUDA, None when unknown)."""
    if not audit.available:
        return [f"{path}: {audit.note}"] if stable else []
    out = []
    if stable and audit.libtorch_cxx:
        out.append(f"{path}: libtorch C++ symbols in a stable-ABI wheel (they break on the "
                   f"next torch): {_few(audit.libtorch_cxx)}")
    if stable and audit.unknown_shim:
        out.append(f"{path}: shim functions newer than torch's version table in "
                   f"torch-abi-audit (upgrade it): {_few(audit.unknown_shim)}")
    if torch_floor and audit.min_torch and Version(audit.min_torch) > Version(torch_floor):
        out.append(f"{path}: needs torch >= {audit.min_torch} ({_few(audit.min_torch_symbols)} "
                   f"first shipped in torch {audit.min_torch}), above the declared floor "
                   f"torch>={torch_floor}: it fails to load on torch {torch_floor}")
    if abi3 and audit.cpython_other:
        out.append(f"{path}: CPython symbols outside the limited API in an abi3 wheel: "
                   f"{_few(audit.cpython_other)}")
    if audit.cuda_runtime_major and cuda_major and audit.cuda_runtime_major != cuda_major:
        out.append(f"{path}: links the CUDA {audit.cuda_runtime_major} runtime "
                   f"(libcudart.so.{audit.cuda_runtime_major}), the variant is CUDA "
                   f"{cuda_major}: it breaks beside a torch built for CUDA {cuda_major}")
    if audit.cuda_runtime_major and cuda_major == "":
        out.append(f"{path}: links the CUDA runtime (libcudart.so.{audit.cuda_runtime_major}) "
                   "in a variant without CUDA")
    return out


def _few(items: list[str], n: int = 3) -> str:
    more = f" (+{len(items) - n} more)" if len(items) > n else ""
    return ", ".join(items[:n]) + more
