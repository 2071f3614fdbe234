"""Platform backends (opforge.platforms): each one module behind one interface. cpu, cuda and
mps are the ones this repository builds; rocm and xpu are checked here against fake toolkit
trees (validation, build environment, host check, description), and a backend that opforge
does not ship is added as one module plus matrix entries."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
import yaml
from projectkit import matrix_yaml, variant_entry

from opforge import build, platforms
from opforge.errors import OpforgeError
from opforge.matrix import MatrixError, load_matrix
from opforge.platforms import toolchain
from opforge.platforms.base import Backend
from opforge.stamp import BuildFacts, stamp_wheel

PLATFORMS = ("linux-x86_64", "macos-arm64", "windows-x86_64")
ROCM = variant_entry("rocm64", ("CPU", "CUDA", "Meta"), backend="rocm", toolkit="6.4",
                     arch_list="gfx90a;gfx942")
XPU = variant_entry("xpu", ("CPU", "XPU", "Meta"), platforms=("linux-x86_64", "windows-x86_64"),
                    backend="xpu", toolkit="2025.1", arch_list="pvc;bmg")


def _matrix(tmp_path: Path, *variants: dict):
    """``demo`` on three platforms with these ``variants`` (projectkit.variant_entry dicts)."""
    (tmp_path / "setup.py").write_text("from setuptools import setup\nsetup()\n")
    path = tmp_path / "matrix.yaml"
    path.write_text(matrix_yaml("demo", ["scale"], distribution="demo", recipes=None,
                                platforms=PLATFORMS, variants=list(variants)))
    return load_matrix(path)


def _refused(tmp_path: Path, *variants: dict) -> str:
    with pytest.raises(MatrixError) as info:
        _matrix(tmp_path, *variants)
    return str(info.value)


def _fake_rocm(root: Path, version: str) -> Path:
    (root / ".info").mkdir(parents=True)
    (root / ".info" / "version").write_text(f"{version}.0-120\n")
    (root / "bin").mkdir()
    (root / "bin" / "hipcc").write_text("#!/bin/sh\necho hipcc\n")
    (root / "bin" / "hipcc").chmod(0o755)
    return root


def _fake_oneapi(root: Path, release: str) -> Path:
    compiler = root / "compiler" / release
    (compiler / "bin").mkdir(parents=True)
    icpx = compiler / "bin" / "icpx"
    icpx.write_text(f"#!/bin/sh\necho 'Intel(R) oneAPI DPC++/C++ Compiler {release}.0 "
                    f"({release}.0.20250317)'\n")
    icpx.chmod(0o755)
    return root


def test_every_backend_opforge_ships_is_a_registered_module():
    assert {"cpu", "cuda", "mps", "rocm", "xpu"} <= set(platforms.names())
    for name in ("cpu", "cuda", "mps", "rocm", "xpu"):
        backend = platforms.get(name)
        assert type(backend).__module__ == f"opforge.platforms.{name}"
    with pytest.raises(KeyError, match="unknown backend 'npu'"):
        platforms.get("npu")


def test_a_backend_that_checks_device_code_says_so():
    # the smoke reads the wheel for missing_device_code only where checks_device_code is set:
    # a backend that overrides the one without the other would never be asked
    base = platforms.base.Backend.missing_device_code
    for name in platforms.names():
        backend = platforms.get(name)
        overrides = type(backend).missing_device_code is not base
        assert overrides == backend.checks_device_code, name
    assert platforms.get("cuda").checks_device_code
    assert not platforms.get("cpu").checks_device_code


def test_the_repository_variants_get_their_backend_from_cuda_and_mps(tmp_path):
    path = Path(__file__).resolve().parents[2] / "matrix.yaml"
    matrix = load_matrix(path)
    # what each entry spells in matrix.yaml (the variant keeps only its backend and toolkit)
    spelled = {v["name"]: v for v in yaml.safe_load(path.read_text())["variants"]}
    for variant in matrix.variants:
        entry = spelled[variant.name]
        expected = "cuda" if entry.get("cuda") else "mps" if entry.get("mps") else "cpu"
        assert variant.backend == expected
        line = platforms.backend_of(variant).describe(variant)
        assert line.startswith(f"{variant.name}: ")
    assert "CUDA 13.0 kernels for sm 7.5;8.0" in \
        platforms.backend_of(matrix.variant("cu130")).describe(matrix.variant("cu130"))


def test_rocm_variant_is_validated_by_its_module(tmp_path):
    variant = _matrix(tmp_path, ROCM).variant("rocm64")
    assert (variant.backend, variant.toolkit, variant.option("arch_list")) == \
        ("rocm", "6.4", "gfx90a;gfx942")
    # torch's ROCm build runs HIP kernels as "cuda" devices under the CUDA key
    assert variant.backends == ("cpu", "cuda")
    assert _matrix(tmp_path, ROCM).torch_index(variant).endswith("/whl/rocm6.4")
    message = _refused(tmp_path, {**ROCM, "arch_list": "gfx90a;sm_80"})
    assert "matrix.yaml:" in message and "variants[0].arch_list" in message
    assert "'sm_80' is not an --offload-arch target like gfx90a" in message
    assert "'six' is not a ROCm version like 6.4" in \
        _refused(tmp_path, {**ROCM, "toolkit": "six"})
    message = _refused(tmp_path, {**ROCM, "platforms": ["macos-arm64"]})
    assert "ROCm variant 'rocm64' cannot target macos-arm64" in message
    message = _refused(tmp_path, {k: v for k, v in ROCM.items() if k != "toolkit"})
    assert "ROCm variant 'rocm64' needs toolkit:" in message
    message = _refused(tmp_path, {**ROCM, "build_env": {"ROCM_HOME": "/opt/rocm"}})
    assert "variants[0].build_env.ROCM_HOME" in message and "opforge sets ROCM_HOME" in message
    # a target with its features is one --offload-arch entry
    featured = _matrix(tmp_path, {**ROCM, "arch_list": "gfx90a:xnack+;gfx942"})
    assert featured.variant("rocm64").option("arch_list") == "gfx90a:xnack+;gfx942"
    # CUDA's arch list is not ROCm's, nor the reverse
    assert "is not an --offload-arch target" in \
        _refused(tmp_path, {**ROCM, "arch_list": "8.0;gfx942"})


def test_xpu_variant_is_validated_by_its_module(tmp_path):
    variant = _matrix(tmp_path, XPU).variant("xpu")
    assert variant.backends == ("cpu", "xpu")
    assert variant.platforms == ("linux-x86_64", "windows-x86_64")
    assert _matrix(tmp_path, XPU).torch_index(variant).endswith("/whl/xpu")
    assert "'6.4' is not a oneAPI compiler release like 2025.1" in \
        _refused(tmp_path, {**XPU, "toolkit": "6.4"})
    assert "'PVC' is not an XPU target like pvc, bmg or lnl-m" in \
        _refused(tmp_path, {**XPU, "arch_list": "PVC"})
    assert "XPU variant 'xpu' cannot target macos-arm64" in \
        _refused(tmp_path, {**XPU, "platforms": ["macos-arm64"]})
    # a backend's toolkit word is its own: CUDA keeps cuda:, and cpu has no toolkit
    assert "a cuda variant names its toolkit with cuda:" in _refused(
        tmp_path, {**XPU, "backend": "cuda", "cuda": "13.0"})
    assert "unknown backend 'tpu' (known: cpu, cuda, mps, rocm, xpu" in \
        _refused(tmp_path, {**XPU, "backend": "tpu"})
    assert "mps: true makes variant 'xpu' a MPS variant, but it says backend: xpu" in \
        _refused(tmp_path, {**XPU, "mps": True})


def test_rocm_build_gets_its_rocm_and_no_cuda(tmp_path):
    matrix = _matrix(tmp_path, ROCM)
    rocm = _fake_rocm(tmp_path / "rocm-6.4", "6.4")
    env = {"ROCM_HOME": str(rocm), "CUDA_HOME": "/usr/local/cuda-13.0", "PATH": os.defpath}
    plan = build.plan_build(matrix, "rocm64", work_dir=tmp_path / "w", host="linux-x86_64",
                            env=env)
    given = plan.build.env
    assert given["OPFORGE_BACKEND"] == "rocm" and given["OPFORGE_BUILD_TOOLCHAIN"] == "rocm"
    assert given["ROCM_HOME"] == given["ROCM_PATH"] == given["HIP_PATH"] == str(rocm)
    assert given["PYTORCH_ROCM_ARCH"] == "gfx90a;gfx942" and given["FORCE_CUDA"] == "1"
    assert "CUDA_HOME" in plan.build.unset and "CUDA_HOME" not in given
    assert plan.toolkit.bin == rocm / "bin"
    # hipcc first on PATH, no nvcc (a toolkit's bin elsewhere on PATH is left out)
    nvcc_bin = tmp_path / "cuda" / "bin"
    nvcc_bin.mkdir(parents=True)
    (nvcc_bin / "nvcc").write_text("")
    (tmp_path / "cuda" / "version.json").write_text("{}")
    path = toolchain.build_path(f"{nvcc_bin}{os.pathsep}/usr/bin", plan.toolkit,
                                tmp_path / "shadow")
    assert path.split(os.pathsep)[:2] == [str(rocm / "bin"), "/usr/bin"]
    described = plan.describe()
    assert "rocm64: CPU + ROCm 6.4 HIP kernels for gfx90a;gfx942" in described
    assert f"PATH: {rocm / 'bin'} (hipcc) first, no nvcc" in described
    # torch's ROCm runtime stays torch's
    assert "libamdhip64.so*" in plan.repair.argv and "libtorch*.so*" in plan.repair.argv
    build.check_host(matrix, matrix.variant("rocm64"), host="linux-x86_64", env=env)


def test_a_rocm_job_says_its_backend_in_the_github_row_and_the_table(tmp_path):
    from rich.console import Console

    from opforge.cli.matrix import print_table

    matrix = _matrix(tmp_path, ROCM)
    row = next(job.as_dict() for job in matrix.jobs() if job.variant.name == "rocm64")
    assert (row["backend"], row["toolkit"], row["arch_list"], row["cuda"]) == \
        ("rocm", "6.4", "gfx90a;gfx942", "")
    console = Console(width=100_000, record=True)
    print_table(matrix, [j for j in matrix.jobs() if j.variant.name == "rocm64"], console)
    assert "rocm 6.4 / gfx90a;gfx942" in console.export_text()


def test_rocm_host_check_names_the_rocm_it_found(tmp_path):
    matrix = _matrix(tmp_path, ROCM)
    rocm = _fake_rocm(tmp_path / "rocm-6.2", "6.2")
    with pytest.raises(OpforgeError) as info:
        build.check_host(matrix, matrix.variant("rocm64"), host="linux-x86_64",
                         env={"ROCM_HOME": str(rocm)})
    message = str(info.value)
    assert f"build_rocm64 needs ROCm 6.4 (hipcc); {rocm} is ROCm 6.2 (ROCM_HOME)" in message
    assert "set ROCM_HOME to a ROCm 6.4 tree; it runs on the ubuntu-24.04 job" in message
    with pytest.raises(OpforgeError, match="builds for linux-x86_64; this host is macos-arm64"):
        build.check_host(matrix, matrix.variant("rocm64"), host="macos-arm64", env={})


def test_xpu_build_gets_its_oneapi_compiler(tmp_path):
    matrix = _matrix(tmp_path, XPU)
    oneapi = _fake_oneapi(tmp_path / "oneapi", "2025.1")
    env = {"ONEAPI_ROOT": str(oneapi), "PATH": os.defpath}
    plan = build.plan_build(matrix, "xpu", work_dir=tmp_path / "w", host="linux-x86_64", env=env)
    given = plan.build.env
    assert given["TORCH_XPU_ARCH_LIST"] == "pvc,bmg" and given["OPFORGE_BUILD_TOOLCHAIN"] == "xpu"
    assert given["CMPLR_ROOT"] == str(oneapi / "compiler" / "2025.1")
    assert given["ONEAPI_ROOT"] == str(oneapi) and given["CUDA_VISIBLE_DEVICES"] == ""
    assert {"CUDA_HOME", "FORCE_CUDA"} <= set(plan.build.unset)
    assert plan.toolkit.compiler == "icpx"
    assert "xpu: CPU + XPU (SYCL) kernels, oneAPI 2025.1, for pvc;bmg" in plan.describe()
    assert "libsycl.so*" in plan.repair.argv
    build.check_host(matrix, matrix.variant("xpu"), host="linux-x86_64", env=env)
    with pytest.raises(OpforgeError) as info:
        build.check_host(matrix, matrix.variant("xpu"), host="linux-x86_64",
                         env={"ONEAPI_ROOT": str(tmp_path / "none")})
    assert "build_xpu needs the oneAPI 2025.1 DPC++ compiler (icpx); no DPC++ compiler found" \
        in str(info.value)
    # a dry run on a host without it still shows the plan, and says what is missing
    bare = build.plan_build(matrix, "xpu", work_dir=tmp_path / "w2", host="linux-x86_64",
                            env={"ONEAPI_ROOT": str(tmp_path / "none")})
    assert "PATH: no oneAPI 2025.1 compiler found on this host" in bare.describe()


ASK_TORCH = textwrap.dedent("""
    import json, torch
    print(json.dumps({"cuda": torch.cuda.is_available(), "xpu": torch.xpu.is_available(),
                      "mps": torch.backends.mps.is_available()}))
