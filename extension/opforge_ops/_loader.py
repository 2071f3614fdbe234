"""Load the compiled library, failing loudly with the real reason."""

import ctypes
import importlib.machinery
import json
from pathlib import Path

import torch

PACKAGE_DIR = Path(__file__).resolve().parent
BUILD_INFO_PATH = PACKAGE_DIR / "_build_info.json"


def read_build_info():
    """The build info written by setup.py, or None if the package was never built."""
    try:
        return json.loads(BUILD_INFO_PATH.read_text())
    except FileNotFoundError:
        return None


def library_path(name="_C"):
    """opforge_ops/_C<extension suffix>, e.g. _C.cpython-311-x86_64-linux-gnu.so."""
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = PACKAGE_DIR / f"{name}{suffix}"
        if candidate.exists():
            return candidate
    return None


def _versions_line(info):
    built = "unknown (no _build_info.json)"
    if info is not None:
        built = f"{info.get('torch_version')} (git {info.get('torch_git_version')})"
    return f"built against torch {built}; running torch {torch.__version__} (git {torch.version.git_version})"


def load_library():
    """dlopen opforge_ops/_C*.so so its TORCH_LIBRARY blocks register torch.ops.opforge.*."""
    info = read_build_info()
    name = (info or {}).get("library", "_C")
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
        raise ImportError(
            f"opforge_ops: cannot load {path}: {exc}. {_versions_line(info)}. "
            "A wheel runs only with the torch it was built against: install that torch "
            "or rebuild opforge-ops against this one."
        ) from None
    torch.ops.load_library(str(path))
    if not hasattr(torch.ops.opforge, "nms"):
        raise ImportError(
            f"opforge_ops: {path} loaded but registered no torch.ops.opforge operators. "
            f"{_versions_line(info)}"
        )
    return path
