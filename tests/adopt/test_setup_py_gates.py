"""How setup.py decides what it compiles, read as the build would by default: an extension
class picked at build time (``Ext = CUDAExtension if WITH_CUDA else CppExtension``), a module
built only when the package's own variable is set (an opt-in no variant sets: not promised),
and a module only nvcc compiles (a CUDAExtension with .cu sources: the cuda backend's).

The shapes are those of real packages from the registry (dbscan-torch 0.2.0,
torch-linear-assignment 0.1.0), written anew."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from opforge.cli import main
from opforge.scan import scan_extension

PYBIND = """
#include <torch/extension.h>
torch::Tensor run(torch::Tensor x) { return x; }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("run", &run); }
"""


@pytest.fixture(autouse=True)
def released_opforge(monkeypatch):
    from opforge import _release

    monkeypatch.setattr(_release, "WORKFLOWS_COMMIT", "f" * 40)


def project(root: Path, setup_py: str) -> Path:
    files = {"pyproject.toml": "[project]\nname = 'gated'\nversion = '1.0'\n",
             "gated/__init__.py": "", "csrc/ext.cpp": PYBIND, "csrc/ext_cuda.cu": "",
             "setup.py": textwrap.dedent(HEAD) + textwrap.dedent(setup_py)}
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text.lstrip("\n"))
    return root


HEAD = """
import os
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension
"""


def test_an_extension_class_picked_at_build_time_is_a_module_every_build_has(tmp_path):
    scan = scan_extension(project(tmp_path, """
        WITH_CUDA = os.environ.get("FORCE_CUDA", "0") == "1"
        cuda_sources = ["csrc/ext_cuda.cu"] if WITH_CUDA else []
        ExtCls = CUDAExtension if WITH_CUDA else CppExtension
        setup(ext_modules=[ExtCls(name="gated._C", sources=["csrc/ext.cpp"] + cuda_sources)],
              cmdclass={"build_ext": BuildExtension})
        """))
    module = scan.modules["gated._C"]
    assert module.backend == "cpu" and list(module.functions) == ["run"]
    assert module.sources == ["csrc/ext.cpp"]


@pytest.mark.parametrize("gate", [
    # an early return: the extension list is empty unless the package's variable says "1"
    """
    def get_ext():
        if os.environ.get("GATED_BUILD_EXT") != "1":
            return []
        return [CUDAExtension("gated._backend", ["csrc/ext.cpp", "csrc/ext_cuda.cu"])]
    setup(ext_modules=get_ext(), cmdclass={"build_ext": BuildExtension})
    """,
    # a branch taken only when the variable is set
    """
    ext = []
    if os.getenv("GATED_BUILD_EXT"):
        ext.append(CppExtension("gated._backend", ["csrc/ext.cpp"]))
    setup(ext_modules=ext)
    """,
    # the else of a branch taken while it is unset
    """
    ext = []
    if "GATED_BUILD_EXT" not in os.environ:
        pass
    else:
        ext = [CppExtension("gated._backend", ["csrc/ext.cpp"])]
    setup(ext_modules=ext)
    """,
])
def test_a_module_built_only_on_the_packages_own_request_is_not_promised(tmp_path, gate):
    scan = scan_extension(project(tmp_path, gate))
    assert scan.modules == {}
    assert [e.opt_in for e in scan.extensions] == ["GATED_BUILD_EXT"]
    assert any("gated._backend is built only when GATED_BUILD_EXT is set" in n
               for n in scan.notes)


@pytest.mark.parametrize("gate", [
    # built unless the package's variable is set: a default build has it
    """
    ext = []
    if not os.getenv("GATED_NO_EXT"):
        ext = [CppExtension("gated._backend", ["csrc/ext.cpp"])]
    setup(ext_modules=ext)
    """,
    # a gate on what opforge sets is the variant's business (FORCE_CUDA: the cuda build)
    """
    ext = [CppExtension("gated._backend", ["csrc/ext.cpp"])]
    if os.environ.get("FORCE_CUDA") == "1":
        ext = [CUDAExtension("gated._backend", ["csrc/ext.cpp", "csrc/ext_cuda.cu"])]
    setup(ext_modules=ext)
    """,
    # a condition on something else (torch, the host): cannot be told, so promised as before
    """
    import torch
    ext = []
    if torch.cuda.is_available() or os.getenv("GATED_BUILD_EXT"):
        ext = [CppExtension("gated._backend", ["csrc/ext.cpp"])]
    setup(ext_modules=ext)
    """,
])
def test_a_module_a_default_build_has_stays_promised(tmp_path, gate):
    scan = scan_extension(project(tmp_path, gate))
    assert list(scan.modules) == ["gated._backend"]
    assert scan.modules["gated._backend"].backend == "cpu"
    assert all(e.opt_in is None for e in scan.extensions)


def test_a_cuda_extension_with_cuda_sources_is_the_cuda_backends(tmp_path):
    scan = scan_extension(project(tmp_path, """
        setup(ext_modules=[CUDAExtension("gated._cu", ["csrc/ext.cpp", "csrc/ext_cuda.cu"])])
        """))
    assert scan.modules["gated._cu"].backend == "cuda"


def test_init_on_a_package_whose_only_module_is_opt_in_says_so(tmp_path, capsys):
    root = project(tmp_path, """
        def get_ext():
            if os.environ.get("GATED_BUILD_EXT") != "1":
                return []
            return [CUDAExtension("gated._backend", ["csrc/ext.cpp", "csrc/ext_cuda.cu"])]
        setup(ext_modules=get_ext())
        """)
    assert main(["init", str(root)]) == 2
    err = capsys.readouterr().err
    assert "gated._backend is built only when GATED_BUILD_EXT is set" in err
    assert "a default build compiles nothing to check" in err
    assert "Traceback" not in err and not (root / "matrix.yaml").exists()


GUARDED = """
#include <torch/extension.h>
torch::Tensor run(torch::Tensor x) { return x; }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("run", &run);
#ifdef WITH_CUDA
  m.def("run_cuda_debug", &run);
#endif
#if defined(WITH_OPENMP)
  m.def("threads", &run);
#else
  m.def("one_thread", &run);
#endif
  m.def("after", &run);
}
"""


def test_a_function_defined_under_a_preprocessor_conditional_is_not_promised(tmp_path):
    """dbscan-torch 0.2.0's cpu build exports no dbscan2d_cuda_debug (#ifdef WITH_CUDA):
    promising it made a healthy wheel red."""
    root = project(tmp_path, """
        setup(ext_modules=[CppExtension("gated._C", ["csrc/ext.cpp"])])
        """)
    (root / "csrc" / "ext.cpp").write_text(GUARDED)
    scan = scan_extension(root)
    assert list(scan.modules["gated._C"].functions) == ["run", "after"]
    said = " ".join(scan.found["csrc/ext.cpp"])
    assert "run_cuda_debug is defined only under #ifdef WITH_CUDA: not promised" in said
    assert "threads is defined only under #if defined(WITH_OPENMP)" in said
    assert "one_thread is defined only under #if defined(WITH_OPENMP) (its #else)" in said
