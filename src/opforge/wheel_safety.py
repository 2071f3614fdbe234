"""The rules a wheel's members must keep before anything of it is read or extracted: no name
that leaves the install folder, no link, no more than ``MAX_MEMBERS`` members, and a library
member that is a real ELF, Mach-O or PE file (``binary_problem``). ``opforge.wheels`` applies
them while it reads a wheel."""

from __future__ import annotations

import re
import stat
import struct
import zipfile

MAX_MEMBERS = 20_000          # torch's own wheel has ~12k members; more is not a wheel to audit


def unsafe_member(info: zipfile.ZipInfo) -> str | None:
    """Why a member may not be in a wheel: it leaves the wheel's root, or is a link."""
    name = info.filename
    parts = name.replace("\\", "/").split("/")
    if name.startswith(("/", "\\")) or re.match(r"[A-Za-z]:", name):
        return "an absolute path: it would be written outside the install folder"
    if ".." in parts:
        return "a path with '..': it would be written outside the install folder"
    if stat.S_ISLNK(info.external_attr >> 16):
        return "a symbolic link (a wheel holds files only; pip writes the link's target text)"
    return None


def member_problems(infos: list[zipfile.ZipInfo]) -> list[str]:
    """Members a wheel must not hold: outside its root, links, duplicates."""
    out, seen = [], set()
    for info in infos[:MAX_MEMBERS]:
        why = unsafe_member(info)
        if why:
            out.append(f"member {info.filename!r}: {why}")
        if info.filename in seen:
            out.append(f"member {info.filename!r}: listed twice (which one is installed?)")
        seen.add(info.filename)
    return out


_ELF_DYN, _ELF_EXEC = 3, 2


def binary_problem(head: bytes, size: int) -> str | None:
    """Why a library member is not a loadable library: not ELF, Mach-O or PE, or its headers
    point past its end (truncated). ``head``: its first bytes (at least 64 when it has them)."""
    if head[:4] == b"\x7fELF":
        if size < 52 or len(head) < 52:
            return f"a truncated ELF file ({size} bytes, shorter than its header)"
        klass, order = head[4], head[5]
        if klass not in (1, 2) or order not in (1, 2):
            return "an ELF file with an unknown class or byte order"
        end = "<" if order == 1 else ">"
        if klass == 2:
            if size < 64 or len(head) < 64:
                return f"a truncated ELF file ({size} bytes, shorter than its header)"
            e_type, = struct.unpack_from(end + "H", head, 16)
            phoff, shoff = struct.unpack_from(end + "QQ", head, 32)
            phentsize, phnum, shentsize, shnum = struct.unpack_from(end + "HHHH", head, 54)
        else:
            e_type, = struct.unpack_from(end + "H", head, 16)
            phoff, shoff = struct.unpack_from(end + "II", head, 28)
            phentsize, phnum, shentsize, shnum = struct.unpack_from(end + "HHHH", head, 42)
        if e_type not in (_ELF_DYN, _ELF_EXEC):
            return f"an ELF file of type {e_type}, not a shared library"
        if phnum == 0:
            return "an ELF file without program headers: nothing the loader can map"
        if phoff + phnum * phentsize > size or (shnum and shoff + shnum * shentsize > size):
            return f"a truncated ELF file ({size} bytes; its headers reach further)"
        return None
    magic = head[:4]
    if magic in (b"\xcf\xfa\xed\xfe", b"\xce\xfa\xed\xfe", b"\xfe\xed\xfa\xcf",
                 b"\xfe\xed\xfa\xce"):
        header = 32 if magic in (b"\xcf\xfa\xed\xfe", b"\xfe\xed\xfa\xcf") else 28
        if len(head) < header:
            return f"a truncated Mach-O file ({size} bytes)"
        end = "<" if magic[0] in (0xcf, 0xce) else ">"
        ncmds, sizeofcmds = struct.unpack_from(end + "II", head, 16)
        if ncmds == 0 or header + sizeofcmds > size:
            return f"a truncated Mach-O file ({size} bytes; its load commands reach further)"
        return None
    if magic in (b"\xca\xfe\xba\xbe", b"\xbe\xba\xfe\xca"):
        return None  # a universal (fat) Mach-O binary: its slices are read by the tools
    if head[:2] == b"MZ":
        return None
    return (f"not a library: neither ELF, Mach-O nor PE (it starts with "
            f"{head[:8]!r})")
