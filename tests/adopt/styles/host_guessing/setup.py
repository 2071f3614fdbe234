"""A setup.py that decides CUDA from the build host, in each of the ways such files do.

It builds ``host_guessing._C`` (CPU kernels) always and ``host_guessing._cuda`` (CUDA kernels,
a module of its own) when any guess says the host has CUDA: ``nvcc`` runs, ``$CUDA_HOME`` is
set, ``torch.cuda.is_available()``, or torch found a toolkit (``cpp_extension.CUDA_HOME``).
On a host with nvcc and a CPU-only torch, that last habit fails inside CUDAExtension.
``HOST_GUESSING_PROBE=nvidia-smi`` asks the driver instead, a question no build environment
answers without a GPU: the planted missing backend of the tests.
"""

import os
import shutil
import subprocess

import torch
from setuptools import setup
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension


def nvcc_runs() -> bool:
    try:
        return subprocess.run(["nvcc", "--version"], capture_output=True).returncode == 0
    except OSError:
        return False


if os.environ.get("HOST_GUESSING_PROBE") == "nvidia-smi":
    guesses = {"nvidia-smi": shutil.which("nvidia-smi") is not None}
else:
    guesses = {"nvcc": nvcc_runs(), "CUDA_HOME": bool(os.environ.get("CUDA_HOME")),
               "torch.cuda.is_available()": torch.cuda.is_available(),
               "cpp_extension.CUDA_HOME": CUDA_HOME is not None}
print(f"host_guessing guesses: {guesses}", flush=True)
with_cuda = any(guesses.values())

flags = {"cxx": ["-O1", "-g0"], "nvcc": ["-O2"]}
modules = [CppExtension("host_guessing._C", ["csrc/scale.cpp"],
                        extra_compile_args={"cxx": flags["cxx"]})]
if with_cuda:
    modules.append(CUDAExtension("host_guessing._cuda",
                                 ["csrc/cuda/module.cpp", "csrc/cuda/scale_kernel.cu"],
                                 extra_compile_args=flags))

setup(
    name="host-guessing",
    version="1.2.0",
    packages=["host_guessing"],
    ext_modules=modules,
    cmdclass={"build_ext": BuildExtension},
)
