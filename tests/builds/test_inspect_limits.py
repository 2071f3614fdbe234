"""opforge inspect on hostile wheels: bounded memory, broken members are one line and exit 2."""

from __future__ import annotations

import json
import tracemalloc
import zipfile
from pathlib import Path

import pytest
from test_inspect import loadable, make_wheel, record

from opforge import wheels
from opforge.cli import main

ROOT = Path(__file__).resolve().parents[2]
LIB = "opforge_ops/_C.cpython-311-x86_64-linux-gnu.so"


def _bomb(tmp_path: Path, size: int) -> Path:
    path = make_wheel(tmp_path, library=None)
    info = zipfile.ZipInfo(LIB)
    info.compress_type = zipfile.ZIP_DEFLATED
    with zipfile.ZipFile(path, "a") as zf:
        with zf.open(info, "w", force_zip64=True) as out:
            block = b"\0" * (1 << 20)
            head = loadable(b"")  # a well-formed ELF header, then zeros
            out.write(head + block[len(head):])
            for _ in range((size >> 20) - 1):
                out.write(block)
    return path


def test_a_library_that_expands_like_a_bomb_is_reported_not_read(tmp_path, capsys):
    wheel = _bomb(tmp_path, 64 << 20)
    assert wheel.stat().st_size < 1 << 20
    assert main(["inspect", str(wheel), "--json"]) == 1  # added after its RECORD was written
    doc = json.loads(capsys.readouterr().out)
    lib = doc["libraries"][0]
    assert lib["size"] == 64 << 20 and "zip bomb" in lib["note"]
    assert any(f"does not list {LIB}" in p for p in doc["problems"])
    assert main(["inspect", str(wheel), "--expect-variant", "cpu", "--file",
                 str(ROOT / "matrix.yaml")]) == 1
    assert "not inspected" in capsys.readouterr().out


def test_a_large_library_is_streamed_never_held_in_memory(tmp_path, monkeypatch):
    wheel = _bomb(tmp_path, 128 << 20)
    monkeypatch.setattr(wheels, "MAX_RATIO", 1 << 40)  # let it through: it is read, by chunks
    # the modules inspect imports on first use are loaded before measuring (alone in a process,
    # as under pytest-xdist, their code objects would count): only the library's reading counts
    (tmp_path / "warm").mkdir()
    wheels.inspect_wheel(_bomb(tmp_path / "warm", 1 << 20))
    tracemalloc.start()
    try:
        report = wheels.inspect_wheel(wheel)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert report.libraries[0].size == 128 << 20 and not report.libraries[0].note
    assert peak < 16 << 20, f"peak Python allocation {peak / 1e6:.0f} MB"


def _patched(path: Path, member: str, edit) -> Path:
    """Rewrite both headers of ``member`` (local and central) with ``edit(bytearray, offset)``."""
    data = bytearray(path.read_bytes())
    name = member.encode()
    for signature, name_at in ((b"PK\x03\x04", 30), (b"PK\x01\x02", 46)):
        start = 0
        while (start := data.find(signature, start)) != -1:
            if data[start + name_at:start + name_at + len(name)] == name:
                edit(data, start, signature)
            start += 4
    path.write_bytes(bytes(data))
    return path


def _flag_encrypted(data, at, signature):
    flags_at = at + (6 if signature == b"PK\x03\x04" else 8)
    data[flags_at] |= 1


def _method_99(data, at, signature):
    method_at = at + (8 if signature == b"PK\x03\x04" else 10)
    data[method_at:method_at + 2] = (99).to_bytes(2, "little")


def _corrupt_data(data, at, signature):
    if signature == b"PK\x03\x04":
        name_len = int.from_bytes(data[at + 26:at + 28], "little")
        extra_len = int.from_bytes(data[at + 28:at + 30], "little")
        body = at + 30 + name_len + extra_len
        data[body:body + 8] = b"\xff" * 8


@pytest.mark.parametrize("edit, words", [(_flag_encrypted, "encrypted"),
                                          (_method_99, "compression"),
                                          (_corrupt_data, "cannot be read")])
@pytest.mark.parametrize("member", ["opforge_ops-0.1.0+cpu.dist-info/opforge-build.json", LIB,
                                    "opforge_ops-0.1.0+cpu.dist-info/METADATA"])
def test_a_broken_member_is_one_line_and_exit_2(tmp_path, capsys, edit, words, member):
    wheel = make_wheel(tmp_path, library=b"\x7fELF" + bytes(range(256)) * 64)
    # deflate the members so corrupt data is caught by zlib or the CRC check
    rebuilt = tmp_path / "x" / wheel.name
    rebuilt.parent.mkdir()
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(rebuilt, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info))
    _patched(rebuilt, member, edit)
    assert main(["inspect", str(rebuilt)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("opforge inspect: error: "), err
    assert words in err[0] or "cannot be read" in err[0], err


@pytest.mark.parametrize("info", [[1, 2], {"backends": "cpu"}, {"backends": [1]},
                                  {"torch_version": "not a version"}, {"variant": 3}])
def test_a_build_record_of_the_wrong_shape_is_reported_not_a_crash(tmp_path, capsys, info):
    wheel = make_wheel(tmp_path, info=None)
    rebuilt = tmp_path / "x" / wheel.name
    rebuilt.parent.mkdir()
    members = {}
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(rebuilt, "w") as dst:
        for item in src.infolist():
            data = src.read(item)
            if item.filename.endswith("opforge-build.json"):
                data = json.dumps(info if isinstance(info, list) else
                                  {**json.loads(data), **info}).encode()
            if not item.filename.endswith("/RECORD"):
                members[item.filename] = data
                dst.writestr(item.filename, data)
        dst.writestr("opforge_ops-0.1.0+cpu.dist-info/RECORD", record(members, "0.1.0+cpu"))
    assert main(["inspect", str(rebuilt)]) == 0
    assert main(["inspect", str(rebuilt), "--expect-variant", "cpu",
                 "--file", str(ROOT / "matrix.yaml")]) == 1
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("pin", ["torch==2.*", "torch>=2.13", "torch===banana", "torch"])
def test_a_pin_that_is_not_exact_is_a_problem_not_a_crash(tmp_path, capsys, pin):
    wheel = make_wheel(tmp_path, pin=pin)
    assert main(["inspect", str(wheel), "--expect-variant", "cpu",
                 "--file", str(ROOT / "matrix.yaml")]) == 1
    assert "no exact torch pin" in capsys.readouterr().out
