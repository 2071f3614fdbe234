"""The ABI audit on small libraries the real compiler builds: symbol classes, the minimum torch
from torch's own shim version table, and each contradiction that fails a wheel.

Each library declares the functions it calls by hand (no torch or Python headers), so it
compiles in well under a second and carries exactly the undefined symbols a test needs.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from opforge import abi
from opforge.stamp import BuildFacts, stamp_wheel

pytestmark = pytest.mark.skipif(
    shutil.which("g++") is None or not abi.available(),
    reason="needs g++, nm and torch-abi-audit (Python >= 3.11)")


def compile_library(tmp_path: Path, name: str, source: str, *link: str) -> Path:
    src = tmp_path / f"{name}.cpp"
    src.write_text(source)
    out = tmp_path / f"{name}.so"
    subprocess.run(["g++", "-shared", "-fPIC", "-O1", "-o", str(out), str(src), *link],
                   check=True)
    return out


STABLE = '''
extern "C" int aoti_torch_get_numel(void*, long*);        // torch 2.9 (baseline)
extern "C" int torch_library_impl(void*, const char*, void*, int);   // torch 2.10
extern "C" int PyModule_Create2(void*, int);               // CPython limited API
extern "C" long use(void* t) {
  long n = 0; aoti_torch_get_numel(t, &n);
  torch_library_impl(nullptr, "op", nullptr, 0);
  return n + PyModule_Create2(nullptr, 3);
}
'''


def test_stable_library_shim_symbols_set_the_minimum_torch(tmp_path):
    lib = compile_library(tmp_path, "stable", STABLE)
    audit = abi.audit_library(lib)
    assert sorted(audit.stable_shim) == ["aoti_torch_get_numel", "torch_library_impl"]
    assert audit.libtorch_cxx == [] and audit.cpython_other == []
    assert audit.cpython_limited == ["PyModule_Create2"]
    # torch_library_impl first shipped in 2.10.0: that is the floor, and the symbol is named
    assert audit.min_torch == "2.10.0" and audit.min_torch_symbols == ["torch_library_impl"]
    assert abi.problems("stable.so", audit, stable=True, abi3=True, torch_floor="2.10",
                        cuda_major="") == []
    assert abi.shim_version("torch_library_impl") == "2.10.0"


def test_a_shim_function_newer_than_the_floor_is_a_failure(tmp_path):
    lib = compile_library(tmp_path, "newer", STABLE.replace(
        "return n +", "torch_has_storage(t, nullptr); return n +").replace(
        "extern \"C\" long use", "extern \"C\" int torch_has_storage(void*, bool*);\n"
                                "extern \"C\" long use"))
    audit = abi.audit_library(lib)
    assert audit.min_torch == "2.14.0" and audit.min_torch_symbols == ["torch_has_storage"]
    [problem] = abi.problems("newer.so", audit, stable=True, abi3=True, torch_floor="2.10",
                             cuda_major="")
    assert "needs torch >= 2.14.0" in problem and "torch_has_storage" in problem
    assert "above the declared floor torch>=2.10" in problem


def test_libtorch_cxx_symbol_fails_a_stable_wheel_but_not_a_legacy_one(tmp_path):
    lib = compile_library(tmp_path, "legacy", '''
namespace c10 { void* alloc_cpu(unsigned long); }
namespace at { struct Tensor; }
extern "C" void* use(unsigned long n) { return c10::alloc_cpu(n); }
''')
    audit = abi.audit_library(lib)
    assert audit.libtorch_cxx == ["c10::alloc_cpu(unsigned long)"]
    [problem] = abi.problems("legacy.so", audit, stable=True, abi3=True, torch_floor="2.10",
                             cuda_major="")
    assert "libtorch C++ symbols in a stable-ABI wheel" in problem and "c10::alloc_cpu" in problem
    assert abi.problems("legacy.so", audit, stable=False, abi3=False, torch_floor=None,
                        cuda_major="") == []


def test_non_limited_cpython_symbol_fails_an_abi3_wheel(tmp_path):
    lib = compile_library(tmp_path, "capi", '''
extern "C" void* _PyObject_GetDictPtr(void*);
extern "C" void* use(void* o) { return _PyObject_GetDictPtr(o); }
''')
    audit = abi.audit_library(lib)
    assert audit.cpython_other == ["_PyObject_GetDictPtr"]
    [problem] = abi.problems("capi.so", audit, stable=False, abi3=True, torch_floor=None,
                             cuda_major="")
    assert "outside the limited API in an abi3 wheel" in problem
    assert abi.problems("capi.so", audit, stable=False, abi3=False, torch_floor=None,
                        cuda_major="") == []


def test_cuda_runtime_major_must_match_the_variant(tmp_path):
    # a CUDA runtime stand-in with the real soname: the library NEEDs libcudart.so.13
    runtime = tmp_path / "libcudart.so.13"
    subprocess.run(["g++", "-shared", "-fPIC", "-Wl,-soname,libcudart.so.13", "-o",
                    str(runtime), "-x", "c++", "-"], input=b'extern "C" int '
                   b"cudaGetDeviceCount(int* n) { *n = 0; return 0; }\n", check=True)
    lib = compile_library(tmp_path, "kernels", '''
extern "C" int cudaGetDeviceCount(int*);
extern "C" int use() { int n; return cudaGetDeviceCount(&n); }
''', str(runtime))
    from opforge.wheels import _needed

    audit = abi.audit_library(lib, _needed(lib))
    assert audit.cuda_runtime == ["cudaGetDeviceCount"] and audit.cuda_runtime_major == "13"
    [problem] = abi.problems("kernels.so", audit, stable=False, abi3=False, torch_floor=None,
                             cuda_major="12")
    assert "links the CUDA 13 runtime" in problem and "the variant is CUDA 12" in problem
    assert abi.problems("kernels.so", audit, stable=False, abi3=False, torch_floor=None,
                        cuda_major="13") == []
    [cpu] = abi.problems("kernels.so", audit, stable=False, abi3=False, torch_floor=None,
                         cuda_major="")
    assert "in a variant without CUDA" in cpu


def _raw_wheel(tmp_path: Path, tag: str) -> Path:
    import zipfile

    info = "tiny-1.0.0.dist-info"
    path = tmp_path / "raw" / f"tiny-1.0.0-{tag}.whl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("tiny/__init__.py", "")
        zf.writestr(f"{info}/WHEEL", f"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: {tag}\n")
        zf.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: tiny\nVersion: 1.0.0\n"
                                        "Requires-Dist: torch==2.13.0\n")
        zf.writestr(f"{info}/RECORD", "")
    return path


def test_stable_stamp_requires_the_floor_and_an_abi3_build(tmp_path):
    facts = BuildFacts(variant="cpu_stable", torch_version="2.13.0+cpu",
                       torch_requirement="torch>=2.10", local_version="cpu.stable",
                       extra={"abi": "stable", "torch_floor": "2.10"})
    result = stamp_wheel(_raw_wheel(tmp_path, "cp310-abi3-linux_x86_64"), tmp_path / "out",
                         facts)
    assert result.wheel.name == "tiny-1.0.0+cpu.stable-cp310-abi3-linux_x86_64.whl"
    import zipfile

    with zipfile.ZipFile(result.wheel) as zf:
        metadata = zf.read("tiny-1.0.0+cpu.stable.dist-info/METADATA").decode()
    assert "Requires-Dist: torch>=2.10\n" in metadata and "torch==" not in metadata
    assert result.record["abi"] == "stable" and result.record["torch_floor"] == "2.10"
    from opforge.errors import OpforgeError

    with pytest.raises(OpforgeError, match="not abi3.*OPFORGE_ABI=stable"):
        stamp_wheel(_raw_wheel(tmp_path / "b", "cp311-cp311-linux_x86_64"), tmp_path / "o2",
                    facts)
