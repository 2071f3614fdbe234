"""What this copy of opforge_ops was built with: the build record `opforge build` stamped into
the wheel's metadata, or, for an in-place development build, what the running library shows."""

import copy
import sys

import torch

from ._loader import BUILD_RECORD, library_abi, library_path, read_build_info


def _in_place_description():
    """No stamped record (``setup.py build_ext --inplace``): describe the library as loaded."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    backends = [b for b, key in (("cpu", "CPU"), ("cuda", "CUDA"), ("mps", "MPS"))
                if has("opforge::nms", key)]
    library = library_path()
    return {
        "schema": 1,
        "variant": "in-place",
        "source": f"in-place build: no {BUILD_RECORD} (only `opforge build` wheels carry one)",
        "torch_version": torch.__version__,
        "torch_git_version": torch.version.git_version,
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "cuda_version": torch.version.cuda if "cuda" in backends else None,
        "cuda_arch_list": None,
        "mps": "mps" in backends,
        "backends": backends,
        "libraries": [{"path": f"opforge_ops/{library.name}"}] if library else [],
        "omitted_kernels": [],
    }


_INFO = read_build_info() or _in_place_description()
# which LibTorch ABI the library was built for, read from its name (_C.abi3.so: stable)
_INFO.setdefault("abi", library_abi())
# the kernels setup.py left out: its OPFORGE_OMIT_KERNELS, as `opforge build --build-env` recorded it
_OMIT = (_INFO.get("build_env") or {}).get("OPFORGE_OMIT_KERNELS", "")
_INFO.setdefault("omitted_kernels", [k.strip() for k in _OMIT.split(",") if k.strip()])


def build_info():
    """The build record as a dict: variant, abi (legacy or stable), torch version and commit, CUDA version and arch
    list, MPS, the compiled libraries and the backends found in them, omitted kernels."""
    return copy.deepcopy(_INFO)
