"""The CUDA kernel files of csrc/cuda, compiled as host C++ and run on the CPU.

    ops = cuda_emu.load()      # torch.ops.opforge_cuda_emu, same schemas as torch.ops.opforge
    stable = cuda_emu.load("stable")   # torch.ops.opforge_cuda_emu_stable: the stable-ABI build
    ops.roi_align(x, rois, 1.0, 7, 7, 2, True)   # the real kernels and host wrappers

Every op's csrc/cuda/<op>_device.cu (its kernels and launch functions) and <op>_kernel.cpp
(its host wrappers) are compiled unchanged but for the launches: prelude.h and the stub
headers here stand in for the CUDA runtime, each
`kernel<<<grid, block>>>(args)` launch runs every (block, thread) of its grid in turn on an
emulated device with one SM (so the capped grids are far smaller than the work and every
grid-stride loop takes several steps), and TORCH_LIBRARY_IMPL(opforge, CUDA) registers
under opforge_cuda_emu on the CPU key. The build is cached per torch version, checkout, ABI and emulation headers
(ninja recompiles what changed). A cold build first precompiles prelude.h (it pulls in all of
torch's C++ API, most of each file's compile time) and every kernel file uses that header
(a gcc PCH, deleted again after the build).
Files in NOT_EMULATED are left out, with the reason.

load(abi="stable") compiles the same files against the LibTorch stable ABI (abi.h's stable
names, as in the cu130_stable wheel: the C shim's allocation, device guard, stream and
dispatcher calls) and registers them under opforge_cuda_emu_stable; both builds can be loaded
in one process (the cuda_emu and cuda_stable_emu backends of tests/backends.py).
OPFORGE_CUDA_EMU_ABI=stable makes the stable build what load() without an ABI returns.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shlex
import subprocess
import tempfile
from pathlib import Path
from unittest import mock

import torch
from build_lock import build_lock

HERE = Path(__file__).resolve().parent
CSRC = HERE.parents[1] / "csrc"
NAMESPACES = {"legacy": "opforge_cuda_emu", "stable": "opforge_cuda_emu_stable"}
NOT_EMULATED: dict[str, str] = {}  # device file name (<op>_device.cu) -> why it cannot be emulated
ABIS = ("legacy", "stable")
CACHE = Path(
    os.environ.get("OPFORGE_CUDA_EMU_CACHE", Path(tempfile.gettempdir()) / "opforge-cuda-emu")
)


def emulated_sources() -> list[Path]:
    """The device files emulated (their launches rewritten)."""
    return [p for p in sorted((CSRC / "cuda").glob("*_device.cu")) if p.name not in NOT_EMULATED]


def host_sources() -> list[Path]:
    """The host files of the emulated ops, compiled as they are."""
    return [CSRC / "cuda" / p.name.replace("_device.cu", "_kernel.cpp") for p in emulated_sources()]


def _calls_syncthreads(source: str, kernel: str) -> bool:
    """Whether the __global__ function `kernel` (template arguments stripped) calls __syncthreads."""
    name = kernel.split("<", 1)[0].split("::")[-1].strip()
    match = re.search(rf"__global__[^;{{]*?\b{re.escape(name)}\s*\(", source)
    if not match:
        return False
    start = source.index("{", match.end())
    depth, k = 0, start
    while True:
        depth += {"{": 1, "}": -1}.get(source[k], 0)
        if depth == 0:
            return "__syncthreads" in source[start:k]
        k += 1


def emulated_launches(source: str) -> str:
    """`kernel<<<grid, block, smem, stream>>>(args);` ->
    `::opforge_emu::launch(grid, block, [&] { kernel(args); });`, or launch_cooperative(grid,
    block, smem, ...) for a kernel that calls __syncthreads; `extern __shared__ T name[];`
    -> a pointer to the launch's dynamic shared memory."""
    original = source
    source = re.sub(
        r"extern\s+__shared__\s+([\w:]+(?:\s+[\w:]+)*?)\s+(\w+)\[\];",
        r"\1* \2 = reinterpret_cast<\1*>(::opforge_emu::dynamic_shared());",
        source,
    )
    out = []
    while (i := source.find("<<<")) >= 0:
        start = max(source.rfind(c, 0, i) for c in ";{}") + 1
        kernel = source[start:i].strip()
        j = source.index(">>>", i)
        parts = [part.strip() for part in re.split(r",(?![^(]*\))", source[i + 3 : j])]
        grid, block = parts[:2]
        depth, k = 0, j + 3
        while True:
            depth += {"(": 1, ")": -1}.get(source[k], 0)
            if depth == 0 and source[k] == ")":
                break
            k += 1
        args = source[j + 4 : k]
        if _calls_syncthreads(original, kernel):
            shared = parts[2] if len(parts) > 2 else "0"
            call = f"::opforge_emu::launch_cooperative({grid}, {block}, {shared}, [&] {{ {kernel}({args}); }})"
        else:
            call = f"::opforge_emu::launch({grid}, {block}, [&] {{ {kernel}({args}); }})"
        out.append(f"{source[:start]}\n{call}")
        source = source[source.index(";", k) :]
    return "".join(out) + source


