"""The loader fails loudly, and build_info() tells the truth about this build."""

import ctypes
import importlib.machinery
import importlib.metadata
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import opforge_ops
from opforge_ops import _loader

PACKAGE = Path(opforge_ops.__file__).resolve().parent


def test_build_info_describes_this_build():
    info = opforge_ops.build_info()
    if info["variant"] == "in-place":
        pytest.skip("in-place build: the build record comes with the wheel `opforge build` makes")
    assert info["schema"] == 1 and info["distribution"] == "opforge-ops"
    assert info["version"] == importlib.metadata.version("opforge-ops")
    # the local version is the variant's name, normalized as PEP 440 does (cpu_stable: +cpu.stable)
    assert info["version"].endswith("+" + info["variant"].replace("_", "."))
    if info.get("abi", "legacy") == "legacy":  # built for exactly this torch and Python
        assert info["torch_version"] == torch.__version__
        assert info["torch_git_version"] == torch.version.git_version
        assert info["python"] == f"{sys.version_info.major}.{sys.version_info.minor}"
    else:  # one abi3 wheel for every torch from its floor up
        floor = tuple(int(part) for part in info["torch_floor"].split(".")[:2])
        assert tuple(int(part) for part in torch.__version__.split(".")[:2]) >= floor
    library = _loader.library_path()
    assert library is not None and library.parent == PACKAGE
    assert any(entry["path"].endswith(library.name) for entry in info["libraries"])
    assert library in {Path(p).resolve() for p in torch.ops.loaded_libraries}
    assert "cpu" in info["backends"]
    assert ("cuda" in info["backends"]) == torch._C._dispatch_has_kernel_for_dispatch_key(
        "opforge::nms", "CUDA"
    )
    assert ("cuda" in info["backends"]) == (info["cuda_version"] is not None)
    assert ("mps" in info["backends"]) == info["mps"]


def test_build_info_lists_exactly_the_kernels_left_out():
    info = opforge_ops.build_info()
    omitted = set(info["omitted_kernels"])
    for op in ("nms", "roi_align", "roi_pool"):
        assert (f"{op}:cpu" in omitted) != torch._C._dispatch_has_kernel_for_dispatch_key(
            f"opforge::{op}", "CPU"
        )


def test_build_info_is_a_copy():
    opforge_ops.build_info()["backends"].append("tpu")
    assert "tpu" not in opforge_ops.build_info()["backends"]


def _copy_package(tmp_path):
    """The package and its .dist-info (where the build record is), side by side in tmp_path."""
    target = tmp_path / "opforge_ops"
    shutil.copytree(PACKAGE, target, ignore=shutil.ignore_patterns("__pycache__"))
    dist = importlib.metadata.distribution("opforge-ops")
    info_dir = Path(dist.locate_file(f"opforge_ops-{dist.version}.dist-info"))
    shutil.copytree(info_dir, tmp_path / info_dir.name)
    library = next(target.glob("_C*"))
    return target, library


def _record_path(package):
    return next(package.parent.glob("*.dist-info")) / _loader.BUILD_RECORD


def _import_in_subprocess(tmp_path):
    # A fresh interpreter, importing the copy only (cwd and path point at tmp_path).
    return subprocess.run(
        [sys.executable, "-c", "import opforge_ops"],
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )


def _dlopen_error(path):
    with pytest.raises(OSError) as caught:
        ctypes.CDLL(str(path))
    return str(caught.value)


def _assert_loud_import_error(result, dlopen_text, built_against):
    assert result.returncode != 0
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith("ImportError: opforge_ops: cannot load")
    assert dlopen_text in last_line
    assert f"built against torch {built_against}" in last_line
    assert f"running torch {torch.__version__}" in last_line
    assert "does not exist" not in result.stderr


def test_missing_dependency_is_reported_with_the_dlopen_text(tmp_path):
    package, library = _copy_package(tmp_path)
    data = library.read_bytes()
    needed = b"libc10.dylib\0" if sys.platform == "darwin" else b"libc10.so\0"
    assert needed in data
    # Same length, so the ELF/Mach-O layout is untouched: the library now needs libc1X, which nobody has.
    library.write_bytes(data.replace(needed, needed.replace(b"libc10", b"libc1X")))
    if sys.platform == "darwin":  # an edited Mach-O must be re-signed, or dlopen reports the signature
        subprocess.run(["codesign", "--force", "--sign", "-", str(library)], check=True)
    result = _import_in_subprocess(tmp_path)
    dlopen_text = _dlopen_error(library)
    assert "libc1X" in dlopen_text
    _assert_loud_import_error(result, dlopen_text, opforge_ops.build_info()["torch_version"])


def test_corrupt_library_names_both_torch_versions(tmp_path):
    package, library = _copy_package(tmp_path)
    library.write_bytes(b"this is not a shared library")
    info = json.loads(_record_path(package).read_text())
    info["torch_version"] = "0.0.1+elsewhere"
    _record_path(package).write_text(json.dumps(info))
    result = _import_in_subprocess(tmp_path)
    _assert_loud_import_error(result, _dlopen_error(library), "0.0.1+elsewhere")


def test_missing_library_says_how_to_build(tmp_path):
    package, library = _copy_package(tmp_path)
    library.unlink()
    result = _import_in_subprocess(tmp_path)
    assert result.returncode != 0
    assert "ImportError: opforge_ops: the compiled library _C*.so is missing" in result.stderr
    assert "does not exist" not in result.stderr


def test_library_name_uses_an_extension_suffix():
    library = _loader.library_path()
    assert any(library.name == f"_C{suffix}" for suffix in importlib.machinery.EXTENSION_SUFFIXES)
