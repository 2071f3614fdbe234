"""The probe's dlopen-error diagnosis, on the error texts glibc and macOS dyld print."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from opforge.smoke.probe import classify_load_error, missing_key_message, read_build_facts

CPU_TORCH = SimpleNamespace(__version__="2.14.1+cpu", version=SimpleNamespace(cuda=None))
CUDA_TORCH = SimpleNamespace(__version__="2.14.1+cu130", version=SimpleNamespace(cuda="13.0"))
BUILT_213 = {"built_against_torch": "2.13.0", "source": "opforge_ops/_build_info.json",
             "build_info": {"cuda_version": "12.6"}}


@pytest.mark.parametrize("error", [
    "/x/_C.so: undefined symbol: _ZN3c104impl3cow11cow_deleterEPv",
    "dlopen(/x/_C.so, 0x0006): Symbol not found: __ZN3c104impl3cow11cow_deleterEPv\n"
    "  Referenced from: /x/_C.so\n  Expected in: /y/libc10.dylib",
])
def test_undefined_symbol_under_another_torch_is_abi_drift(error):
    d = classify_load_error("/x/_C.so", error, BUILT_213, CPU_TORCH)
    assert d["kind"] == "abi_drift"
    assert d["message"].startswith("ABI drift: _C.so needs symbol")
    assert "built against torch 2.13.0 (opforge_ops/_build_info.json), running torch 2.14.1+cpu" \
        in d["message"]
    assert "pip install torch==2.13.0" in d["message"]


def test_undefined_symbol_with_the_same_torch_is_not_called_drift():
    d = classify_load_error("/x/_C.so", "/x/_C.so: undefined symbol: foo",
                            {"built_against_torch": "2.14.1", "source": "pin"}, CPU_TORCH)
    assert d["kind"] == "undefined_symbol"
    assert "rebuild it in this environment" in d["message"]


@pytest.mark.parametrize("error", [
    "libc10_cuda.so: cannot open shared object file: No such file or directory",
    "dlopen(/x/_C.so, 0x0006): Library not loaded: @rpath/libcudart.13.dylib",
])
def test_cuda_library_missing_beside_cpu_torch(error):
    d = classify_load_error("/x/_C.so", error, BUILT_213, CPU_TORCH)
    assert d["kind"] == "cuda_extension_cpu_torch"
    assert "a CUDA build of the extension was installed beside a CPU torch" in d["message"]


def test_cuda_library_missing_beside_cuda_torch_is_a_cuda_mismatch():
    d = classify_load_error("/x/_C.so", "libcudart.so.12: cannot open shared object file: "
                            "No such file or directory", BUILT_213, CUDA_TORCH)
    assert d["kind"] == "cuda_mismatch"
    assert "built for another CUDA version (build info cuda_version: 12.6)" in d["message"]


def test_other_missing_library_says_bundle_it():
    d = classify_load_error("/x/_C.so", "libfoo.so.1: cannot open shared object file: "
                            "No such file or directory", {}, CPU_TORCH)
    assert d == {**d, "kind": "missing_library", "missing": "libfoo.so.1"}
    assert "auditwheel repair" in d["message"]


def test_missing_key_messages_say_what_the_user_hits():
    assert "Could not run 'opforge::nms' with arguments from the 'MPS' backend" in \
        missing_key_message("opforge", "nms", "MPS")
    assert "no fake impl or Meta kernel registered" in missing_key_message("opforge", "nms", "Meta")
    assert "torch.autocast('cuda')" in missing_key_message("opforge", "nms", "AutocastCUDA")


def test_build_facts_fall_back_to_the_wheel_pin(tmp_path, monkeypatch):
    import importlib.metadata as md

    class Dist:
        metadata = {"Name": "pinned-pkg"}
        version = "1.0"
        requires = ["numpy", "torch==2.13.0", "scipy; extra == 'x'"]

        @staticmethod
        def read_text(name):
            return None  # not stamped by opforge: no build record

    monkeypatch.setattr(md, "packages_distributions", lambda: {"pinned_pkg": ["pinned-pkg"]})
    monkeypatch.setattr(md, "distribution", lambda name: Dist)
    facts = read_build_facts("pinned_pkg", str(tmp_path))
    assert facts["built_against_torch"] == "2.13.0"
    assert facts["source"] == "pinned-pkg wheel pin torch==2.13.0"


class _FakeTensor:
    def __init__(self, fail: bool):
        self.fail = fail

    def __mul__(self, other):
        if self.fail:
            raise RuntimeError("MPS backend out of memory (MPS allocated: 0 B, max allowed: 0 B)")
        return self

    def sum(self):
        return self

    def cpu(self):
        return self

    def __float__(self):
        return 4032.0


def _fake_torch(mps_allocates: bool):
    def arange(n, dtype=None, device="cpu"):
        return _FakeTensor(fail=device == "mps" and not mps_allocates)

    return SimpleNamespace(
        __version__="2.13.0", arange=arange, float32="float32",
        version=SimpleNamespace(cuda=None, hip=None),
        cuda=SimpleNamespace(is_available=lambda: False),
        backends=SimpleNamespace(mps=SimpleNamespace(is_built=lambda: True,
                                                     is_available=lambda: True)))


@pytest.mark.parametrize("allocates, present", [(False, ["cpu"]), (True, ["cpu", "mps"])])
def test_mps_that_reports_available_but_cannot_allocate_is_absent(allocates, present):
    """GitHub's hosted macOS runners: is_available() is True, the first allocation fails."""
    from opforge.smoke.probe import Report, parse_args, probe_devices

    args = parse_args(["--package", "p", "--namespace", "n", "--out", "x"])
    report = Report(args)
    assert probe_devices(report, args, _fake_torch(allocates)) == present
    mps = report.doc["devices"]["mps"]
    assert mps["available"] is True and mps["present"] is allocates
    if not allocates:
        assert mps["detail"].startswith("mps reports available but a 256-byte allocation and "
                                        "sum failed: RuntimeError: MPS backend out of memory")
    assert report.doc["devices"]["cuda"]["detail"] == "torch 2.13.0 has no cuda support"