""")


@pytest.mark.parametrize(("mode", "answers"), [
    ("rocm", {"cuda": True, "xpu": False, "mps": False}),
    ("xpu", {"cuda": False, "xpu": True, "mps": False}),
])
def test_torch_answers_what_a_rocm_or_xpu_build_asks(tmp_path, mode, answers):
    pytest.importorskip("torch", reason="the answers are torch's own functions, patched")
    site = tmp_path / "site"
    toolchain.write_site(site)
    env = {**os.environ, toolchain.MODE_VARIABLE: mode, "PYTHONPATH": str(site)}
    result = subprocess.run([sys.executable, "-c", ASK_TORCH], env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == answers


NPU_MODULE = '''\
"""A backend opforge does not ship: one module, registered when it is imported."""
from opforge.errors import OpforgeError
from opforge.platforms import register
from opforge.platforms.base import Backend, BuildEnv


class NpuBackend(Backend):
    name = "npu"
    device = "npu"
    device_code = "npu"
    oses = ("linux",)
    toolchain_mode = "cpu"
    variables = ("NPU_ARCH",)
    toolkit_variables = ("NPU_HOME",)
    needs_toolkit = True

    def describe(self, variant):
        return f"{variant.name}: CPU + NPU {variant.toolkit} kernels"

    def build_env(self, variant, env, site_dir):
        given = {"OPFORGE_BUILD_TOOLCHAIN": "cpu", "PYTHONPATH": str(site_dir),
                 "NPU_HOME": env.get("NPU_HOME", ""), "NPU_TOOLKIT": variant.toolkit}
        return BuildEnv(given, ("CUDA_HOME",), None, "the NPU compiler from NPU_HOME")

    def check_host(self, variant, host, env, where):
        if not env.get("NPU_HOME"):
            raise OpforgeError(f"{variant.build_session} needs an NPU toolkit (NPU_HOME); {where}")


BACKEND = register(NpuBackend())
'''
NPU = variant_entry("npu8", ("CPU", "PrivateUse1", "Meta"), backend="npu", toolkit="8.0")


@pytest.fixture
def npu_distribution(tmp_path, monkeypatch):
    """An installed distribution declaring the npu backend module as an entry point."""
    site = tmp_path / "site-packages"
    site.mkdir()
    (site / "opforge_npu.py").write_text(NPU_MODULE)
    info = site / "opforge_npu-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: opforge-npu\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[opforge.platforms]\nnpu = opforge_npu\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(platforms, "_plugins_loaded", False)
    yield
    platforms.unregister("npu")
    sys.modules.pop("opforge_npu", None)


def test_a_new_backend_is_one_module_and_matrix_entries(tmp_path, npu_distribution):
    project = tmp_path / "project"
    project.mkdir()
    matrix = _matrix(project, NPU)
    variant = matrix.variant("npu8")
    assert variant.backend == "npu" and variant.toolkit == "8.0"
    assert variant.backends == ("cpu", "npu")
    plan = build.plan_build(matrix, "npu8", work_dir=tmp_path / "w", host="linux-x86_64",
                            env={"NPU_HOME": "/opt/npu"})
    assert plan.build.env["NPU_TOOLKIT"] == "8.0" and plan.build.env["OPFORGE_BACKEND"] == "npu"
    assert "npu8: CPU + NPU 8.0 kernels" in plan.describe()
    assert "PATH: the NPU compiler from NPU_HOME" in plan.describe()
    with pytest.raises(OpforgeError, match="build_npu8 needs an NPU toolkit"):
        build.check_host(matrix, variant, host="linux-x86_64", env={})
    # its rules are the matrix's: platforms, toolkit, its own variables
    assert "NPU variant 'npu8' cannot target macos-arm64" in \
        _refused(project, {**NPU, "platforms": ["macos-arm64"]})
    assert "opforge sets NPU_HOME for a NPU variant" in \
        _refused(project, {**NPU, "build_env": {"NPU_HOME": "/x"}})
    with pytest.raises(Exception, match="--build-env NPU_ARCH: opforge sets NPU_ARCH"):
        build.plan_build(matrix, "npu8", work_dir=tmp_path / "w", host="linux-x86_64",
                         env={}, extra_env={"NPU_ARCH": "x"})


class _VpuBackend(Backend):
    """A backend whose matrix keys, settings and dispatch-key words are its own."""

    name = "vpu"
    device = "vpu"
    oses = ("linux",)
    needs_toolkit = True
    option_fields = ("vpu_cores",)
    dispatch_words = ("PrivateUse1",)

    def check_variant(self, fields):
        cores = fields.options.get("vpu_cores", "1")
        if not cores.isdigit():
            return [("vpu_cores", f"{cores!r} is not a number of cores")]
        return super().check_variant(fields)


VPU = variant_entry("vpu1", ("CPU", "PrivateUse1", "AutogradPrivateUse1"), backend="vpu",
                    toolkit="1.0", vpu_cores="8")


def test_a_new_backends_keys_settings_and_dispatch_words_live_in_its_module(tmp_path):
    platforms.register(_VpuBackend())
    try:
        variant = _matrix(tmp_path, VPU).variant("vpu1")
        assert (variant.toolkit, variant.option("vpu_cores")) == ("1.0", "8")
        assert variant.options == (("vpu_cores", "8"),)
        assert "variants[0].vpu_cores: 'many' is not a number of cores" in \
            _refused(tmp_path, {**VPU, "vpu_cores": "many"})
        # its device's keys belong to it: a cpu variant that expects one is refused
        assert "variant 'cpu' expects AutogradPrivateUse1 kernels but its backend is cpu, " \
               "not vpu" in _refused(tmp_path,
                                     variant_entry("cpu", ("CPU", "AutogradPrivateUse1")))
    finally:
        platforms.unregister("vpu")
    # without it, PrivateUse1 is any variant's to expect again
    assert _matrix(tmp_path, variant_entry("cpu", ("CPU", "PrivateUse1"))).variant("cpu")


def _raw_wheel(tmp_path: Path, library: bytes) -> Path:
    info = "tiny_ops-1.2.0.dist-info"
    path = tmp_path / "raw" / "tiny_ops-1.2.0-cp311-cp311-linux_x86_64.whl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("tiny_ops/__init__.py", b"")
        zf.writestr("tiny_ops/_C.cpython-311-x86_64-linux-gnu.so", library)
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\n"
                                     "Root-Is-Purelib: false\nTag: cp311-cp311-linux_x86_64\n")
        zf.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: tiny-ops\nVersion: 1.2.0\n")
        zf.writestr(f"{info}/RECORD", "")
    return path


def test_stamp_refuses_a_wheel_without_its_backends_device_code(tmp_path):
    facts = BuildFacts(variant="xpu", torch_version="2.13.0+xpu", python="3.11")
    xpu = platforms.get("xpu")
    with pytest.raises(OpforgeError) as info:
        stamp_wheel(_raw_wheel(tmp_path / "a", b"\x7fELF host code only"), tmp_path / "o1",
                    facts, backend=xpu, build_env={"TORCH_XPU_ARCH_LIST": "pvc"})
    message = str(info.value)
    assert "this XPU variant's build produced no xpu device code" in message
    assert "opforge passed TORCH_XPU_ARCH_LIST=pvc" in message
    # DPC++ registers the device images with the SYCL runtime: that call marks the library
    result = stamp_wheel(_raw_wheel(tmp_path / "b", b"\x7fELF __sycl_register_lib"),
                         tmp_path / "o2", facts, backend=xpu)
    assert result.record["backends"] == ["cpu", "xpu"]
    # a ROCm build's HIP fat binary is its device code
    rocm = stamp_wheel(_raw_wheel(tmp_path / "c", b"\x7fELF __hipRegisterFatBinary"),
                       tmp_path / "o3", facts, backend=platforms.get("rocm"))
    assert rocm.record["backends"] == ["cpu", "hip"]


def test_wheel_check_asks_the_variants_backend(tmp_path):
    import _ctypes  # a real shared library of this Python, to carry the marker bytes

    from opforge.wheel_checks import check_against_variant
    from opforge.wheels import inspect_wheel

    library = getattr(_ctypes, "__file__", None)
    elf = Path(library).read_bytes() if library else b""
    if not elf.startswith(b"\x7fELF"):
        pytest.skip("needs an ELF host (the wheel inspection reads ELF libraries)")
    variant = _matrix(tmp_path, ROCM).variant("rocm64")
    facts = BuildFacts(variant="rocm64", torch_version="2.13.0+rocm6.4", python="3.11")
    rocm = platforms.get("rocm")
    hip = stamp_wheel(_raw_wheel(tmp_path / "a", elf + b"__hipRegisterFatBinary"),
                      tmp_path / "o1", facts, backend=rocm).wheel
    problems = check_against_variant(inspect_wheel(hip), variant)
    assert not [p for p in problems if "device code" in p or "CUDA" in p]
    # the same wheel without HIP code
    cpu_only = stamp_wheel(_raw_wheel(tmp_path / "b", elf), tmp_path / "o2", facts).wheel
    problems = check_against_variant(inspect_wheel(cpu_only), variant)
    assert "no hip device code in any compiled library " \
           "(tiny_ops/_C.cpython-311-x86_64-linux-gnu.so)" in problems
