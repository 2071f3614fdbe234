# An mmcv / detectron2-style extension: pybind11 modules, no dispatcher ops; a CPU module
# always, a CUDA module (built from .cu sources only) when the build asks for CUDA.
import os

import torch
from setuptools import find_packages, setup
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

ext_modules = [
    CppExtension("pybops._ext_cpu",
                 ["pybops/csrc/pybind_cpu.cpp", "pybops/csrc/cpu/iou_cpu.cpp"],
                 extra_compile_args={"cxx": ["-O1", "-g0"]}),
]
if os.getenv("FORCE_CUDA", "0") == "1" or (torch.cuda.is_available() and CUDA_HOME):
    ext_modules.append(CUDAExtension("pybops._ext_cuda", ["pybops/csrc/cuda/iou_cuda.cu"],
                                     extra_compile_args={"cxx": ["-O1"], "nvcc": ["-O2"]}))

setup(
    name="pybops",
    version="0.4.1",
    packages=find_packages(),
    ext_modules=ext_modules,
    cmdclass={"build_ext": BuildExtension},
)
