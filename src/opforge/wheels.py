"""Read a built wheel without installing it: tags, torch pin, build record, libraries, CUDA archs.

``inspect_wheel`` returns a typed report (the member rules it applies: ``wheel_safety``);
``wheel_checks.check_against_variant`` lists the ways a wheel contradicts its matrix entry.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import lzma
import mmap
import re
import shutil
import struct
import subprocess
import tempfile
import time
import zipfile
import zlib
from dataclasses import asdict, dataclass, field
from email.parser import Parser
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import Version

from opforge import abi, floor
from opforge.errors import UsageError
from opforge.files import open_regular
from opforge.pins import floor_of
from opforge.platforms.cuda import arch_sort_key
from opforge.stamp import RECORD_NAME, library_backends
from opforge.variants import split_label
from opforge.wheel_safety import MAX_MEMBERS, binary_problem, member_problems, unsafe_member

_FATBIN_MAGIC = 0xBA55ED50
_LIB_SUFFIXES = (".so", ".dylib", ".pyd")
MAX_LIBRARY_BYTES = 4 << 30   # bigger than any extension library; larger ones are not read
MAX_SMALL_MEMBER = 16 << 20   # METADATA, the build record
MAX_RATIO = 200               # real libraries compress 3-10x; far more is a zip bomb
MAX_LIBRARIES = 128           # libraries audited in full (readelf, symbols, floor) per wheel
AUDIT_SECONDS = 120.0         # the library audit's budget per wheel; the rest are listed
# what reading a broken member raises: corrupt data, bad CRC, encryption, unknown method
_ZIP_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, RuntimeError,
               EOFError, zlib.error, lzma.LZMAError, OSError, struct.error)


@dataclass
class Library:
    path: str
    size: int
    needed: list[str] = field(default_factory=list)
    cuda_archs: list[str] = field(default_factory=list)   # "sm_90", "compute_120" (PTX)
    embedded_metal: bool = False   # Metal shader source compiled into the binary as a string
    backends: list[str] = field(default_factory=list)   # found in the code: cpu, cuda, hip, mps
    note: str = ""                 # why it was not inspected (too large), else empty
    problem: str = ""              # not a loadable library (not ELF / Mach-O / PE, truncated)
    abi: abi.Audit | None = None   # its undefined symbols by kind, its minimum torch
    floor: floor.LibraryFloor | None = None  # the glibc / libstdc++ / macOS versions it needs


@dataclass
class WheelReport:
    wheel: str
    name: str
    version: str
    local_version: str | None
    tags: list[str]
    torch_requirement: str | None
    build_info: dict | None
    libraries: list[Library]
    metal_sources: list[str]
    metallibs: list[str]
    # what makes the archive itself untrustworthy: a member outside the wheel, a symbolic
    # link, a library that is not one, a RECORD that does not match; each a failure
    integrity: list[str] = field(default_factory=list)

    @property
    def pypi_clean(self) -> bool:
        """No local version label: a wheel PyPI accepts (the PyPI variant's)."""
        return self.local_version is None

    @property
    def abi3(self) -> bool:
        return any(t.split("-")[1] == "abi3" for t in self.tags)

    @property
    def declared_floor(self) -> Version | None:
        """The torch floor the wheel's own metadata declares (``torch>=X``), if any."""
        return floor_of(self.torch_requirement)

    def abi_problems(self, stable: bool | None = None, torch_floor: str | None = None,
                     cuda_major: str | None = None) -> list[str]:
        """The ABI audit's contradictions with what the wheel declares (its abi3 tag, its
        torch>=floor, its build record's CUDA), or with a variant's values when given."""
        floor = torch_floor or (str(self.declared_floor) if self.declared_floor else None)
        if stable is None:
            stable = self.abi3 and floor is not None
        info = self.build_info if self.build_info and "error" not in self.build_info else {}
        if cuda_major is None and info:
            cuda_major = str(info.get("cuda_version") or "").split(".")[0]
        out = list(self.integrity)
        for lib in self.libraries:
            if lib.abi is not None:
                out += abi.problems(lib.path, lib.abi, stable=stable, abi3=self.abi3,
                                    torch_floor=floor if stable else None,
                                    cuda_major=cuda_major)
        return out

    @property
    def min_torch(self) -> str | None:
        """The newest minimum torch among the libraries' shim functions."""
        found = [Version(lib.abi.min_torch) for lib in self.libraries
                 if lib.abi is not None and lib.abi.min_torch]
        return str(max(found)) if found else None

    @property
    def cuda_archs(self) -> list[str]:
        return sorted({a for lib in self.libraries for a in lib.cuda_archs},
                      key=arch_sort_key)

    def to_json(self) -> dict:
        data = asdict(self)
        data["cuda_archs"] = self.cuda_archs
        data["min_torch"] = self.min_torch
        data["pypi_clean"] = self.pypi_clean
        return data


def inspect_wheel(path: str | Path) -> WheelReport:
    """Read the wheel member by member: nothing is loaded whole, every member has a bound.

    A library larger than MAX_LIBRARY_BYTES (or expanding suspiciously) is listed with a
    note instead of being read; a corrupt, encrypted or unreadable member is a UsageError.
    """
    path = Path(path)
    try:
        # a variant wheel's name ends in its label (PEP 825 draft): the rest is a wheel name
        name, version, _build, tags = parse_wheel_filename(split_label(path.name)[0])
    except InvalidWheelFilename as exc:
        raise UsageError(f"{path.name}: not a wheel file name ({exc})") from None
    with open_regular(path) as fh:
        try:
            archive = zipfile.ZipFile(fh)
        except (*_ZIP_ERRORS, ValueError) as exc:
            raise UsageError(f"{path}: not a valid wheel (bad zip archive: {exc})") from None
        with archive, tempfile.TemporaryDirectory(prefix="opforge-inspect-") as tmp:
            members = _Members(archive, path.name)
            metadata = Parser().parsestr(members.small(_metadata_name(archive, path.name))
                                         .decode("utf-8", "replace"))
            torch_req = None
            for req_text in metadata.get_all("Requires-Dist") or []:
                try:
                    req = Requirement(req_text)
                except InvalidRequirement:
                    continue
                if req.name.lower() == "torch" and not req.marker:
                    torch_req = str(req)
            build_info = None
            info_names = [n for n in archive.namelist()
                          if re.match(r"[^/]+\.dist-info/" + re.escape(RECORD_NAME) + r"\Z", n)]
            if info_names:
                build_info = _build_record(members.small(info_names[0]), info_names[0])
            integrity = member_problems(archive.infolist())
            libraries = _audit_libraries(members, archive.infolist(), Path(tmp), integrity)
            integrity += record_problems(archive, members)
            names = archive.namelist()
            metal = [n for n in names if n.endswith(".metal")]
            metallibs = [n for n in names if n.endswith(".metallib")]
    return WheelReport(wheel=path.name, name=str(name), version=str(version),
                       local_version=version.local, tags=sorted(str(t) for t in tags),
                       torch_requirement=torch_req, build_info=build_info,
                       libraries=libraries, metal_sources=metal, metallibs=metallibs,
                       integrity=integrity)


def _is_library(info: zipfile.ZipInfo) -> bool:
    # not is_dir(): it raises IndexError on an empty member name
    return not info.filename.endswith("/") and (info.filename.endswith(_LIB_SUFFIXES)
                                                or ".so." in info.filename)


def _audit_libraries(members: _Members, infos: list[zipfile.ZipInfo], tmp: Path,
                     integrity: list[str]) -> list[Library]:
    """Every library member, audited in full up to MAX_LIBRARIES and AUDIT_SECONDS (the rest
    listed with a note saying which cap was hit); a symlink member or a name outside the
    wheel is never extracted, a member that is not a loadable library is a problem."""
    if len(infos) > MAX_MEMBERS:
        integrity.append(f"{len(infos)} members, more than the {MAX_MEMBERS}-member limit: "
                         "its libraries were not audited")
        return []
    unsafe = {info.filename for info in infos if unsafe_member(info)}
    deadline = time.monotonic() + AUDIT_SECONDS
    out = []
    for i, info in enumerate(info for info in infos if _is_library(info)):
        if info.filename in unsafe:
            out.append(Library(path=info.filename, size=info.file_size,
                               note="not inspected: an unsafe member (see the problems)"))
            continue
        if i >= MAX_LIBRARIES or time.monotonic() > deadline:
            cap = (f"more than {MAX_LIBRARIES} libraries in the wheel" if i >= MAX_LIBRARIES
                   else f"the {AUDIT_SECONDS:g} s audit budget ran out")
            out.append(Library(path=info.filename, size=info.file_size,
                               note=f"not inspected: {cap}"))
            continue
        lib = members.library(info, tmp / f"lib{i}")
        if lib.problem:
            integrity.append(f"{lib.path}: {lib.problem}")
        out.append(lib)
    skipped = [lib for lib in out if lib.note.startswith("not inspected: more than")
               or lib.note.startswith("not inspected: the ")]
    if skipped:
        integrity.append(f"{len(skipped)} of {len(out)} libraries not audited "
                         f"({skipped[0].note[len('not inspected: '):]}): "
                         "audit them with a higher limit, or split the wheel")
    return out


def record_problems(archive: zipfile.ZipFile, members: _Members) -> list[str]:
    """Where the wheel's RECORD and its members disagree: a member it does not list, a listed
    file that is missing, a hash or a size that does not match (each member hashed, streamed)."""
    names = [n for n in archive.namelist() if re.fullmatch(r"[^/]+\.dist-info/RECORD", n)]
    if not names:
        return ["no .dist-info/RECORD: pip cannot verify or uninstall the wheel"]
    record_name = names[0]
    try:
        rows = list(csv.reader(io.StringIO(members.small(record_name).decode("utf-8"))))
    except (UnicodeDecodeError, csv.Error) as exc:
        return [f"{record_name}: not a readable RECORD ({exc})"]
    listed: dict[str, tuple[str, str]] = {}
    for row in rows:
        if not row:
            continue
        if len(row) != 3:
            return [f"{record_name}: a row with {len(row)} fields, not path,hash,size"]
        listed[row[0]] = (row[1], row[2])
    out = []
    infos = {i.filename: i for i in archive.infolist() if not i.filename.endswith("/")}
    unsigned = (record_name, record_name + ".jws", record_name + ".p7s")
    deadline = time.monotonic() + AUDIT_SECONDS
    for name, info in infos.items():
        if name in unsigned:
            continue
        if name not in listed:
            out.append(f"{record_name}: does not list {name}")
            continue
        digest, size = listed[name]
        if size and size != str(info.file_size):
            out.append(f"{record_name}: {name} is {info.file_size} bytes, RECORD says {size}")
            continue
        algorithm, _, expected = digest.partition("=")
        if algorithm not in ("sha256", "sha384", "sha512"):
            out.append(f"{record_name}: {name}: hash {digest[:30]!r} is not sha256 / sha384 / "
                       "sha512")
            continue
        if _too_big(info) or time.monotonic() > deadline:
            continue  # not read (a bomb, or out of time): listed by the library audit
        hasher = hashlib.new(algorithm)
        for chunk in members._chunks(info, info.file_size):
            hasher.update(chunk)
        actual = base64.urlsafe_b64encode(hasher.digest()).rstrip(b"=").decode()
        if actual != expected.rstrip("="):
            out.append(f"{record_name}: {name} does not match its {algorithm} hash")
    out += [f"{record_name}: lists {name}, which the wheel does not hold"
            for name in listed if name not in infos and name not in unsigned]
    return out[:50] + ([f"... and {len(out) - 50} more RECORD problems"] if len(out) > 50 else [])


class _Members:
    """Bounded, streaming reads of one archive's members; corrupt ones are UsageErrors."""

    def __init__(self, archive: zipfile.ZipFile, wheel: str):
        self.archive = archive
        self.wheel = wheel

    def _chunks(self, info: zipfile.ZipInfo, limit: int):
        total = 0
        try:
            with self.archive.open(info) as src:
                while True:
                    chunk = src.read(1 << 20)
                    if not chunk:
                        return
                    total += len(chunk)
                    if total > limit:
                        raise UsageError(f"{self.wheel}: {info.filename}: expands past its "
                                         f"declared size or the {limit}-byte limit")
                    yield chunk
        except UsageError:
            raise
        except _ZIP_ERRORS as exc:
            raise UsageError(f"{self.wheel}: {info.filename}: cannot be read "
                             f"({type(exc).__name__}: {exc})") from None

    def small(self, name: str) -> bytes:
        info = self.archive.getinfo(name)
        if info.file_size > MAX_SMALL_MEMBER:
            raise UsageError(f"{self.wheel}: {name}: {info.file_size} bytes, more than the "
                             f"{MAX_SMALL_MEMBER}-byte limit")
        return b"".join(self._chunks(info, MAX_SMALL_MEMBER))

    def library(self, info: zipfile.ZipInfo, scratch: Path) -> Library:
        """Stream the library to disk, scan it through mmap (paged, never resident whole)."""
        problem = _too_big(info)
        if problem:
            return Library(path=info.filename, size=info.file_size,
                           note=f"not inspected: {problem}")
        with open(scratch, "wb") as out:
            for chunk in self._chunks(info, info.file_size):
                out.write(chunk)
            size = out.tell()
        with open(scratch, "rb") as f:
            broken = binary_problem(f.read(64), size)
        if broken:
            scratch.unlink()
            return Library(path=info.filename, size=size, note=f"not inspected: {broken}",
                           problem=broken)
        with open(scratch, "rb") as f:
            view = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
            try:
                archs, metal = fatbin_archs(view), view.find(b"kernel void") != -1
                backends = library_backends(_Searchable(view))
            finally:
                if size:
                    view.close()
        needed = _needed(scratch)
        audit = abi.audit_library(scratch, needed)
        system_floor = floor.read_floor(scratch)
        scratch.unlink()
        return Library(path=info.filename, size=size, needed=needed, cuda_archs=archs,
                       embedded_metal=metal, backends=backends, abi=audit, floor=system_floor)


class _Searchable:
    """``marker in view`` as a substring search (an mmap's ``in`` tests single bytes)."""

    def __init__(self, view):
        self.view = view

    def __contains__(self, marker: bytes) -> bool:
        return self.view.find(marker) != -1


def _too_big(info: zipfile.ZipInfo) -> str | None:
    if info.file_size > MAX_LIBRARY_BYTES:
        return f"{info.file_size} bytes, more than the {MAX_LIBRARY_BYTES}-byte limit"
    if info.file_size > MAX_SMALL_MEMBER and \
            info.file_size > MAX_RATIO * max(info.compress_size, 1):
        return (f"{info.file_size} bytes from {info.compress_size} compressed: more than "
                f"{MAX_RATIO}x expansion (a zip bomb?)")
    return None


def _metadata_name(archive: zipfile.ZipFile, wheel: str) -> str:
    meta_names = [n for n in archive.namelist() if re.match(r"[^/]+\.dist-info/METADATA\Z", n)]
    if not meta_names:
        raise UsageError(f"{wheel}: no .dist-info/METADATA: not a valid wheel")
    return meta_names[0]


# what a build record may hold, by type; anything else makes it unreadable, not a crash
_OPT_STR = (str, type(None))
_RECORD_TYPES = {"version": _OPT_STR, "variant": _OPT_STR, "torch_version": _OPT_STR,
                 "torch_git_version": _OPT_STR, "backends": (list,), "cuda_version": _OPT_STR,
                 "cuda_arch_list": _OPT_STR, "omitted_kernels": (list, str, type(None)),
                 "build_env": (dict, type(None))}


def _build_record(data: bytes, name: str) -> dict:
    try:
        record = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError):
        return {"error": f"{name} is not valid JSON"}
    if not isinstance(record, dict):
        return {"error": f"{name} is not a JSON object"}
    for key, types in _RECORD_TYPES.items():
        if key in record and not isinstance(record[key], types):
            return {"error": f"{name}: {key} is {type(record[key]).__name__}"}
    if not all(isinstance(b, str) for b in record.get("backends") or []):
        return {"error": f"{name}: backends must be a list of strings"}
    return record


