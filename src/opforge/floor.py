"""A wheel's floor: the oldest systems its compiled libraries load on, against its torch's.

Linux: every symbol a library takes from glibc, libstdc++ or libgcc carries the version that
introduced it (``pthread_create@GLIBC_2.34``, ``std::__throw_bad_array_new_length@
GLIBCXX_3.4.29``); the library loads only where the system's libraries define all of them.
``read_floor`` reads those version needs with pyelftools (``.gnu.version_r`` and the per-symbol
``.gnu.version``), and the floor is the oldest manylinux policy that allows them all, from
auditwheel's own policy table (the one ``auditwheel repair`` tags wheels with). macOS: the
``minos`` of ``LC_BUILD_VERSION`` (or ``LC_VERSION_MIN_MACOSX``).

``problems`` holds a wheel to two rules: its platform tag never claims less than its libraries
need, and it installs wherever the torch it requires installs. Torch's own floor comes from the
platform tag of a torch wheel when one is named (``--torch-wheel``), else from this table of
PyTorch's published Linux and macOS wheels:

- torch >= 2.6: manylinux_2_28 (x86_64 and aarch64); torch < 2.6: manylinux_2_17;
- macOS arm64: 11.0.

A wheel built on a newer host than the image its cell names needs that host's glibc: the
check fails it, naming the symbols, and ``allow_host`` (``opforge inspect --allow-host-floor``)
turns that one failure into a note for a wheel meant for local use only.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path

from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from opforge.errors import UsageError
from opforge.pins import exact_pin, floor_of

# torch's Linux wheels, by the first release on each floor (see the module docstring)
TORCH_LINUX_FLOORS = ((Version("2.6"), (2, 28)), (Version("0"), (2, 17)))
TORCH_MACOS_FLOOR = (11, 0)
_LEGACY_MANYLINUX = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
_ELF_ARCH = {"EM_X86_64": "x86_64", "EM_AARCH64": "aarch64", "EM_386": "i686",
             "EM_PPC64": "ppc64le", "EM_S390": "s390x", "EM_ARM": "armv7l",
             "EM_RISCV": "riscv64"}
_VERSIONED = re.compile(r"(GLIBC|GLIBCXX|CXXABI|GCC)_([0-9][0-9.]*)\Z")


@dataclass
class LibraryFloor:
    """What one compiled library needs of the system it loads on."""

    kind: str = "unknown"                 # "elf", "macho", "unknown"
    arch: str | None = None
    # version name ("GLIBC_2.34") -> the undefined symbols that ask for it
    versions: dict[str, list[str]] = field(default_factory=dict)
    glibc: str | None = None              # the newest GLIBC_ version needed
    glibcxx: str | None = None            # the newest GLIBCXX_ version needed
    manylinux: str | None = None          # the oldest policy allowing every need
    minos: str | None = None              # macOS
    note: str = ""


def _version_key(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".") if p.isdigit())


def read_floor(path: Path) -> LibraryFloor:
    """The system versions the library at ``path`` needs (ELF: pyelftools; Mach-O: minos)."""
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic == b"\x7fELF":
        return _elf_floor(path)
    if magic in (b"\xcf\xfa\xed\xfe", b"\xce\xfa\xed\xfe", b"\xca\xfe\xba\xbe"):
        return _macho_floor(path)
    return LibraryFloor(note="not an ELF or Mach-O file")


def _elf_floor(path: Path) -> LibraryFloor:
    # pyelftools (~60 ms) when a library's floor is read: floor is on the CLI's startup path
    try:
        from elftools.common.exceptions import ELFError
        from elftools.elf.elffile import ELFFile
        from elftools.elf.gnuversions import GNUVerNeedSection, GNUVerSymSection
    except ImportError:
        return LibraryFloor(kind="elf", note="the floor needs pyelftools")
    out = LibraryFloor(kind="elf")
    try:
        with open(path, "rb") as fh:
            elf = ELFFile(fh)
            out.arch = _ELF_ARCH.get(elf["e_machine"], str(elf["e_machine"]))
            verneed = versym = dynsym = None
            for section in elf.iter_sections():
                if isinstance(section, GNUVerNeedSection):
                    verneed = section
                elif isinstance(section, GNUVerSymSection):
                    versym = section
                elif section["sh_type"] == "SHT_DYNSYM":
                    dynsym = section
            by_index: dict[int, str] = {}
            if verneed is not None:
                for _need, auxes in verneed.iter_versions():
                    for aux in auxes:
                        by_index[aux["vna_other"]] = aux.name
                        out.versions.setdefault(aux.name, [])
            if dynsym is not None and versym is not None:
                for i, symbol in enumerate(dynsym.iter_symbols()):
                    if symbol["st_shndx"] != "SHN_UNDEF" or not symbol.name:
                        continue
                    ndx = versym.get_symbol(i)["ndx"]
                    if isinstance(ndx, int) and (ndx & 0x7FFF) in by_index:
                        out.versions[by_index[ndx & 0x7FFF]].append(symbol.name)
    except (ELFError, OSError, struct.error, ValueError, KeyError) as exc:
        return LibraryFloor(kind="elf", note=f"cannot read its symbol versions ({exc})")
    for prefix, attr in (("GLIBC", "glibc"), ("GLIBCXX", "glibcxx")):
        found = [m.group(2) for v in out.versions if (m := _VERSIONED.match(v))
                 and m.group(1) == prefix]
        if found:
            setattr(out, attr, max(found, key=_version_key))
    out.manylinux = oldest_policy(out.versions, out.arch)
    return out


def _policies() -> list[dict] | None:
    """auditwheel's manylinux policies, oldest first (None: auditwheel is not installed)."""
    try:
        text = (files("auditwheel") / "policy" / "manylinux-policy.json").read_text()
    except (ImportError, FileNotFoundError, OSError, TypeError):
        return None
    policies = [p for p in json.loads(text) if p.get("name", "").startswith("manylinux_")]
    return sorted(policies, key=lambda p: -p["priority"])


