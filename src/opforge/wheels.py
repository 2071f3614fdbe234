"""Read a built wheel without installing it: tags, torch pin, build record, libraries, CUDA archs.

``inspect_wheel`` returns a typed report; ``check_against_variant`` lists the ways a wheel
contradicts its matrix entry (``opforge inspect --expect-variant cu130`` exits 1 on any).
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import tempfile
import zipfile
from dataclasses import asdict, dataclass, field
from email.parser import Parser
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import Version

from opforge.errors import OpforgeError, UsageError
from opforge.matrix import Variant
from opforge.stamp import RECORD_NAME, library_backends, read_record

_FATBIN_MAGIC = 0xBA55ED50
_LIB_SUFFIXES = (".so", ".dylib", ".pyd")


@dataclass
class Library:
    path: str
    size: int
    needed: list[str] = field(default_factory=list)
    cuda_archs: list[str] = field(default_factory=list)   # "sm_90", "compute_120" (PTX)
    embedded_metal: bool = False   # Metal shader source compiled into the binary as a string
    backends: list[str] = field(default_factory=list)   # found in the code: cpu, cuda, hip, mps


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

    @property
    def cuda_archs(self) -> list[str]:
        return sorted({a for lib in self.libraries for a in lib.cuda_archs},
                      key=_arch_sort_key)

    def to_json(self) -> dict:
        data = asdict(self)
        data["cuda_archs"] = self.cuda_archs
        return data


def _arch_sort_key(arch: str) -> tuple[int, int]:
    """sm_90 < sm_100 < compute_100 (numeric, SASS before PTX of the same arch)."""
    digits = re.sub(r"\D", "", arch)
    return (int(digits) if digits else 0, 0 if arch.startswith("sm_") else 1)


def inspect_wheel(path: str | Path) -> WheelReport:
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"{path}: no such wheel")
    try:
        name, version, _build, tags = parse_wheel_filename(path.name)
    except InvalidWheelFilename as exc:
        raise UsageError(f"{path.name}: not a wheel file name ({exc})") from None
    try:
        archive = zipfile.ZipFile(path)
    except zipfile.BadZipFile:
        raise OpforgeError(f"{path}: not a valid wheel (bad zip archive)") from None
    with archive, tempfile.TemporaryDirectory(prefix="opforge-inspect-") as tmp:
        names = archive.namelist()
        metadata = _read_metadata(archive, names)
        torch_req = None
        for req_text in metadata.get_all("Requires-Dist") or []:
            try:
                req = Requirement(req_text)
            except InvalidRequirement:
                continue
            if req.name.lower() == "torch" and not req.marker:
                torch_req = str(req)
        build_info = read_record(archive)
        libraries = []
        for member in names:
            if not member.endswith(_LIB_SUFFIXES) and ".so." not in member:
                continue
            data = archive.read(member)
            lib_path = Path(tmp) / Path(member).name
            lib_path.write_bytes(data)
            libraries.append(Library(path=member, size=len(data), needed=_needed(lib_path),
                                     cuda_archs=fatbin_archs(data),
                                     embedded_metal=b"kernel void" in data,
                                     backends=library_backends(data)))
        metal = [n for n in names if n.endswith(".metal")]
        metallibs = [n for n in names if n.endswith(".metallib")]
    return WheelReport(wheel=path.name, name=str(name), version=str(version),
                       local_version=version.local, tags=sorted(str(t) for t in tags),
                       torch_requirement=torch_req, build_info=build_info,
                       libraries=libraries, metal_sources=metal, metallibs=metallibs)


def _read_metadata(archive: zipfile.ZipFile, names: list[str]):
    meta_names = [n for n in names if re.match(r"[^/]+\.dist-info/METADATA\Z", n)]
    if not meta_names:
        raise OpforgeError(f"{archive.filename}: no .dist-info/METADATA: not a valid wheel")
    return Parser().parsestr(archive.read(meta_names[0]).decode("utf-8", "replace"))


def _needed(lib: Path) -> list[str]:
    """Shared libraries a binary links (DT_NEEDED / LC_LOAD_DYLIB), when a tool can tell."""
    if shutil.which("readelf"):
        out = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True).stdout
        return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)
    if shutil.which("otool"):
        out = subprocess.run(["otool", "-L", str(lib)], capture_output=True, text=True).stdout
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
    return sorted(archs, key=_arch_sort_key)


def _expected_archs(arch_list: str) -> tuple[set[str], set[str]]:
    sass, ptx = set(), set()
    for entry in re.split(r"[;\s]+", arch_list.strip()):
        if not entry:
            continue
        base = entry.replace("+PTX", "")
        number = base.replace(".", "")
        sass.add(f"sm_{number}")
        if entry.endswith("+PTX"):
            ptx.add(f"compute_{number}")
    return sass, ptx


def check_against_variant(report: WheelReport, variant: Variant) -> list[str]:
    """Every way the wheel contradicts its matrix entry (empty list: consistent)."""
    problems = []
    if report.local_version != variant.local_version:
        problems.append(f"local version is {report.local_version or 'missing'}, expected "
                        f"+{variant.local_version}")
    if report.torch_requirement is None or "==" not in report.torch_requirement:
        problems.append(f"no exact torch pin in Requires-Dist (found "
                        f"{report.torch_requirement or 'none'})")
    info = report.build_info
    if not info or "error" in info:
        problems.append(f"no readable build record (.dist-info/{RECORD_NAME}): the wheel was "
                        "not stamped by opforge build")
        info = {}
    else:
        if info.get("variant") != variant.name:
            problems.append(f"build info says variant {info.get('variant')!r}, expected "
                            f"{variant.name!r}")
        built = info.get("torch_version")
        if built and report.torch_requirement and "==" in report.torch_requirement:
            pinned = report.torch_requirement.split("==", 1)[1]
            if Version(pinned).public != Version(built).public:
                problems.append(f"torch pin {report.torch_requirement} differs from the torch "
                                f"it was built against ({built})")
        if info.get("version") and info["version"] != report.version:
            problems.append(f"build record says version {info['version']}, the wheel is "
                            f"{report.version}")
        if info.get("omitted_kernels"):
            problems.append(f"kernels left out at build time: {info['omitted_kernels']}")
    compiled = report.libraries
    # backends come from the code itself; a pure-Python wheel (custom_op kernels) has none
    found = {b for lib in compiled for b in lib.backends}
    for backend in variant.backends:
        if backend != "cpu" and backend not in found:
            problems.append(f"no {backend} device code in any compiled library "
                            f"({', '.join(lib.path for lib in compiled) or 'none'})")
    tags = " ".join(report.tags)
    if variant.cuda:
        sass, ptx = _expected_archs(variant.arch_list or "")
        found = set(report.cuda_archs)
        if not found:
            problems.append("no CUDA fat binary embedded: the CUDA kernels are missing")
        else:
            missing = sorted((sass | ptx) - found, key=_arch_sort_key)
            extra = sorted({a for a in found if a.startswith("sm_")} - sass, key=_arch_sort_key)
            if missing:
                problems.append(f"CUDA architectures missing: {', '.join(missing)} "
                                f"(embedded: {', '.join(sorted(found, key=_arch_sort_key))})")
            if extra:
                problems.append(f"CUDA architectures not requested: {', '.join(extra)}")
        if info and info.get("cuda_version") and info["cuda_version"] != variant.cuda:
            problems.append(f"built with CUDA {info['cuda_version']}, expected {variant.cuda}")
    elif report.cuda_archs:
        problems.append(f"variant {variant.name} is not CUDA but the wheel embeds "
                        f"{', '.join(report.cuda_archs)}")
    if variant.mps:
        if not (report.metal_sources or report.metallibs
                or any(lib.embedded_metal for lib in compiled)):
            problems.append("no Metal shaders (sources, metallib or embedded source) in the wheel")
        if "macosx" not in tags or "arm64" not in tags:
            problems.append(f"MPS wheel has platform tags {tags}, expected macosx_*_arm64")
    if compiled and all(p.startswith("linux-") for p in variant.platforms) and "linux" not in tags:
        problems.append(f"platform tags {tags} are not Linux")
    if "linux_x86_64" in tags or "linux_aarch64" in tags:
        problems.append(f"platform tag {tags} is not manylinux: the wheel was not repaired "
                        "with auditwheel")
    return problems
