"""opforge's build-time sitecustomize: torch answers the variant's questions, not the host's.

``opforge build`` copies this file into the build's PYTHONPATH as ``sitecustomize.py`` (see
opforge.platforms.toolchain). It imports the standard library only (the build environment need not
have opforge). $OPFORGE_BUILD_TOOLCHAIN says what the variant is:

- cpu:  torch.cuda.is_available() and torch.backends.mps.is_available() are False, and
        torch.utils.cpp_extension.CUDA_HOME is None (a CUDA torch finds /usr/local/cuda alone)
        unless the variant's build_env gave CUDA_HOME
- cuda: torch.cuda.is_available() is True (the build machine needs no GPU)
- mps:  torch.backends.mps.is_available() is True, torch.cuda.is_available() False, CUDA_HOME None
- rocm: torch.cuda.is_available() is True (a ROCm torch's HIP devices are torch.cuda's)
- xpu:  torch.xpu.is_available() is True, torch.cuda.is_available() False, CUDA_HOME None

Then the environment's own sitecustomize, if it has one, runs as it would have.
"""

import importlib.machinery
import importlib.util
import os
import sys

_MODE = os.environ.get("OPFORGE_BUILD_TOOLCHAIN", "")


def _answer(value):
    def is_available():
        return value
    is_available.__doc__ = f"opforge build ({_MODE} variant): {value}"
    return is_available


def _patch_torch(module):
    cuda = getattr(module, "cuda", None)
    if cuda is not None:  # a ROCm torch's HIP devices are torch.cuda's
        cuda.is_available = _answer(_MODE in ("cuda", "rocm"))
    xpu = getattr(module, "xpu", None)
    if xpu is not None:
        xpu.is_available = _answer(_MODE == "xpu")


def _patch_mps(module):
    module.is_available = _answer(_MODE == "mps")


def _patch_cpp_extension(module):
    # a cpu/mps build has no toolkit, unless its matrix entry gave one (build_env: CUDA_HOME)
    if _MODE not in ("cuda", "rocm") and \
            not (os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")):
        module.CUDA_HOME = None


_PATCHES = {"torch": _patch_torch, "torch.backends.mps": _patch_mps,
            "torch.utils.cpp_extension": _patch_cpp_extension}


class _VariantAnswers:
    """Runs a patch right after its module's code ran, before any importer sees the module."""

    def find_spec(self, fullname, path=None, target=None):
        patch = _PATCHES.get(fullname)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module):
            run(module)
            patch(module)

        loader.exec_module = exec_module
        return spec


def _run_next_sitecustomize():
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


if _MODE in ("cpu", "cuda", "mps", "rocm", "xpu"):
    sys.meta_path.insert(0, _VariantAnswers())
_run_next_sitecustomize()
