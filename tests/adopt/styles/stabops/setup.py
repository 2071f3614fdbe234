# A stable-ABI-only extension (extension-cpp's stable flavour): STABLE_TORCH_LIBRARY, boxed
# kernels, one abi3 wheel for every Python and every torch from 2.10 on.
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

setup(
    name="stabops",
    version="2.0.0",
    packages=["stabops"],
    ext_modules=[CppExtension(
        "stabops._C", ["csrc/axpby.cpp"], py_limited_api=True,
        define_macros=[("TORCH_STABLE_ONLY", None),
                       ("TORCH_TARGET_VERSION", "0x020a000000000000"),
                       ("Py_LIMITED_API", "0x03090000")],
        extra_compile_args={"cxx": ["-O1", "-g0"]})],
    cmdclass={"build_ext": BuildExtension},
    options={"bdist_wheel": {"py_limited_api": "cp39"}},
)
