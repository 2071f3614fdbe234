"""`opforge inspect`'s floor: the glibc / libstdc++ / macOS versions a wheel's libraries need,
against its platform tag and the torch it requires."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
from publish_wheelkit import make_wheel

from opforge.cli import main
from opforge.floor import read_floor

needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("readelf") is None,
                               reason="compiling the test libraries needs gcc and binutils")

# pthread_create moved into libc in glibc 2.34: a library built here asks for GLIBC_2.34
NEW_C = "#include <pthread.h>\nstatic void *f(void *a) { return a; }\n" \
        "int go(void) { pthread_t t; return pthread_create(&t, 0, f, 0); }\n"
# strlen has been GLIBC_2.2.5 on x86_64 since the start: any system torch runs on has it
OLD_C = "#include <string.h>\nint go(const char *s) { return (int)strlen(s); }\n"


def _library(tmp: Path, source: str, name: str) -> Path:
    src = tmp / f"{name}.c"
    src.write_text(source)
    out = tmp / f"{name}.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", str(out), str(src)], check=True)
    return out


def _glibc_here() -> tuple[int, ...]:
    import platform

    return tuple(int(x) for x in platform.libc_ver()[1].split(".")[:2] if x.isdigit())


def _wheel(tmp: Path, lib: Path, tag: str, torch: str = "torch==2.13.0", name="floorext"):
    return make_wheel(tmp / tag, name, "1.0+cpu", tag=f"cp311-cp311-{tag}", requires=(torch,),
                      extra={f"{name}/_C.so": lib.read_bytes()})


@pytest.fixture(scope="module")
def libraries(tmp_path_factory):
    if shutil.which("gcc") is None:
        pytest.skip("compiling the test libraries needs gcc")
    if _glibc_here() < (2, 34):
        pytest.skip("a library needing GLIBC_2.34 can only be built on glibc >= 2.34")
    tmp = tmp_path_factory.mktemp("floorlibs")
    return {"new": _library(tmp, NEW_C, "new"), "old": _library(tmp, OLD_C, "old")}


@needs_gcc
def test_read_floor_names_the_versions_and_the_symbols_that_need_them(libraries):
    new, old = read_floor(libraries["new"]), read_floor(libraries["old"])
    assert new.kind == "elf" and new.arch in ("x86_64", "aarch64")
    assert "pthread_create" in new.versions["GLIBC_2.34"]
    assert new.glibc == "2.34" and new.manylinux == "manylinux_2_34"
    assert old.glibc is not None and tuple(map(int, old.glibc.split("."))) < (2, 17)
    assert old.manylinux in ("manylinux_2_5", "manylinux_2_17")


@needs_gcc
def test_a_wheel_needing_a_newer_glibc_than_its_torch_fails_naming_the_symbol(
        libraries, tmp_path, capsys):
    wheel = _wheel(tmp_path, libraries["new"], "manylinux_2_34_x86_64")
    assert main(["inspect", str(wheel), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["floor"]["needed"] == "manylinux_2_34"
    assert data["floor"]["torch"].startswith("manylinux_2_28")
    [problem] = data["problems"]
    assert "GLIBC_2.34: pthread_create" in problem and "manylinux_2_28" in problem
    assert "--allow-host-floor" in problem


@needs_gcc
def test_allow_host_floor_accepts_it_for_local_use_with_a_note(libraries, tmp_path, capsys):
    wheel = _wheel(tmp_path, libraries["new"], "manylinux_2_34_x86_64")
    assert main(["inspect", str(wheel), "--json", "--allow-host-floor"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["problems"] == []
    assert "accepted for local use" in data["floor"]["notes"][0]
    assert main(["inspect", str(wheel), "--allow-host-floor"]) == 0
    assert "accepted for local use" in " ".join(capsys.readouterr().out.split())


@needs_gcc
def test_a_wheel_within_torchs_floor_passes(libraries, tmp_path, capsys):
    wheel = _wheel(tmp_path, libraries["old"], "manylinux_2_17_x86_64.manylinux2014_x86_64")
    assert main(["inspect", str(wheel), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["problems"] == [] and data["floor"]["notes"] == []


@needs_gcc
def test_a_platform_tag_claiming_less_than_the_symbols_need_always_fails(
        libraries, tmp_path, capsys):
    wheel = _wheel(tmp_path, libraries["new"], "manylinux_2_28_x86_64")
    assert main(["inspect", str(wheel), "--json", "--allow-host-floor"]) == 1
    problems = json.loads(capsys.readouterr().out)["problems"]
    assert any("platform tag claims manylinux_2_28" in p and "pthread_create" in p
               for p in problems)


@needs_gcc
def test_torchs_floor_from_a_named_torch_wheel(libraries, tmp_path, capsys):
    wheel = _wheel(tmp_path, libraries["new"], "manylinux_2_34_x86_64")
    newer_torch = "torch-2.13.0-cp311-cp311-manylinux_2_34_x86_64.whl"
    assert main(["inspect", str(wheel), "--json", "--torch-wheel", newer_torch]) == 0
    assert "manylinux_2_34" in json.loads(capsys.readouterr().out)["floor"]["torch"]
    assert main(["inspect", str(wheel), "--torch-wheel", "not-a-wheel.zip"]) == 2


@needs_gcc
def test_an_older_torch_has_an_older_floor(libraries, tmp_path, capsys):
    """torch < 2.6 published manylinux_2_17 wheels (the documented table)."""
    wheel = _wheel(tmp_path, libraries["old"], "manylinux_2_17_x86_64", torch="torch==2.5.1")
    assert main(["inspect", str(wheel), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["floor"]["torch"].startswith("manylinux_2_17")


def _macho(minos: tuple[int, int]) -> bytes:
    """A minimal arm64 Mach-O dylib header with one LC_BUILD_VERSION command."""
    version = (minos[0] << 16) | (minos[1] << 8)
    header = struct.pack("<IiiIIIII", 0xFEEDFACF, 0x0100000C, 0, 6, 1, 24, 0, 0)
    return header + struct.pack("<IIIIII", 0x32, 24, 1, version, version, 0)


@pytest.mark.parametrize("minos, tag, target, ok", [
    ((11, 0), "macosx_11_0_arm64", None, True),
    ((14, 0), "macosx_14_0_arm64", None, False),          # above torch's macOS 11.0
    ((13, 0), "macosx_13_0_arm64", "13.0", True),         # the variant's declared target
    ((14, 0), "macosx_11_0_arm64", "14.0", False),        # the tag claims less than minos
])
def test_macos_minos_against_the_tag_and_torch(tmp_path, capsys, minos, tag, target, ok):
    record = {"variant": "mps", "macos_deployment_target": target} if target else None
    wheel = make_wheel(tmp_path, "floorext", "1.0+mps", tag=f"cp311-cp311-{tag}",
                       requires=("torch==2.13.0",), record=record,
                       extra={"floorext/_C.so": _macho(minos)})
    assert main(["inspect", str(wheel), "--json"]) == (0 if ok else 1)
    data = json.loads(capsys.readouterr().out)
    assert data["floor"]["needed"] == f"macOS {minos[0]}.{minos[1]}"
    if not ok:
        assert any("macOS" in p for p in data["problems"])
