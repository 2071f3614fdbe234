# A PyG-style extension (torch-scatter, torch-sparse): old torch::RegisterOperators, one
# library per backend (_segment_cpu, _segment_cuda), loaded with torch.ops.load_library.
import glob
import os

import torch
from setuptools import setup
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

WITH_CUDA = (torch.cuda.is_available() and CUDA_HOME is not None) or \
    os.getenv("FORCE_CUDA", "0") == "1"

main = ["csrc/segment.cpp"]
cpu = glob.glob("csrc/cpu/*.cpp")
cuda = glob.glob("csrc/cuda/*.cu")
flags = {"cxx": ["-O1", "-g0"], "nvcc": ["-O2"]}

ext_modules = [CppExtension("regops._segment_cpu", main + cpu,
                            extra_compile_args={"cxx": flags["cxx"]})]
if WITH_CUDA:
    ext_modules.append(CUDAExtension("regops._segment_cuda", main + cpu + cuda,
                                     define_macros=[("WITH_CUDA", None)],
                                     extra_compile_args=flags))

setup(
    name="regops",
    version="1.2.0",
    packages=["regops"],
    ext_modules=ext_modules,
    cmdclass={"build_ext": BuildExtension},
)
