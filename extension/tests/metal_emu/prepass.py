"""Source pre-pass that turns a .metal file into a C++ translation unit for the shim.

Two things a macro cannot do:
  * `threadgroup T name[N];` declares storage shared by a threadgroup; in C++
    it would be one copy per thread.  It becomes a reference to a
    per-threadgroup slot (metal_emu::tg_slot).
  * `kernel void f(... [[buffer(n)]], uint3 p [[thread_position_in_grid]])`
    is called by Metal with bound buffers and built-in positions.  Each
    kernel gets a launcher entry that does the same from a buffer table and
    the emulated thread's context.

The kernel file is first expanded with the C preprocessor (its own macros
and dispatch.h only; <metal_stdlib> resolves to an empty file), so kernels
stamped out by macros are seen as the Metal compiler sees them.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent

POSITION_ATTRIBUTES = {
    "thread_position_in_grid",
    "thread_position_in_threadgroup",
    "threadgroup_position_in_grid",
    "threads_per_threadgroup",
    "threadgroups_per_grid",
    "threads_per_grid",
    "thread_index_in_threadgroup",
}

_THREADGROUP_DECL = re.compile(
    r"\bthreadgroup\s+(?P<type>[A-Za-z_][\w:]*)\s+(?P<name>[A-Za-z_]\w*)\s*"
    r"(?P<dims>(?:\[[^\]\[;]+\]\s*)*);"
)
_KERNEL = re.compile(r"\bkernel\s+void\s+(?P<name>[A-Za-z_]\w*)\s*\(")
_PARAM = re.compile(
    r"^(?P<decl>.*?)\s*\[\[\s*(?P<attr>\w+)\s*(?:\(\s*(?P<index>\d+)\s*\))?\s*\]\]\s*$", re.S
)


class PrepassError(Exception):
    """The .metal source uses something the emulation does not understand."""


@dataclasses.dataclass(frozen=True)
class Param:
    type: str
    name: str
    attribute: str
    index: int | None


@dataclasses.dataclass(frozen=True)
class Kernel:
    name: str
    params: tuple[Param, ...]
    synchronised: bool

    @property
    def buffers(self) -> tuple[int, ...]:
        return tuple(p.index for p in self.params if p.attribute == "buffer")


def preprocess(metal_file: Path, include_dirs: list[Path], cxx: str = "g++") -> str:
    """The kernel file with its macros expanded (line markers kept for diagnostics)."""
    cmd = [
        cxx,
        "-E",
        "-x",
        "c++",
        "-nostdinc",
        "-D__METAL_VERSION__=310",
        "-I",
        str(HERE / "include_pp"),
    ]
    for d in include_dirs:
        cmd += ["-I", str(d)]
    cmd.append(str(metal_file))
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise PrepassError(f"preprocessing {metal_file} failed:\n{proc.stderr}")
    return proc.stdout


def _matching(text: str, open_at: int, open_ch: str, close_ch: str) -> int:
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] == open_ch:
            depth += 1
        elif text[i] == close_ch:
            depth -= 1
            if depth == 0:
                return i
    raise PrepassError(f"unbalanced {open_ch}{close_ch} at offset {open_at}")


def _split_top_level(params: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(params):
        if ch in "([<":
            depth += 1
        elif ch in ")]>":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(params[start:i])
            start = i + 1
    parts.append(params[start:])
    return [p.strip() for p in parts if p.strip()]


def _parse_param(text: str, kernel: str) -> Param:
    m = _PARAM.match(" ".join(text.split()))
    if not m:
        raise PrepassError(f"kernel {kernel}: parameter without a Metal attribute: {text!r}")
    decl, attr = m["decl"], m["attr"]
    name_match = re.search(r"([A-Za-z_]\w*)\s*$", decl)
    if not name_match:
        raise PrepassError(f"kernel {kernel}: cannot find the name in {decl!r}")
    ptype = decl[: name_match.start()].strip()
    if attr == "buffer":
        if m["index"] is None:
            raise PrepassError(f"kernel {kernel}: [[buffer]] without an index")
        if not (ptype.endswith("*") or ptype.endswith("&")):
            raise PrepassError(
                f"kernel {kernel}: buffer parameter {decl!r} is not a pointer or reference"
            )
        return Param(ptype, name_match[1], attr, int(m["index"]))
    if attr not in POSITION_ATTRIBUTES:
        raise PrepassError(f"kernel {kernel}: attribute [[{attr}]] is not emulated")
    return Param(ptype, name_match[1], attr, None)


def rewrite_threadgroup_storage(source: str) -> str:
    counter = iter(range(1_000_000))

    def replace(m: re.Match) -> str:
        slot = next(counter)
        t, name, dims = m["type"], m["name"], re.sub(r"\s+", "", m["dims"])
        full = f"{t}{dims}"
        # Stays on one line so the line markers still point into the .metal file.
        return (
            f"{t} (&{name}){dims} = *static_cast<{t}(*){dims}>("
            f"::metal_emu::tg_slot({slot}, sizeof({full})));"
            if dims
            else f"{t}& {name} = *static_cast<{t}*>(::metal_emu::tg_slot({slot}, sizeof({t})));"
        )

    return _THREADGROUP_DECL.sub(replace, source)


def find_kernels(source: str) -> list[Kernel]:
    kernels = []
    barrier_outside = False
    covered = []
    for m in _KERNEL.finditer(source):
        open_paren = m.end() - 1
        close_paren = _matching(source, open_paren, "(", ")")
        body_open = source.index("{", close_paren)
        body_close = _matching(source, body_open, "{", "}")
        covered.append((m.start(), body_close))
        body = source[body_open:body_close]
        params = tuple(
            _parse_param(p, m["name"])
            for p in _split_top_level(source[open_paren + 1 : close_paren])
        )
        sync = "threadgroup_barrier" in body or "tg_slot" in body
        kernels.append(Kernel(m["name"], params, sync))
    outside = source
    for start, end in reversed(covered):
        outside = outside[:start] + outside[end:]
    barrier_outside = "threadgroup_barrier" in outside
    if barrier_outside:  # a helper function synchronises: be safe for every kernel
        kernels = [dataclasses.replace(k, synchronised=True) for k in kernels]
    if not kernels:
        raise PrepassError("no kernel functions found")
    return kernels


def _argument(p: Param) -> str:
    if p.attribute == "buffer":
        if p.type.endswith("&"):
            return f"*reinterpret_cast<{p.type[:-1].strip()}*>(b[{p.index}])"
        return f"reinterpret_cast<{p.type}>(b[{p.index}])"
    if p.attribute == "thread_index_in_threadgroup":
        return f"static_cast<{p.type}>(c.thread_index_in_threadgroup)"
    return f"::metal_emu::position<{p.type}>(c.{p.attribute})"


def launchers(kernels: list[Kernel]) -> str:
    lines = ["", "// ---- generated by prepass.py: one launcher per kernel", ""]
    for k in kernels:
        args = ", ".join(_argument(p) for p in k.params)
        lines.append(
            f"static void emu_launch_{k.name}(void** b, const ::metal_emu::ThreadContext& c) "
            f"{{ {k.name}({args}); }}"
        )
    lines.append("static const ::metal_emu::KernelEntry kEmuKernels[] = {")
    for k in kernels:
        bufs = ", ".join(str(i) for i in k.buffers)
        lines.append(
            f'  {{"{k.name}", {str(k.synchronised).lower()}, {{{bufs}}}, &emu_launch_{k.name}}},'
        )
    lines.append("};")
    return "\n".join(lines) + "\n"


def translate(
    metal_file: Path,
    include_dirs: list[Path],
    probes: Path | None = None,
    cxx: str = "g++",
    library: bool = False,
) -> tuple[str, list[Kernel]]:
    """The complete C++ translation unit for one .metal file, and its kernels.

    With library=False it is a program (driver_main.h); with library=True it
    exports its kernel table as opforge_emu_kernels_<stem> for emu_runtime.h.
    """
    expanded = preprocess(metal_file, include_dirs, cxx)
    kernels = find_kernels(expanded)
    body = rewrite_threadgroup_storage(expanded)
    parts = [f'#include "{HERE / "metal_shim.h"}"', body, launchers(kernels)]
    if library:
        ident = re.sub(r"\W", "_", metal_file.stem)
        parts.append(
            f'extern "C" const ::metal_emu::KernelEntry* opforge_emu_kernels_{ident}(unsigned long* n) '
            "{ *n = sizeof(kEmuKernels) / sizeof(kEmuKernels[0]); return kEmuKernels; }"
        )
        return "\n".join(parts), kernels
    if probes is not None:
        parts.append(f'#include "{probes}"')
    parts.append(f'#include "{HERE / "driver_main.h"}"')
    return "\n".join(parts), kernels


# ------------------------------------------------------------------ lint
# The shim erases address spaces and accepts all of C++, so the emulation
# would pass code Apple's compiler rejects.  These checks cover that gap for
# the rules that are mechanical.
_FORBIDDEN = {
    r"\bdouble\b": "MSL has no double",
    r"\bstd::": "the C++ standard library does not exist in MSL",
    r"\bnew\b|\bdelete\b|\bmalloc\b": "no dynamic allocation in MSL",
    r"\bthrow\b|\btry\b|\bcatch\b": "no exceptions in MSL",
    r"\bvirtual\b": "no virtual functions in MSL",
    r"\bthread_local\b|\bgoto\b": "not in MSL",
    r"\bprintf\b": "no printf in MSL kernels",
}
_FUNCTION = re.compile(
    r"(?:^|[;}\n])\s*(?:template\s*<[^>]*>\s*)?(?:inline\s+|static\s+)*(?:kernel\s+)?"
    r"(?!return\b|if\b|for\b|while\b|switch\b)[A-Za-z_][\w:]*(?:<[^;{}()]*>)?\s*[*&]?\s+"
    r"(?P<name>[A-Za-z_]\w*)\s*\((?P<params>[^;{}]*?)\)\s*\{",
)
_ADDRESS_SPACE = re.compile(r"\b(device|constant|thread|threadgroup)\b")


def function_names(expanded: str) -> list[str]:
    """Functions whose parameters lint() checks (to prove it is not checking nothing)."""
    text = "\n".join(line for line in expanded.splitlines() if not line.startswith("#"))
    return [m["name"] for m in _FUNCTION.finditer(text)]


def lint(expanded: str) -> list[str]:
    """Problems Apple's Metal compiler would report that the shim would not."""
    text = "\n".join(line for line in expanded.splitlines() if not line.startswith("#"))
    problems = []
    for pattern, why in _FORBIDDEN.items():
        for m in re.finditer(pattern, text):
            problems.append(f"{m.group(0)!r}: {why}")
    for m in _FUNCTION.finditer(text):
        for p in _split_top_level(m["params"]):
            decl = re.sub(r"\[\[.*?\]\]", "", p)
            if ("*" in decl or "&" in decl) and not _ADDRESS_SPACE.search(decl):
                problems.append(
                    f"{m['name']}: parameter {p.strip()!r} needs an address space "
                    "(device, constant, thread or threadgroup)"
                )
    for k in find_kernels(expanded):
        buffers = [p.index for p in k.params if p.attribute == "buffer"]
        if len(set(buffers)) != len(buffers):
            problems.append(f"{k.name}: a [[buffer(n)]] index is used twice: {buffers}")
        if any(i > 30 for i in buffers):
            problems.append(f"{k.name}: Metal binds buffers 0..30 only: {buffers}")
        kinds = {p.type for p in k.params if p.attribute != "buffer"}
        if len(kinds) > 1:
            problems.append(
                f"{k.name}: position attributes must share one type, got {sorted(kinds)}"
            )
    return problems