def _allowed(policy: dict, arch: str | None, version: str) -> bool:
    match = _VERSIONED.match(version)
    if not match:
        return True  # a version of another library (or GLIBC_PRIVATE): not a system floor
    allowed = policy.get("symbol_versions", {}).get(arch or "x86_64", {})
    return match.group(2) in allowed.get(match.group(1), ())


def oldest_policy(versions: dict[str, list[str]], arch: str | None) -> str | None:
    """The oldest manylinux policy allowing every version in ``versions``; without auditwheel,
    the one the newest GLIBC_ version names (GLIBCXX then unjudged)."""
    policies = _policies()
    if policies is None:
        glibc = [m.group(2) for v in versions if (m := _VERSIONED.match(v)) and m.group(1) == "GLIBC"]
        if not glibc:
            return None
        major, minor = _version_key(max(glibc, key=_version_key))[:2]
        return f"manylinux_{major}_{max(minor, 5)}"
    for policy in policies:
        if all(_allowed(policy, arch, v) for v in versions):
            return policy["name"]
    return "linux"


def glibc_of(policy: str | None) -> tuple[int, int] | None:
    if not policy:
        return None
    match = re.match(r"manylinux_(\d+)_(\d+)", policy)
    if match:
        return int(match.group(1)), int(match.group(2))
    for legacy, version in _LEGACY_MANYLINUX.items():
        if policy.startswith(legacy):
            return version
    return (99, 99) if policy.startswith("linux") else None


