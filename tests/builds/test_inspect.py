"""opforge inspect: reading wheels without installing them, and catching contradictions."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import struct
import zipfile
from pathlib import Path

import pytest

from opforge.cli import main
from opforge.matrix import load_matrix
from opforge.wheel_checks import check_against_variant
from opforge.wheels import fatbin_archs, inspect_wheel

ROOT = Path(__file__).resolve().parents[2]
MATRIX = load_matrix(ROOT / "matrix.yaml")


def fatbin(entries: list[tuple[int, int]]) -> bytes:
    """A fat binary container: (kind, sm) entries, kind 1 = PTX, 2 = ELF."""
    body = b""
    for kind, arch in entries:
        payload = b"\0" * 24
        header = struct.pack("<HHIQII HH I", kind, 0x0101, 64, len(payload), len(payload), 0,
                             0, 0, arch).ljust(64, b"\0")
        body += header + payload
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def make_wheel(tmp_path: Path, *, local="cpu", tag="manylinux_2_28_x86_64", pin="torch==2.13.0",
               info: dict | None = None, library: bytes | None = b"\x7fELF fake",
               extra: dict[str, bytes] | None = None) -> Path:
    version = f"0.1.0+{local}" if local else "0.1.0"
    name = f"opforge_ops-{version}-cp311-cp311-{tag}.whl"
    path = tmp_path / name
    base_info = {"schema": 1, "variant": local, "torch_version": "2.13.0+cpu",
                 "torch_git_version": "abc", "backends": ["cpu"], "cuda_version": None,
                 "cuda_arch_list": None, "mps": False, "omitted_kernels": []}
    members: dict[str, bytes | str] = {}
    meta = f"Metadata-Version: 2.1\nName: opforge-ops\nVersion: {version}\n"
    if pin:
        meta += f"Requires-Dist: {pin}\n"
    members[f"opforge_ops-{version}.dist-info/METADATA"] = meta
    members[f"opforge_ops-{version}.dist-info/WHEEL"] = f"Wheel-Version: 1.0\nTag: cp311-cp311-{tag}\n"
    members["opforge_ops/__init__.py"] = ""
    if info is not False:
        members[f"opforge_ops-{version}.dist-info/opforge-build.json"] = \
            json.dumps({**base_info, **(info or {})})
    if library is not None:  # the payload inside the headers a loader needs (inspect checks them)
        members["opforge_ops/_C.cpython-311-x86_64-linux-gnu.so"] = \
            loadable(library, macos=tag.startswith("macosx"))
    members.update(extra or {})
    with zipfile.ZipFile(path, "w") as zf:
        for member, data in members.items():
            zf.writestr(member, data)
        zf.writestr(f"opforge_ops-{version}.dist-info/RECORD", record(members, version))
    return path


def loadable(payload: bytes, *, macos: bool = False) -> bytes:
    """``payload`` behind a minimal well-formed header: ELF64 (one program header) or Mach-O."""
    body = payload[4:] if payload.startswith(b"\x7fELF") else payload
    if macos:
        return struct.pack("<IiiIIII", 0xfeedfacf, 0x100000c, 0, 6, 1, 8, 0) + b"\0" * 4 \
            + struct.pack("<II", 0, 8) + body
    header = (b"\x7fELF\x02\x01\x01" + b"\0" * 9
              + struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 64, 0, 0, 64, 56, 1, 64, 0, 0))
    return header + b"\0" * 56 + body


def record(members: dict[str, bytes | str], version: str) -> str:
    """A RECORD that agrees with ``members``, as a real build writes it."""
    lines = []
    for name, data in members.items():
        raw = data.encode() if isinstance(data, str) else data
        digest = base64.urlsafe_b64encode(hashlib.sha256(raw).digest()).rstrip(b"=").decode()
        lines.append(f"{name},sha256={digest},{len(raw)}")
    return "\n".join([*lines, f"opforge_ops-{version}.dist-info/RECORD,,"]) + "\n"


def test_fatbin_parser_reads_sass_and_ptx():
    data = b"junk" * 10 + fatbin([(2, 90), (2, 80), (1, 120)]) + b"tail" + fatbin([(2, 100)])
    assert fatbin_archs(data) == ["sm_80", "sm_90", "sm_100", "compute_120"]
    assert fatbin_archs(b"no fat binary here") == []


def test_consistent_cpu_wheel(tmp_path):
    report = inspect_wheel(make_wheel(tmp_path))
    assert report.torch_requirement == "torch==2.13.0"
    assert report.tags == ["cp311-cp311-manylinux_2_28_x86_64"]
    assert check_against_variant(report, MATRIX.variant("cpu")) == []


def test_cuda_wheel_with_exactly_the_requested_archs(tmp_path):
    variant = MATRIX.variant("cu130")
    blob = fatbin([(2, 75), (2, 80), (2, 86), (2, 90), (2, 100), (2, 120), (1, 120)])
    wheel = make_wheel(tmp_path, local="cu130", pin="torch==2.14.1", library=b"\x7fELF" + blob,
                       info={"torch_version": "2.14.1+cu130", "backends": ["cpu", "cuda"],
                             "cuda_version": "13.0", "cuda_arch_list": variant.option("arch_list")})
    report = inspect_wheel(wheel)
    assert report.cuda_archs == ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120",
                                 "compute_120"]
    assert check_against_variant(report, variant) == []


@pytest.mark.parametrize("kwargs,expected", [
    (dict(local="cu130"), "variant 'cu130'"),               # build info says cpu
    (dict(local=None), "local version is missing"),
    (dict(pin=None), "no exact torch pin"),
    (dict(pin="torch>=2.0"), "no exact torch pin"),
    (dict(pin="torch==2.14.1"), "differs from the torch it was built against"),
    (dict(info=False), "no readable build record (.dist-info/opforge-build.json)"),
    (dict(info={"version": "0.1.0+cu130"}), "build record says version 0.1.0+cu130"),
    (dict(tag="linux_x86_64"), "not repaired with auditwheel"),
    (dict(info={"omitted_kernels": ["roi_align:cpu"]}), "kernels left out"),
    (dict(info={"build_env": {"MY_EXT_SKIP": "roi_align"}}),
     "built with extra build environment (MY_EXT_SKIP=roi_align): not a release build"),
    (dict(library=b"\x7fELF" + fatbin([(2, 90)])), "is not CUDA but the wheel embeds sm_90"),
])
def test_contradictions_with_the_cpu_variant(tmp_path, kwargs, expected):
    report = inspect_wheel(make_wheel(tmp_path, **kwargs))
    problems = check_against_variant(report, MATRIX.variant("cpu"))
    assert any(expected in p for p in problems), problems


def test_cuda_wheel_missing_an_arch_and_kernels(tmp_path):
    variant = MATRIX.variant("cu130")
    wheel = make_wheel(tmp_path, local="cu130", pin="torch==2.14.1",
                       library=b"\x7fELF" + fatbin([(2, 90)]),
                       info={"variant": "cu130", "torch_version": "2.14.1", "backends": ["cpu"]})
    problems = check_against_variant(inspect_wheel(wheel), variant)
    assert any("CUDA architectures missing: sm_75, sm_80" in p for p in problems), problems
    (tmp_path / "nd").mkdir()
    no_device = make_wheel(tmp_path / "nd", local="cu130", pin="torch==2.14.1",
                           info={"variant": "cu130", "torch_version": "2.14.1"})
    problems = check_against_variant(inspect_wheel(no_device), variant)
    assert any("no cuda device code in any compiled library" in p for p in problems), problems


def test_mps_wheel_needs_metal_and_macos_tags(tmp_path):
    variant = MATRIX.variant("mps")
    good = make_wheel(tmp_path, local="mps", tag="macosx_12_0_arm64",
                      library=b"kernel void nms_mask(...)",
                      info={"variant": "mps", "backends": ["cpu", "mps"], "mps": True})
    assert check_against_variant(inspect_wheel(good), variant) == []
    (tmp_path / "bad").mkdir()
    bad = make_wheel(tmp_path / "bad", local="mps", tag="manylinux_2_28_x86_64",
                     info={"variant": "mps", "backends": ["cpu"]})
    problems = check_against_variant(inspect_wheel(bad), variant)
    assert any("no Metal shaders" in p for p in problems)
    assert any("expected macosx_*_arm64" in p for p in problems)
    assert any("no mps device code" in p for p in problems)


def test_pure_python_wheel_is_consistent_without_a_library(tmp_path):
    """torch.library.custom_op packages: no compiled code, no platform tag, still a variant."""
    wheel = make_wheel(tmp_path, tag="any", library=None)
    assert check_against_variant(inspect_wheel(wheel), MATRIX.variant("cpu")) == []


def test_cli_exit_codes_and_json(tmp_path, capsys):
    wheel = make_wheel(tmp_path)
    assert main(["inspect", str(wheel), "--expect-variant", "cpu",
                 "--file", str(ROOT / "matrix.yaml")]) == 0
    capsys.readouterr()
    assert main(["inspect", str(wheel), "--expect-variant", "cu130", "--json",
                 "--file", str(ROOT / "matrix.yaml")]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["expect_variant"] == "cu130" and data["problems"]
    assert main(["inspect", str(tmp_path / "missing.whl")]) == 2
    (tmp_path / "broken-1.0-py3-none-any.whl").write_bytes(b"not a zip")
    assert main(["inspect", str(tmp_path / "broken-1.0-py3-none-any.whl")]) == 2
    assert "bad zip" in capsys.readouterr().err


@pytest.mark.skipif(not os.environ.get("OPFORGE_TEST_WHEEL"),
                    reason="needs the CPU wheel that `nox -s tests` builds (OPFORGE_TEST_WHEEL)")
def test_the_real_cpu_wheel_is_consistent():
    report = inspect_wheel(os.environ["OPFORGE_TEST_WHEEL"])
    assert check_against_variant(report, MATRIX.variant("cpu")) == []
    assert report.build_info["torch_version"].startswith("2.13.0")
    needed = {n for lib in report.libraries for n in lib.needed}
    assert any(n.startswith("libc10") for n in needed)
    # torch's libraries were excluded, not vendored
    assert not any("libtorch" in lib.path or "libc10" in lib.path for lib in report.libraries)
