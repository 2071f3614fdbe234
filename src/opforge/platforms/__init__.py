"""Platform backends: one module each (cpu, cuda, mps, rocm, xpu), one interface (base.Backend).

A variant names its backend (``backend: rocm`` in matrix.yaml; ``cuda: "13.0"`` and
``mps: true`` are the CUDA and MPS spellings); everything that depends on it — the matrix
rules, the build's toolchain world, the host check, the wheel repair, the wheel check, the
description — is asked of ``backend_of(variant)``. Adding a backend is one module that
defines a ``Backend`` (``BACKEND``) plus matrix entries using it: a module of opforge's own is
one entry of ``BUILT_IN`` here; one shipped elsewhere is declared as an ``opforge.platforms``
entry point whose module calls ``register`` (or is imported before the matrix is read). The
backend modules import nothing of this package's ``__init__``, nor the matrix or the wheel
checks (which import them): ``base.Variant`` and ``base.WheelReport`` name those types.
"""

from __future__ import annotations

import platform as _platform
import sys
from importlib import import_module
from importlib.metadata import entry_points

from opforge.platforms import cpu, cuda, mps, rocm, xpu
from opforge.platforms.base import Backend, Variant

# opforge's own backends, in the order they are listed
BUILT_IN = (cpu.BACKEND, cuda.BACKEND, mps.BACKEND, rocm.BACKEND, xpu.BACKEND)
_BACKENDS: dict[str, Backend] = {backend.name: backend for backend in BUILT_IN}


def register(backend: Backend) -> Backend:
    """Make ``backend`` known by its name (a second one of the same name replaces it)."""
    if not backend.name or not backend.name.isidentifier() or backend.name != backend.name.lower():
        raise ValueError(f"a backend's name is a lower-case identifier, got {backend.name!r}")
    _BACKENDS[backend.name] = backend
    return backend


def unregister(name: str) -> None:
    """Forget a backend (tests that register a fake one clean up with it)."""
    _BACKENDS.pop(name, None)


ENTRY_POINT_GROUP = "opforge.platforms"
_plugins_loaded = False


def load_plugins() -> None:
    """Import the backend modules installed distributions declare (entry point group
    ``opforge.platforms``, ``npu = mypkg.opforge_npu``), once: a backend shipped outside
    opforge registers itself without any edit here."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True

    for entry in entry_points(group=ENTRY_POINT_GROUP):
        import_module(entry.value.partition(":")[0])


def names() -> tuple[str, ...]:
    load_plugins()
    return tuple(_BACKENDS)


def backends() -> tuple[Backend, ...]:
    """Every known backend: opforge's own and the plugins'."""
    load_plugins()
    return tuple(_BACKENDS.values())


def get(name: str) -> Backend:
    if name not in _BACKENDS:
        load_plugins()
    try:
        return _BACKENDS[name]
    except KeyError:
        raise KeyError(f"unknown backend {name!r} (known: {', '.join(_BACKENDS)})") from None


def backend_of(variant: Variant) -> Backend:
    return get(variant.backend)


def host_platform() -> str:
    """This machine as a matrix platform name: linux-x86_64, macos-arm64, windows-amd64..."""
    system = {"linux": "linux", "darwin": "macos", "win32": "windows"}.get(sys.platform,
                                                                             sys.platform)
    machine = _platform.machine().lower()
    machine = {"amd64": "x86_64", "aarch64": "aarch64", "arm64": "arm64"}.get(machine, machine)
    if system == "linux" and machine == "arm64":
        machine = "aarch64"
    return f"{system}-{machine}"