def raisers(lib: LibraryFloor, ceiling: tuple[int, int]) -> dict[str, list[str]]:
    """The versions (and their symbols) a ``manylinux_<ceiling>`` system does not have."""
    policies = _policies()
    target = next((p for p in policies or () if glibc_of(p["name"]) == ceiling), None)
    out = {}
    for version, symbols in lib.versions.items():
        match = _VERSIONED.match(version)
        if not match:
            continue
        if target is not None:
            too_new = not _allowed(target, lib.arch, version)
        else:
            too_new = match.group(1) == "GLIBC" and _version_key(match.group(2)) > ceiling
        if too_new:
            out[version] = sorted(symbols)
    return dict(sorted(out.items(), key=lambda kv: (kv[0].split("_")[0],
                                                    _version_key(kv[0].split("_", 1)[1]))))


# --- Mach-O ---------------------------------------------------------------------------------

_LC_BUILD_VERSION, _LC_VERSION_MIN_MACOSX = 0x32, 0x24


def _macho_floor(path: Path) -> LibraryFloor:
    data = path.read_bytes()[: 1 << 22]  # load commands sit at the start of each slice
    offsets = [0]
    if data[:4] == b"\xca\xfe\xba\xbe":  # universal binary: big-endian slice table
        count = struct.unpack_from(">I", data, 4)[0]
        offsets = [struct.unpack_from(">IIIII", data, 8 + 20 * i)[2] for i in range(min(count, 8))]
    found = []
    for base in offsets:
        if data[base:base + 4] not in (b"\xcf\xfa\xed\xfe", b"\xce\xfa\xed\xfe"):
            continue
        header = 32 if data[base:base + 4] == b"\xcf\xfa\xed\xfe" else 28
        ncmds = struct.unpack_from("<I", data, base + 16)[0]
        pos = base + header
        for _ in range(min(ncmds, 4096)):
            if pos + 8 > len(data):
                break
            cmd, size = struct.unpack_from("<II", data, pos)
            if cmd == _LC_BUILD_VERSION and pos + 16 <= len(data):
                found.append(struct.unpack_from("<I", data, pos + 12)[0])
            elif cmd == _LC_VERSION_MIN_MACOSX and pos + 12 <= len(data):
                found.append(struct.unpack_from("<I", data, pos + 8)[0])
            if size < 8:
                break
            pos += size
    if not found:
        return LibraryFloor(kind="macho", note="no LC_BUILD_VERSION")
    newest = max(found)
    return LibraryFloor(kind="macho", minos=f"{newest >> 16}.{(newest >> 8) & 0xFF}")


# --- the wheel against its torch -------------------------------------------------------------


def _tag_floors(tags: list[str]) -> tuple[tuple[int, int] | None, tuple[int, int] | None]:
    """The lowest glibc and macOS versions a wheel's platform tags claim."""
    linux, mac = [], []
    for tag in tags:
        platform = tag.split("-")[-1]
        if platform.startswith("manylinux"):
            found = glibc_of(platform)
            if found:
                linux.append(found)
        match = re.match(r"macosx_(\d+)_(\d+)_", platform)
        if match:
            mac.append((int(match.group(1)), int(match.group(2))))
    return (min(linux) if linux else None), (min(mac) if mac else None)


def torch_floor(requirement_version: Version | None, torch_wheel: str | None = None,
                ) -> tuple[tuple[int, int] | None, tuple[int, int] | None, str]:
    """(glibc, macOS) floors of torch's wheels, and where they come from."""
    if torch_wheel:
        try:
            _, version, _, tags = parse_wheel_filename(Path(torch_wheel).name)
        except InvalidWheelFilename as exc:
            raise UsageError(f"--torch-wheel {torch_wheel}: not a wheel file name ({exc})") from None
        linux, mac = _tag_floors([str(t) for t in tags])
        return linux, mac, f"torch {version}'s wheel {Path(torch_wheel).name}"
    if requirement_version is None:
        return None, None, ""
    linux = next(floor for first, floor in TORCH_LINUX_FLOORS if requirement_version >= first)
    return linux, TORCH_MACOS_FLOOR, f"torch {requirement_version}'s published wheels"


def _fmt_glibc(v: tuple[int, int]) -> str:
    return f"manylinux_{v[0]}_{v[1]}"


