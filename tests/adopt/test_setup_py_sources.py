"""Module names and sources setup.py computes from text it holds: a glob of a formatted
pattern, a variable of the function that returns the extensions, an f-string of a module-level
name; and the distribution read from ``setup(name=...)``, not from the first ``name=`` of the
file (an ``Extension(name=...)`` above it).

The shapes are those of real packages from the registry (torch-points-kernels 0.7.0:
``glob.glob("{}/src/*.cpp".format(root))`` inside ``get_ext_modules()``, and its
``CUDAExtension(name=...)`` before ``setup(name=...)``), written anew."""

from __future__ import annotations

import textwrap
from pathlib import Path

from opforge.cli import main
from opforge.scan import scan_extension

PYBIND = """
#include <torch/extension.h>
torch::Tensor {fn}(torch::Tensor x) {{ return x; }}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {{ m.def("{fn}", &{fn}); }}
"""


def project(root: Path, setup_py: str) -> Path:
    files = {"globbed/__init__.py": "", "cpu/src/bindings.cpp": PYBIND.format(fn="near"),
             "cpu/src/near.cpp": "int near_helper() { return 1; }\n",
             "cuda/src/bindings.cpp": PYBIND.format(fn="far"),
             "setup.py": textwrap.dedent(setup_py)}
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text.lstrip("\n"))
    return root


FUNCTION_LOCAL = """
import glob
import os
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension

WITH_CUDA = os.getenv("FORCE_CUDA", "0") == "1"


def get_ext_modules():
    ext_modules = []
    src_root = "cuda"
    sources = glob.glob("{}/src/*.cpp".format(src_root))
    if WITH_CUDA:
        ext_modules.append(CUDAExtension(name="globbed.points_cuda", sources=sources))
    src_root = "cpu"  # rebound: the cpu extension sees its own value
    cpu_sources = glob.glob("{}/src/*.cpp".format(src_root))
    ext_modules.append(CppExtension(name="globbed.points_cpu", sources=cpu_sources))
    return ext_modules


setup(name="globbed-kernels", version="1.0", ext_modules=get_ext_modules(),
      cmdclass={"build_ext": BuildExtension})
"""


def test_sources_a_function_globs_from_a_formatted_pattern_are_read(tmp_path):
    scan = scan_extension(project(tmp_path, FUNCTION_LOCAL))
    built = {e.name: e.sources for e in scan.extensions}
    assert built["globbed.points_cpu"] == ["cpu/src/bindings.cpp", "cpu/src/near.cpp"]
    # src_root was "cuda" above the CUDA extension: the later "cpu" is not what it saw
    assert built["globbed.points_cuda"] == ["cuda/src/bindings.cpp"]
    assert list(scan.modules["globbed.points_cpu"].functions) == ["near"]
    assert scan.modules["globbed.points_cpu"].backend == "cpu"
    assert not scan.by_hand, scan.by_hand


def test_the_distribution_is_setups_name_not_an_extensions(tmp_path):
    scan = scan_extension(project(tmp_path, FUNCTION_LOCAL))
    assert scan.distribution == "globbed-kernels"
    assert scan.package == "globbed"


def test_a_module_named_by_an_f_string_of_a_module_constant_is_read(tmp_path):
    scan = scan_extension(project(tmp_path, """
        import glob
        import os
        from setuptools import setup
        from torch.utils.cpp_extension import BuildExtension, CppExtension

        library_name = "globbed"
        csrc = os.path.join("cpu", "src")
        setup(name=library_name, version="1.0",
              ext_modules=[CppExtension(f"{library_name}._C", glob.glob(f"{csrc}/*.cpp"))],
              cmdclass={"build_ext": BuildExtension})
        """))
    assert [(e.name, e.sources) for e in scan.extensions] == \
        [("globbed._C", ["cpu/src/bindings.cpp", "cpu/src/near.cpp"])]
    assert scan.distribution == "globbed"
    assert not scan.by_hand, scan.by_hand


def test_a_name_computed_otherwise_still_asks_for_a_hand(tmp_path):
    # a loop variable and a format spec: not text setup.py holds, so nothing is guessed
    scan = scan_extension(project(tmp_path, """
        from setuptools import setup
        from torch.utils.cpp_extension import BuildExtension, CppExtension

        exts = [CppExtension(f"globbed._{name:>4}", ["cpu/src/bindings.cpp"])
                for name in ("a", "b")]
        exts += [CppExtension("globbed.{0.upper}".format("x"), ["cpu/src/near.cpp"])]
        setup(name="globbed", ext_modules=exts, cmdclass={"build_ext": BuildExtension})
        """))
    assert scan.extensions == []
    asked = [h for h in scan.by_hand if h.startswith("setup.py:")]
    assert [h.split(" names its module")[0] for h in asked] == [
        "setup.py:4: CppExtension(f'globbed._{name:>4}', ...)",
        "setup.py:6: CppExtension('globbed.{0.upper}'.format('x'), ...)"], asked


def test_init_adopts_the_globbing_package_without_a_hand(tmp_path, capsys, monkeypatch):
    from opforge import _release

    monkeypatch.setattr(_release, "WORKFLOWS_COMMIT", "f" * 40)
    root = project(tmp_path, FUNCTION_LOCAL)
    assert main(["init", str(root)]) == 0, capsys.readouterr().err
    matrix = (root / "matrix.yaml").read_text()
    assert "globbed.points_cpu: {backend: cpu, functions: [near]}" in matrix, matrix
    assert "distribution: globbed-kernels" in matrix