@pytest.mark.parametrize("error, kind, words", [
    ("/lib/x86_64-linux-gnu/libstdc++.so.6: version `GLIBCXX_3.4.32' not found (required by "
     "/x/_C.so)", "runtime_too_new", ["_C.so needs GLIBCXX_3.4.32", "manylinux_2_28"]),
    ("/lib/x86_64-linux-gnu/libc.so.6: version `GLIBC_2.38' not found (required by /x/_C.so)",
     "runtime_too_new", ["_C.so needs GLIBC_2.38"]),
    ("/x/_C.so: invalid ELF header", "not_a_library", ["not a loadable library", "invalid ELF"]),
    ("/x/_C.so: wrong ELF class: ELFCLASS32", "not_a_library", ["wrong ELF class"]),
])
def test_runtime_and_file_format_load_errors(error, kind, words):
    d = classify_load_error("/x/_C.so", error, BUILT_213, CPU_TORCH)
    assert d["kind"] == kind
    for word in words:
        assert word in d["message"]


def test_extension_module_for_another_python_is_named_before_its_symbols():
    d = classify_load_error("/x/_C.cpython-38-x86_64-linux-gnu.so",
                            "/x/_C.cpython-38-x86_64-linux-gnu.so: undefined symbol: "
                            "_PyThreadState_UncheckedGet", BUILT_213, CPU_TORCH)
    assert d["kind"] == "other_python"
    assert "an extension module for CPython 3.8" in d["message"]


def test_orphan_kernels_are_not_ops_and_are_listed_with_their_key():
    import torch

    from opforge.smoke.probe.census import namespace_ops
    from opforge.smoke.probe.registrations import op_names, orphan_kernels

    lib = torch.library.Library("opforge_orphan_test", "IMPL")  # kernels, no schema
    lib.impl("ghost", lambda x: x, "CPU")
    try:
        assert "opforge_orphan_test::ghost" in orphan_kernels(torch)
        assert list(orphan_kernels(torch)["opforge_orphan_test::ghost"]) == ["CPU"]
        assert "opforge_orphan_test::ghost" not in op_names(torch)
        assert namespace_ops(torch, "opforge_orphan_test") == []
    finally:
        lib._destroy()


def test_declared_op_missing_beside_a_near_spelling_says_did_you_mean():
    import torch

    from opforge.smoke.probe import Report, parse_args, run_census

    lib = torch.library.Library("opforge_near_test", "DEF")
    lib.define("scaled_add(Tensor x) -> Tensor")
    try:
        args = parse_args(["--package", "p", "--namespace", "opforge_near_test", "--out", "x"])
        report = Report(args)
        run_census(report, {"op_keys": {"scaled_ad": ["CPU"]}}, "opforge_near_test", torch)
        check = next(c for c in report.doc["checks"] if c["id"] == "census:scaled_ad")
        assert check["status"] == "fail"
        assert check["message"].startswith("opforge_near_test::scaled_ad is not registered "
                                           "(opforge_near_test defines scaled_add: did you mean "
                                           "it?)")
    finally:
        lib._destroy()
