"""Four small op extensions written the way other people write them, for the adoption tests.

None follows this repository's conventions: no _build_info.json, no local version, no torch
pin, no FORCE_* reading. Between them: a mutating op, a backward-only op, an op without
Autograd, an op with only a CPU kernel, and four build systems.

- ``hostguess``: setup.py that picks CUDAExtension or CppExtension from the build host (like
  the extension-cpp template), a .cu file it compiles only when the host has a GPU.
- ``abi3ops``: a ``py_limited_api`` (abi3) wheel with a backward-only op.
- ``cmakeops``: a CMake build through scikit-build-core (find_package(Torch)).
- ``pyops``: a pure-Python package of ``torch.library.custom_op``s.

Each ``write_*`` returns the project directory and the recipes the test fills in after
``opforge init`` stubbed them.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

LOADER = '''\
import glob
import os

import torch

_here = os.path.dirname(__file__)
_libs = sorted(glob.glob(os.path.join(_here, "{pattern}")))
if not _libs:
    raise ImportError(f"{{__name__}}: no compiled library in {{_here}}")
torch.ops.load_library(_libs[0])
'''


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return root


def write_hostguess(root: Path) -> tuple[Path, str]:
    _write(root, {
        "setup.py": '''
            import torch
            from setuptools import setup
            from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension

            # the extension-cpp habit: guess the build from the host
            use_cuda = torch.cuda.is_available()
            sources = ["csrc/ops.cpp"] + (["csrc/ops_cuda.cu"] if use_cuda else [])
            kind = CUDAExtension if use_cuda else CppExtension
            setup(
                name="hostguess",
                version="0.3.0",
                packages=["hostguess"],
                ext_modules=[kind("hostguess._C", sources,
                                  extra_compile_args={"cxx": ["-O1", "-g0"]})],
                cmdclass={"build_ext": BuildExtension},
            )
        ''',
        "csrc/ops.cpp": '''
            #include <ATen/core/Tensor.h>
            #include <ATen/ops/copy.h>
            #include <ATen/ops/mul.h>
            #include <torch/library.h>

            at::Tensor scale_cpu(const at::Tensor& x, double a) { return at::mul(x, a); }

            // mutating, out= style: no fake kernel, no autograd, only a CPU kernel
            void scale_into_cpu(const at::Tensor& x, double a, at::Tensor& out) {
              out.copy_(at::mul(x, a));
            }

            TORCH_LIBRARY(hostguess, m) {
              m.def("scale(Tensor x, float a) -> Tensor");
              m.def("scale_into(Tensor x, float a, Tensor(a!) out) -> ()");
            }

            TORCH_LIBRARY_IMPL(hostguess, CPU, m) {
              m.impl("scale", &scale_cpu);
              m.impl("scale_into", &scale_into_cpu);
            }
        ''',
        "csrc/ops_cuda.cu": '''
            #include <ATen/core/Tensor.h>
            #include <ATen/ops/mul.h>
            #include <torch/library.h>

            at::Tensor scale_cuda(const at::Tensor& x, double a) { return at::mul(x, a); }

            TORCH_LIBRARY_IMPL(hostguess, CUDA, m) { m.impl("scale", &scale_cuda); }
        ''',
        "hostguess/__init__.py": LOADER.format(pattern="_C*.so") + '''

@torch.library.register_fake("hostguess::scale")
def _(x, a):
    return torch.empty_like(x)


def _setup(ctx, inputs, output):
    ctx.a = inputs[1]


def _backward(ctx, grad):
    return grad * ctx.a, None


torch.library.register_autograd("hostguess::scale", _backward, setup_context=_setup)
''',
    })
    recipes = '''
        import torch

        def scale_inputs(dtype):
            return [torch.arange(6, dtype=dtype).reshape(2, 3), 2.5]

        def scale_into_inputs(dtype):
            return [torch.arange(6, dtype=dtype), 3.0, torch.zeros(6, dtype=dtype)]

        RECIPES = {
            "scale": {"inputs": scale_inputs, "grad": [0],
                      "expected": torch.arange(6.0).reshape(2, 3) * 2.5},
            "scale_into": {"inputs": scale_into_inputs, "mutates": [2],
                           "expected": [0.0, 3.0, 6.0, 9.0, 12.0, 15.0],
                           "skip": {"fake": "no fake kernel: an eager-only out= op",
                                    "compile": "no fake kernel: an eager-only out= op"}},
        }
    '''
    return root, recipes


def write_abi3ops(root: Path) -> tuple[Path, str]:
    _write(root, {
        "pyproject.toml": '''
            [build-system]
            requires = ["setuptools>=64", "wheel", "torch"]
            build-backend = "setuptools.build_meta"

            [project]
            name = "abi3-ops"
            version = "1.0.0"
            requires-python = ">=3.9"
        ''',
        "setup.py": '''
            from setuptools import setup
            from torch.utils.cpp_extension import BuildExtension, CppExtension

            setup(
                packages=["abi3_ops"],
                ext_modules=[CppExtension(
                    "abi3_ops._C", ["src/softplus.cpp"], py_limited_api=True,
                    define_macros=[("Py_LIMITED_API", "0x03090000")],
                    extra_compile_args={"cxx": ["-O1", "-g0"]})],
                cmdclass={"build_ext": BuildExtension},
                options={"bdist_wheel": {"py_limited_api": "cp39"}},
            )
        ''',
        "src/softplus.cpp": '''
            #include <ATen/core/Tensor.h>
            #include <ATen/ops/exp.h>
            #include <ATen/ops/log1p.h>
            #include <ATen/ops/mul.h>
            #include <ATen/ops/sigmoid.h>
            #include <torch/library.h>

            at::Tensor softplus(const at::Tensor& x) { return at::log1p(at::exp(x)); }

            // reached only through softplus's backward
            at::Tensor softplus_backward(const at::Tensor& grad, const at::Tensor& x) {
              return at::mul(grad, at::sigmoid(x));
            }

            TORCH_LIBRARY(abi3_ops, m) {
              m.def("softplus(Tensor x) -> Tensor");
              m.def("softplus_backward(Tensor grad, Tensor x) -> Tensor");
            }

            TORCH_LIBRARY_IMPL(abi3_ops, CPU, m) {
              m.impl("softplus", &softplus);
              m.impl("softplus_backward", &softplus_backward);
            }
        ''',
        "abi3_ops/__init__.py": LOADER.format(pattern="_C*.so") + '''

@torch.library.register_fake("abi3_ops::softplus")
def _(x):
    return torch.empty_like(x)


@torch.library.register_fake("abi3_ops::softplus_backward")
def _(grad, x):
    return torch.empty_like(x)


def _setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])


def _backward(ctx, grad):
    (x,) = ctx.saved_tensors
    return torch.ops.abi3_ops.softplus_backward(grad, x)


torch.library.register_autograd("abi3_ops::softplus", _backward, setup_context=_setup)
''',
    })
    recipes = '''
        import torch

        def softplus_inputs(dtype):
            return [torch.linspace(-3, 3, 12, dtype=dtype).reshape(3, 4)]

        def matches_torch(call, args, out):
            want = torch.nn.functional.softplus(args[0])
            assert torch.allclose(out, want, atol=1e-6), "differs from F.softplus"

        RECIPES = {
            "softplus": {"inputs": softplus_inputs, "check": matches_torch, "grad": [0]},
        }
    '''
    return root, recipes


def write_cmakeops(root: Path) -> tuple[Path, str]:
    _write(root, {
        "pyproject.toml": '''
            [build-system]
            requires = ["scikit-build-core>=0.10", "torch"]
            build-backend = "scikit_build_core.build"

            [project]
            name = "cmakeops"
            version = "0.2.0"

            [tool.scikit-build]
            wheel.packages = ["python/cmakeops"]
            wheel.py-api = "py3"
            cmake.build-type = "Release"
        ''',
        "CMakeLists.txt": '''
            cmake_minimum_required(VERSION 3.18)
            project(cmakeops LANGUAGES CXX)
            find_package(Python COMPONENTS Interpreter REQUIRED)
            execute_process(
              COMMAND "${Python_EXECUTABLE}" -c "import torch; print(torch.utils.cmake_prefix_path)"
              OUTPUT_VARIABLE TORCH_PREFIX OUTPUT_STRIP_TRAILING_WHITESPACE)
            list(APPEND CMAKE_PREFIX_PATH "${TORCH_PREFIX}")
            find_package(Torch REQUIRED)
            add_library(cmakeops_kernels SHARED csrc/rows.cpp)
            target_compile_options(cmakeops_kernels PRIVATE -O1 -g0)
            target_link_libraries(cmakeops_kernels PRIVATE ${TORCH_LIBRARIES})
            install(TARGETS cmakeops_kernels LIBRARY DESTINATION cmakeops)
        ''',
        "csrc/rows.cpp": '''
            #include <ATen/core/Tensor.h>
            #include <ATen/ops/empty.h>
            #include <ATen/ops/ne.h>
            #include <ATen/ops/mul.h>
            #include <ATen/ops/sum.h>
            #include <torch/library.h>

            // integer output: no Autograd kernel, by design
            at::Tensor nonzero_per_row(const at::Tensor& x) {
              return at::sum(at::ne(x, 0), {1});
            }

            at::Tensor nonzero_per_row_meta(const at::Tensor& x) {
              return at::empty({x.size(0)}, x.options().dtype(at::kLong));
            }

            at::Tensor twice(const at::Tensor& x) { return at::mul(x, 2); }

            TORCH_LIBRARY(cmakeops, m) {
              m.def("nonzero_per_row(Tensor x) -> Tensor");
              m.def("twice(Tensor x) -> Tensor");
            }

            TORCH_LIBRARY_IMPL(cmakeops, CPU, m) {
              m.impl("nonzero_per_row", &nonzero_per_row);
              m.impl("twice", &twice);
            }

            TORCH_LIBRARY_IMPL(cmakeops, Meta, m) {
              m.impl("nonzero_per_row", &nonzero_per_row_meta);
            }
        ''',
        "python/cmakeops/__init__.py": LOADER.format(pattern="*cmakeops_kernels*") + '''

@torch.library.register_fake("cmakeops::twice")
def _(x):
    return torch.empty_like(x)


def _backward(ctx, grad):
    return grad * 2


torch.library.register_autograd("cmakeops::twice", _backward)
''',
    })
    recipes = '''
        import torch

        def rows_inputs(dtype):
            return [torch.tensor([[0.0, 1.0, 2.0], [0.0, 0.0, 5.0]], dtype=dtype)]

        RECIPES = {
            "nonzero_per_row": {"inputs": rows_inputs, "expected": [2, 1]},
            "twice": {"inputs": rows_inputs, "grad": [0],
                      "expected": [[0.0, 2.0, 4.0], [0.0, 0.0, 10.0]]},
        }
    '''
    return root, recipes


def write_pyops(root: Path) -> tuple[Path, str]:
    _write(root, {
        "pyproject.toml": '''
            [build-system]
            requires = ["setuptools>=64"]
            build-backend = "setuptools.build_meta"

            [project]
            name = "pyops"
            version = "2.0.1"
            dependencies = ["torch>=2.4"]

            [tool.setuptools]
            packages = ["pyops"]
        ''',
        "pyops/__init__.py": '''
            import torch
            from torch.library import custom_op


            @custom_op("pyops::smooth", mutates_args=())
            def smooth(x: torch.Tensor, k: int) -> torch.Tensor:
                return torch.nn.functional.avg_pool1d(x[None], k, 1, k // 2)[0]


            @smooth.register_fake
            def _(x, k):
                return torch.empty_like(x)


            def _setup(ctx, inputs, output):
                ctx.k = inputs[1]


            def _backward(ctx, grad):
                k = ctx.k
                weight = torch.full((1, 1, k), 1.0 / k, dtype=grad.dtype, device=grad.device)
                g = torch.nn.functional.conv_transpose1d(grad[:, None], weight, padding=k // 2)
                return g[:, 0], None


            smooth.register_autograd(_backward, setup_context=_setup)


            # mutating
            @custom_op("pyops::clamp_", mutates_args=("x",))
            def clamp_(x: torch.Tensor, lo: float, hi: float) -> None:
                x.clamp_(lo, hi)


            @clamp_.register_fake
            def _(x, lo, hi):
                return None


            # only a CPU kernel
            @custom_op("pyops::histc_cpu", mutates_args=(), device_types="cpu")
            def histc_cpu(x: torch.Tensor, bins: int) -> torch.Tensor:
                return torch.histc(x, bins, 0.0, 1.0)


            @histc_cpu.register_fake
            def _(x, bins):
                return x.new_empty(bins)
        ''',
    })
    recipes = '''
        import torch

        def smooth_inputs(dtype):
            g = torch.Generator().manual_seed(0)
            return [torch.rand(2, 8, generator=g).to(dtype), 3]

        def clamp_inputs(dtype):
            return [torch.tensor([-2.0, 0.5, 3.0], dtype=dtype), 0.0, 1.0]

        def hist_inputs(dtype):
            return [torch.tensor([0.1, 0.2, 0.9, 0.95], dtype=dtype), 2]

        RECIPES = {
            "smooth": {"inputs": smooth_inputs, "grad": [0]},
            "clamp_": {"inputs": clamp_inputs, "mutates": [0], "expected": [0.0, 0.5, 1.0]},
            "histc_cpu": {"inputs": hist_inputs, "expected": [2.0, 2.0]},
        }
    '''
    return root, recipes


EXTENSIONS = {"hostguess": write_hostguess, "abi3ops": write_abi3ops,
              "cmakeops": write_cmakeops, "pyops": write_pyops}