_MAIN = """#include "prelude.h"
// The launch counter, for tests that check an empty input launches nothing.
int64_t opforge_cuda_emu_launches() { return opforge_emu::launches; }
#ifdef OPFORGE_STABLE_ABI
extern "C" AOTITorchError opforge_emu_create_device_guard(int32_t, DeviceGuardHandle* guard) {
  *guard = nullptr;  // one emulated device: nothing to switch
  return AOTI_TORCH_SUCCESS;
}
extern "C" AOTITorchError opforge_emu_delete_device_guard(DeviceGuardHandle) {
  return AOTI_TORCH_SUCCESS;
}
STABLE_TORCH_LIBRARY_FRAGMENT(NAMESPACE, m) { m.def("_launches() -> int"); }
_STABLE_TORCH_LIBRARY_IMPL(NAMESPACE, CompositeExplicitAutograd, m, C10_UID) {
  m.impl("_launches", TORCH_BOX(&opforge_cuda_emu_launches));
}
#else
TORCH_LIBRARY_FRAGMENT(NAMESPACE, m) { m.def("_launches() -> int", &opforge_cuda_emu_launches); }
#endif
"""


def abi_from_env() -> str:
    abi = os.environ.get("OPFORGE_CUDA_EMU_ABI", "legacy").strip() or "legacy"
    if abi not in ABIS:
        raise ValueError(f"OPFORGE_CUDA_EMU_ABI must be one of {', '.join(ABIS)}, got {abi!r}")
    return abi


def _define_schemas(namespace: str) -> None:
    """<namespace>::<op> with the schema of every opforge::<op> (the built extension's)."""
    library = torch.library.Library(namespace, "FRAGMENT")
    for schema in torch._C._jit_get_all_schemas():
        if schema.name.startswith("opforge::"):
            library.define(str(schema).split("::", 1)[1])
    _LIBRARIES.append(library)  # a Library unregisters its ops when collected


_LIBRARIES: list = []
_LOADED: set[str] = set()  # the ABIs whose build this process has loaded
_DEFINED: set[str] = set()  # the namespaces whose schemas this process has defined


def load(abi: str | None = None):
    """Build (cached) and load the emulation of `abi` (default: OPFORGE_CUDA_EMU_ABI, else
    legacy); returns torch.ops.opforge_cuda_emu (legacy) or torch.ops.opforge_cuda_emu_stable."""
    abi = abi or abi_from_env()
    if abi not in ABIS:
        raise ValueError(f"cuda_emu: the ABI is one of {', '.join(ABIS)}, not {abi!r}")
    namespace = NAMESPACES[abi]
    if abi in _LOADED:
        return getattr(torch.ops, namespace)
    from torch.utils import cpp_extension

    sources = emulated_sources()
    # One build directory per torch and checkout (two checkouts sharing one would overwrite
    # each other's sources and rebuild everything); files are rewritten only when their text
    # changes, so ninja recompiles just the kernel files that changed since the last run.
    # The emulation's own headers are part of the name: a kernel file compiled with the
    # precompiled prelude does not list it (nor the stubs it includes) among its dependencies.
    checkout = hashlib.sha256(str(CSRC).encode()).hexdigest()[:10]
    headers = _emulation_headers_digest()
    suffix = "" if abi == "legacy" else f"-{abi}"
    root = CACHE / f"torch-{torch.__version__}-{checkout}-{headers}{suffix}"
    src = root / "csrc" / "cuda"
    prelude = root / "prelude" / "prelude.h"  # a copy: its .gch is written beside it
    wanted = {
        Path("csrc") / p.relative_to(CSRC): p.read_text()
        for p in CSRC.rglob("*")
        if p.is_file() and p.suffix not in (".mm", ".metal", ".py")
    }
    for path in sources:
        wanted[Path("csrc") / "cuda" / f"{path.stem}.emu.cpp"] = emulated_launches(path.read_text())
    wanted[Path("csrc") / "cuda" / "emu_main.cpp"] = _MAIN.replace("NAMESPACE", namespace)
    wanted[prelude.relative_to(root)] = (HERE / "prelude.h").read_text()
    # two processes loading one build (two xdist workers) take turns: the sources are written
    # and compiled by one, the other finds the build done
    with build_lock(root.parent / f"{root.name}.lock"):
        for relative, text in wanted.items():
            target = root / relative
            if not target.exists() or target.read_text() != text:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text)
        (root / "build").mkdir(exist_ok=True)
        if namespace not in _DEFINED:  # once, even if a failed build is retried
            _define_schemas(namespace)
            _DEFINED.add(namespace)
        # the stable build: abi.h's stable names and the shim, at the floor setup.py uses
        stable = ["-DOPFORGE_STABLE_ABI", "-DTORCH_STABLE_ONLY", "-DTORCH_TARGET_VERSION=0x020a000000000000"]
        # private: the one hook between writing build.ninja and running it, which the PCH
        # needs (its flags are the ninja file's); a torch without it builds without the PCH
        run_ninja = getattr(cpp_extension, "_run_ninja_build", None)

        def build(build_dir, *args, **kwargs):
            _build_with_pch(run_ninja, prelude, build_dir, *args, **kwargs)

        hook = (mock.patch.object(cpp_extension, "_run_ninja_build", build) if run_ninja is not None
                else contextlib.nullcontext())
        with hook:
            cpp_extension.load(
                name="opforge_cuda_emulation" + ("" if abi == "legacy" else f"_{abi}"),
                sources=[str(src / "emu_main.cpp"), *(str(src / f"{p.stem}.emu.cpp") for p in sources),
                         *(str(src / p.name) for p in host_sources())],
                extra_include_paths=[str(HERE / "stub"), str(HERE), str(src)],
                extra_cflags=["-O1", "-g0", "-w", f"-DOPFORGE_CUDA_EMU_NS={namespace}",
                              "-include", str(prelude), *(stable if abi == "stable" else [])],
                build_directory=str(root / "build"),
                is_python_module=False,
                verbose=False,
            )
    _LOADED.add(abi)
    return getattr(torch.ops, namespace)


