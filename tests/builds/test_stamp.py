"""The wheel contract: opforge stamps any project's wheel (version, torch pin, build record)."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from opforge import platforms
from opforge.errors import OpforgeError
from opforge.stamp import BuildFacts, library_backends, stamp_wheel
from opforge.wheels import inspect_wheel

FATBIN = b"\x50\xed\x55\xba" + b"\0" * 64


def _wheel(tmp_path: Path, *, library: bytes | None = b"\x7fELF host code",
           requires=("torch>=2.0", "numpy")) -> Path:
    """A wheel as a project's own build makes it: no local version, a loose torch requirement."""
    info = "tiny_ops-1.2.0.dist-info"
    files = {"tiny_ops/__init__.py": b"", f"{info}/WHEEL":
             b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\n"
             b"Tag: cp311-cp311-linux_x86_64\n",
             f"{info}/METADATA": ("Metadata-Version: 2.1\nName: tiny-ops\nVersion: 1.2.0\n"
                                  + "".join(f"Requires-Dist: {r}\n" for r in requires)
                                  + "Requires-Dist: torch; extra == 'dev'\n"
                                  "\nA long description.\nVersion: not a header\n").encode(),
             "tiny_ops-1.2.0.data/scripts/tiny": b"#!python\n"}
    if library is not None:
        files["tiny_ops/_C.cpython-311-x86_64-linux-gnu.so"] = library
    path = tmp_path / "raw" / "tiny_ops-1.2.0-cp311-cp311-linux_x86_64.whl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        zf.writestr(f"{info}/RECORD", "stale\n")
    return path


FACTS = BuildFacts(variant="cu130", torch_version="2.14.1+cu130", torch_git_version="abc",
                   torch_cuda_version="13.0", python="3.11", cuda_version="13.0",
                   cuda_arch_list="9.0", source_commit="deadbeef")


def test_stamp_sets_version_pin_record_and_a_valid_record_file(tmp_path):
    raw = _wheel(tmp_path, library=b"\x7fELF" + FATBIN + b"__cudaRegisterFatBinary")
    result = stamp_wheel(raw, tmp_path / "out", FACTS, backend=platforms.get("cuda"))
    assert result.wheel.name == "tiny_ops-1.2.0+cu130-cp311-cp311-linux_x86_64.whl"
    with zipfile.ZipFile(result.wheel) as zf:
        names = zf.namelist()
        assert not any(n.startswith("tiny_ops-1.2.0.dist-info") for n in names)
        assert "tiny_ops-1.2.0+cu130.data/scripts/tiny" in names
        meta = zf.read("tiny_ops-1.2.0+cu130.dist-info/METADATA").decode()
        assert "Version: 1.2.0+cu130\n" in meta and "Requires-Dist: torch==2.14.1\n" in meta
        assert "torch>=2.0" not in meta and "Requires-Dist: numpy" in meta
        assert "Requires-Dist: torch; extra == 'dev'" in meta  # an extra's torch is left alone
        assert meta.endswith("A long description.\nVersion: not a header\n")  # body untouched
        record = json.loads(zf.read("tiny_ops-1.2.0+cu130.dist-info/opforge-build.json"))
        rows = list(csv.reader(io.StringIO(zf.read(
            "tiny_ops-1.2.0+cu130.dist-info/RECORD").decode())))
        for name, digest, size in rows:
            if name.endswith("/RECORD"):
                assert digest == size == ""
                continue
            data = zf.read(name)
            want = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert digest == f"sha256={want}" and int(size) == len(data)
        assert {r[0] for r in rows} == set(names)
    assert record["variant"] == "cu130" and record["version"] == "1.2.0+cu130"
    assert record["torch_version"] == "2.14.1+cu130" and record["cuda_arch_list"] == "9.0"
    assert record["backends"] == ["cpu", "cuda"]
    assert record["libraries"][0]["backends"] == ["cpu", "cuda"]
    report = inspect_wheel(result.wheel)
    assert report.local_version == "cu130" and report.torch_requirement == "torch==2.14.1"
    assert report.build_info["source_commit"] == "deadbeef"


def test_cuda_variant_without_device_code_is_refused_naming_what_to_read(tmp_path):
    raw = _wheel(tmp_path)
    with pytest.raises(OpforgeError) as info:
        stamp_wheel(raw, tmp_path / "out", FACTS, backend=platforms.get("cuda"),
                    build_env={"FORCE_CUDA": "1", "TORCH_CUDA_ARCH_LIST": "9.0"})
    message = str(info.value)
    assert "produced no device code" in message
    assert "FORCE_CUDA=1, TORCH_CUDA_ARCH_LIST=9.0" in message
    assert "torch.cuda.is_available()" in message
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_backends_come_from_the_code_not_the_file_names():
    assert library_backends(b"plain host code") == ["cpu"]
    assert library_backends(b"x" + FATBIN) == ["cpu", "cuda"]
    assert library_backends(b"__hipRegisterFatBinary") == ["cpu", "hip"]
    assert library_backends(b"/System/Library/Frameworks/Metal.framework/Metal") == ["cpu", "mps"]


def test_pure_python_wheel_is_stamped_and_pip_reads_the_record(tmp_path):
    raw = _wheel(tmp_path, library=None, requires=())
    facts = BuildFacts(variant="cpu", torch_version="2.13.0+cpu")
    wheel = stamp_wheel(raw, tmp_path / "out", facts).wheel
    env = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "virtualenv", "-q", str(env)], check=True)
    python = env / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", str(wheel)],
                   check=True)
    out = subprocess.run([str(python), "-c", "import importlib.metadata as m, json; "
                          "d = m.distribution('tiny-ops'); print(d.version); "
                          "print(json.loads(d.read_text('opforge-build.json'))['variant']); "
                          "print(d.requires)"], capture_output=True, text=True, check=True)
    version, variant, requires = out.stdout.splitlines()
    assert (version, variant) == ("1.2.0+cpu", "cpu")
    assert "torch==2.13.0" in requires