def _needed(lib: Path) -> list[str]:
    """Shared libraries a binary links (DT_NEEDED / LC_LOAD_DYLIB), when a tool can tell."""
    for tool, args in (("readelf", ["-d"]), ("otool", ["-L"])):
        if shutil.which(tool):
            try:
                out = subprocess.run([tool, *args, str(lib)], capture_output=True, text=True,
                                     errors="replace", timeout=120).stdout
            except (OSError, subprocess.TimeoutExpired):
                return []
            if tool == "readelf":
                return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)
            return [line.split()[0] for line in out.splitlines()[1:] if line.strip()]
    return []


def fatbin_archs(data: bytes) -> list[str]:
    """CUDA architectures in every fat binary embedded in ``data`` (no cuobjdump needed).

    A fatbin container is a 16-byte header (magic, version 1, header size 16, payload
    size) followed by entries, each with its kind (1 = PTX, 2 = ELF cubin) and SM number.
    """
    archs: set[str] = set()
    magic = struct.pack("<I", _FATBIN_MAGIC)
    start = data.find(magic)
    while start != -1:
        if start + 16 <= len(data):
            _, version, header_size, fat_size = struct.unpack_from("<IHHQ", data, start)
            if version == 1 and header_size == 16 and start + 16 + fat_size <= len(data):
                pos, end = start + 16, start + 16 + fat_size
                while pos + 32 <= end:
                    kind, _unk, entry_header, payload = struct.unpack_from("<HHIQ", data, pos)
                    arch = struct.unpack_from("<I", data, pos + 28)[0]
                    if entry_header < 32 or kind not in (1, 2, 16):
                        break
                    if kind == 2:
                        archs.add(f"sm_{arch}")
                    elif kind == 1:
                        archs.add(f"compute_{arch}")
                    pos += entry_header + payload
        start = data.find(magic, start + 4)
    return sorted(archs, key=arch_sort_key)