def _emulation_headers_digest() -> str:
    files = [HERE / "prelude.h", *sorted(p for p in (HERE / "stub").rglob("*") if p.is_file())]
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path.relative_to(HERE)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:10]


def _pending_compiles(build_dir: Path) -> int:
    """How many files ninja would compile now (its dry run), or 0 if that cannot be told."""
    try:
        dry = subprocess.run(["ninja", "-C", str(build_dir), "-n"], capture_output=True,
                             text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(" -c " in line for line in dry.stdout.splitlines()) if dry.returncode == 0 else 0


def _build_with_pch(run_ninja, prelude: Path, build_dir: str, *args, **kwargs) -> None:
    """torch's ninja build, after precompiling `prelude` with the very flags build.ninja
    compiles each kernel file with (gcc takes prelude.h.gch for `-include prelude.h`, and
    parses the header itself if the .gch does not match), when two or more files need
    compiling; the .gch (~800 MB) is deleted once the build is over."""
    pch = prelude.with_name(prelude.name + ".gch")
    pch.unlink(missing_ok=True)
    if _pending_compiles(Path(build_dir)) >= 2:
        _precompile(Path(build_dir) / "build.ninja", prelude, pch)
    try:
        run_ninja(build_dir, *args, **kwargs)
    finally:
        pch.unlink(missing_ok=True)


def _precompile(ninja_file: Path, prelude: Path, pch: Path) -> None:
    variables = {}
    for line in ninja_file.read_text().splitlines():
        name, sep, value = line.partition(" = ")
        if sep and name in ("cxx", "cflags", "post_cflags"):
            variables[name] = shlex.split(value)
    cflags = variables.get("cflags", [])
    if not variables.get("cxx") or "-include" not in cflags:
        return  # not the build this was written for: compile without a PCH
    try:
        version = subprocess.run([*variables["cxx"], "--version"], capture_output=True, text=True).stdout
    except OSError:
        return
    if "clang" in version.lower():
        return  # clang refuses a PCH it finds stale instead of parsing the header: gcc only
    at = cflags.index("-include")
    flags = cflags[:at] + cflags[at + 2:]
    if "-c" in flags:
        flags.remove("-c")  # the rule's own -c: torch puts it in cflags
    partial = pch.with_name(pch.name + ".partial")
    made = subprocess.run([*variables["cxx"], *flags, "-x", "c++-header", str(prelude), "-o",
                           str(partial), *variables.get("post_cflags", [])],
                          capture_output=True, text=True)
    if made.returncode == 0:
        partial.replace(pch)  # whole or not at all: a torn .gch would fail every compile
    else:
        partial.unlink(missing_ok=True)  # the build itself reports the header's error