def _few(items: list[str], n: int = 4) -> str:
    return ", ".join(items[:n]) + (f" (+{len(items) - n} more)" if len(items) > n else "")


@dataclass
class FloorCheck:
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    needed: str | None = None        # what the libraries need: "manylinux_2_34", "macOS 13.0"
    torch: str | None = None         # what torch's wheels need, and from where


def check(libraries: list, tags: list[str], torch_version: Version | None, *,
          torch_wheel: str | None = None, deployment_target: str | None = None,
          allow_host: bool = False) -> FloorCheck:
    """Hold the wheel's libraries (``wheels.Library`` with ``floor``) to its tags and torch."""
    result = FloorCheck()
    floors = [(lib.path, lib.floor) for lib in libraries if getattr(lib, "floor", None)]
    claimed_linux, claimed_mac = _tag_floors(tags)
    torch_linux, torch_mac, source = torch_floor(torch_version, torch_wheel)
    elf = [(p, f) for p, f in floors if f.kind == "elf" and f.manylinux]
    if elf:
        path, worst = max(elf, key=lambda pf: glibc_of(pf[1].manylinux) or (0, 0))
        needed = glibc_of(worst.manylinux) or (0, 0)
        result.needed = worst.manylinux
        if claimed_linux and needed > claimed_linux:
            why = raisers(worst, claimed_linux)
            result.problems.append(
                f"{path}: platform tag claims {_fmt_glibc(claimed_linux)} but the library needs "
                f"{worst.manylinux} ({_why(why)}): pip would install it where it cannot load")
        if torch_linux:
            result.torch = f"{_fmt_glibc(torch_linux)} ({source})"
            if needed > torch_linux:
                why = raisers(worst, torch_linux)
                line = (f"{path}: needs {worst.manylinux} ({_why(why)}), but {source} "
                        f"install on {_fmt_glibc(torch_linux)}: the wheel installs on fewer "
                        f"systems than its torch; build it in a {_fmt_glibc(torch_linux)} image "
                        f"(matrix.yaml's container)")
                if allow_host:
                    result.notes.append(line + " - accepted for local use (--allow-host-floor)")
                else:
                    result.problems.append(line + ", or pass --allow-host-floor to accept it for "
                                                  "local use only")
    mach = [(p, f) for p, f in floors if f.kind == "macho" and f.minos]
    if mach:
        path, worst = max(mach, key=lambda pf: _version_key(pf[1].minos))
        minos = _version_key(worst.minos)[:2]
        result.needed = f"macOS {worst.minos}"
        if claimed_mac and minos > claimed_mac:
            result.problems.append(
                f"{path}: platform tag claims macOS {claimed_mac[0]}.{claimed_mac[1]} but the "
                f"library's minos is {worst.minos}")
        if torch_mac:
            result.torch = f"macOS {torch_mac[0]}.{torch_mac[1]} ({source})"
            declared = _version_key(deployment_target)[:2] if deployment_target else None
            allowed = max(torch_mac, declared) if declared else torch_mac
            if minos > allowed:
                line = (f"{path}: needs macOS {worst.minos} (minos), above "
                        + (f"its declared deployment target {deployment_target} and "
                           if declared else "")
                        + f"{source}' macOS {torch_mac[0]}.{torch_mac[1]}: set "
                        "MACOSX_DEPLOYMENT_TARGET (matrix.yaml's macos_deployment_target)")
                (result.notes if allow_host else result.problems).append(line)
    return result


def _why(raised: dict[str, list[str]]) -> str:
    if not raised:
        return "its symbol versions"
    return "; ".join(f"{version}: {_few(symbols) or '(no symbol named)'}"
                     for version, symbols in raised.items())


def version_of(requirement: str | None) -> Version | None:
    """The torch version a requirement names: its exact pin, else its floor."""
    found = exact_pin(requirement) or floor_of(requirement)
    try:
        return Version(found.public) if found else None
    except InvalidVersion:
        return None
