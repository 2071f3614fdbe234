"""Load the compiled library, failing loudly with the real reason."""

import ctypes
import importlib.machinery
import importlib.metadata
import json
from pathlib import Path

import torch

PACKAGE_DIR = Path(__file__).resolve().parent
DISTRIBUTION = "opforge-ops"
# the build record `opforge build` stamps into the wheel's .dist-info
BUILD_RECORD = "opforge-build.json"


def read_build_info():
    """The build record of the installed distribution, or None (not installed from a stamped
    wheel, or another copy of the distribution is the installed one)."""
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None
    # this package must be the distribution's files, not a source tree shadowing them
    located = Path(dist.locate_file("opforge_ops/__init__.py")).resolve()
    if located.parent != PACKAGE_DIR:
        return None
    text = dist.read_text(BUILD_RECORD)
    return json.loads(text) if text else None


def library_path(name="_C"):
    """opforge_ops/_C<extension suffix>, e.g. _C.cpython-311-x86_64-linux-gnu.so."""
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = PACKAGE_DIR / f"{name}{suffix}"
        if candidate.exists():
            return candidate
    return None


def library_abi(path=None):
    """'stable' for a LibTorch stable-ABI library (built with the CPython limited API, so named
    _C.abi3.so), 'legacy' for one tied to a single torch and Python."""
    path = path or library_path()
    return "stable" if path is not None and path.name.endswith(".abi3.so") else "legacy"


def _versions_line(info):
    built = f"unknown (no {BUILD_RECORD} in the installed {DISTRIBUTION} metadata)"
    if info is not None:
        built = f"{info.get('torch_version')} (git {info.get('torch_git_version')})"
    return f"built against torch {built}; running torch {torch.__version__} (git {torch.version.git_version})"


def load_library():
    """dlopen opforge_ops/_C*.so so its TORCH_LIBRARY blocks register torch.ops.opforge.*."""
    info = read_build_info()
    name = "_C"
    path = library_path(name)
    if path is None:
        raise ImportError(
            f"opforge_ops: the compiled library {name}*.so is missing from {PACKAGE_DIR}; "
            f"build it (see extension/README.md) or reinstall the wheel. {_versions_line(info)}"
        )
    try:
        # ctypes reports dlerror()'s text: the missing library or undefined symbol.
        ctypes.CDLL(str(path))
    except OSError as exc:
        if library_abi(path) == "stable":
            advice = ("This stable-ABI wheel runs on every torch from its floor up (see its torch "
                      "requirement): a symbol missing here is one this torch's C shim lacks, so "
                      "install a newer torch.")
        else:
            advice = ("A wheel runs only with the torch it was built against: install that torch "
                      "or rebuild opforge-ops against this one.")
        raise ImportError(
            f"opforge_ops: cannot load {path}: {exc}. {_versions_line(info)}. {advice}"
        ) from None
    torch.ops.load_library(str(path))
    if not hasattr(torch.ops.opforge, "nms"):
        raise ImportError(
            f"opforge_ops: {path} loaded but registered no torch.ops.opforge operators. "
            f"{_versions_line(info)}"
        )
    return path
