"""Run opforge's .metal kernels on the CPU: build, launch, probe, geometry.

    emu = build("roi_align")                   # compiled once per source hash
    g = geometry.dispatch_1d(work_items)       # the numbers the MPS host code uses
    emu.launch("roi_align_forward_float", g, {0: input, 1: rois, 2: out, 3: params})

Each .metal file becomes one executable (prepass.py + metal_shim.h) built
with the address and undefined-behaviour sanitizers: buffers are copied into
heap blocks of exactly their size, so a kernel touching memory past a buffer
(e.g. a missing bounds check in the last threadgroup) or overflowing a
signed index fails the launch.  Executables are cached under the system temp
dir by a hash of everything that goes into them.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import dataclasses
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
from build_lock import build_lock

from . import prepass

HERE = Path(__file__).resolve().parent
EXTENSION = HERE.parent.parent
METAL_DIR = EXTENSION / "csrc" / "metal"
DISPATCH_H = METAL_DIR / "dispatch.h"
CXX = os.environ.get("CXX", "g++")
CXXFLAGS = [
    "-std=c++20",
    "-O1",
    "-g",
    "-pthread",
    "-Wno-attributes",
    "-fsanitize=address,undefined",
    "-fno-sanitize-recover=all",
    "-fno-omit-frame-pointer",
]
CACHE = Path(
    os.environ.get("OPFORGE_METAL_EMU_CACHE", Path(tempfile.gettempdir()) / "opforge-metal-emu")
)
_ENV = dict(
    os.environ, ASAN_OPTIONS="detect_leaks=0:abort_on_error=0", UBSAN_OPTIONS="print_stacktrace=1"
)


class EmuError(RuntimeError):
    """A kernel failed in the emulation (sanitizer report, barrier divergence, bad binding)."""


def _compiler_id() -> str:
    return subprocess.run([CXX, "--version"], capture_output=True, text=True).stdout.splitlines()[0]


def _digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(hashlib.sha256(p).digest())
    return h.hexdigest()[:20]


def _metal_headers() -> list[Path]:
    """dispatch.h and every op's csrc/metal/<op>.h."""
    return sorted(METAL_DIR.glob("*.h"))


def _emu_sources() -> list[bytes]:
    return [(HERE / n).read_bytes() for n in ("metal_shim.h", "driver_main.h", "prepass.py")] + [
        *(h.read_bytes() for h in _metal_headers()),
        _compiler_id().encode(),
        " ".join(CXXFLAGS).encode(),
    ]


@dataclasses.dataclass(frozen=True)
class Dispatch:
    groups: tuple[int, int, int]
    threads: tuple[int, int, int]

    @property
    def total_threads(self) -> int:
        g, t = self.groups, self.threads
        return g[0] * g[1] * g[2] * t[0] * t[1] * t[2]


class Emulated:
    """One compiled .metal file."""

    def __init__(self, exe: Path, kernels: list[prepass.Kernel]):
        self.exe = exe
        self.kernels = {k.name: k for k in kernels}

    def launch(
        self, kernel: str, dispatch: Dispatch, buffers: dict[int, np.ndarray | bytes]
    ) -> None:
        """Run `kernel` over `dispatch`; numpy buffers are updated in place."""
        if kernel not in self.kernels:
            raise EmuError(f"{self.exe.name} has no kernel {kernel}; it has {sorted(self.kernels)}")
        with tempfile.TemporaryDirectory(prefix="emu-launch-") as tmp:
            args = []
            for index, buf in buffers.items():
                path = Path(tmp) / f"b{index}.bin"
                data = buf if isinstance(buf, bytes) else np.ascontiguousarray(buf).tobytes()
                path.write_bytes(data)
                args.append(f"{index}={path}")
            cmd = [
                str(self.exe),
                "launch",
                kernel,
                *map(str, dispatch.groups),
                *map(str, dispatch.threads),
                *args,
            ]
            proc = subprocess.run(cmd, capture_output=True, text=True, env=_ENV)
            if proc.returncode != 0:
                raise EmuError(f"{kernel} failed (exit {proc.returncode}):\n{proc.stderr[-6000:]}")
            for index, buf in buffers.items():
                if isinstance(buf, np.ndarray):
                    if not buf.flags.c_contiguous:
                        raise EmuError(f"buffer {index} must be C-contiguous to be written back")
                    raw = (Path(tmp) / f"b{index}.bin").read_bytes()
                    buf.reshape(-1).view(np.uint8)[:] = np.frombuffer(raw, dtype=np.uint8)

    def probe(self, name: str, values: list[int], n_out: int) -> list[int]:
        """Evaluate the index probe `name` (see probes/*.cpp) on int64 values."""
        with tempfile.TemporaryDirectory(prefix="emu-probe-") as tmp:
            src, dst = Path(tmp) / "in.bin", Path(tmp) / "out.bin"
            src.write_bytes(np.asarray(values, dtype=np.int64).tobytes())
            proc = subprocess.run(
                [str(self.exe), "probe", name, str(src), str(dst), str(n_out)],
                capture_output=True,
                text=True,
                env=_ENV,
            )
            if proc.returncode != 0:
                raise EmuError(
                    f"probe {name} failed (exit {proc.returncode}):\n{proc.stderr[-6000:]}"
                )
            return [int(v) for v in np.frombuffer(dst.read_bytes(), dtype=np.int64)]


def build(op_or_path: str | Path, probes: Path | None = None) -> Emulated:
    """Compile csrc/metal/<op>.metal (or a given .metal path) for the emulation, cached."""
    path = Path(op_or_path)
    metal = path if path.suffix == ".metal" else METAL_DIR / f"{op_or_path}.metal"
    if probes is None:
        candidate = HERE / "probes" / f"{metal.stem}_probes.cpp"
        probes = candidate if candidate.exists() else None
    source, kernels = prepass.translate(metal, [METAL_DIR, metal.parent], probes, CXX)
    # Keyed by the expanded source (every #include resolved) minus its line
    # markers, so the same kernel text built from another path is reused.
    expanded = re.sub(r'(?m)^# \d+ ".*$', "", source)
    key = _digest(expanded.encode(), *(_emu_sources()), probes.read_bytes() if probes else b"")
    out_dir = CACHE / f"{metal.stem}-{key}"
    exe = out_dir / "emu"
    if exe.exists():
        return Emulated(exe, kernels)
    tmp_dir = Path(tempfile.mkdtemp(prefix=f"{metal.stem}-", dir=_ensure(CACHE)))
    try:
        cpp = tmp_dir / f"{metal.stem}.emu.cpp"
        cpp.write_text(source)
        proc = subprocess.run(
            [CXX, *CXXFLAGS, str(cpp), "-o", str(tmp_dir / "emu")], capture_output=True, text=True
        )
        if proc.returncode != 0:
            raise EmuError(
                f"compiling {metal.name} for the emulation failed:\n{proc.stderr[-8000:]}"
            )
        try:
            tmp_dir.rename(out_dir)  # atomic publish; a concurrent build may have won
        except OSError:
            shutil.rmtree(tmp_dir, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise
    return Emulated(exe, kernels)


def _ensure(p: Path) -> Path:
    p.mkdir(parents=True, exist_ok=True)
    return p


# ------------------------------------------------------------- dispatch.h
_GEOMETRY_SRC = r"""
%INCLUDES%
using namespace opforge::metal;
static void put(const Dispatch& d, unsigned* out) {
  for (int i = 0; i < 3; ++i) { out[i] = d.groups[i]; out[3 + i] = d.threads[i]; }
}
extern "C" {
int emu_dispatch_1d(unsigned long long n, unsigned max_threads, unsigned* out) {
  try { put(dispatch_1d(n, max_threads), out); return 0; } catch (...) { return 1; }
}
int emu_dispatch_nms_mask(long long n, unsigned* out) {
  try { put(dispatch_nms_mask(n), out); return 0; } catch (...) { return 1; }
}
int emu_dispatch_nms_reduce(unsigned max_threads, unsigned* out) {
  put(dispatch_nms_reduce(max_threads), out); return 0;
}
long long emu_nms_col_blocks(long long n) { return nms_col_blocks(n); }
long long emu_deform_im2col_items(const OpfDeformParams* p) { return deform_im2col_items(*p); }
long long emu_deform_col2im_items(const OpfDeformParams* p) { return deform_col2im_items(*p); }
long long emu_deform_coord_items(const OpfDeformParams* p) { return deform_coord_items(*p); }
%SIZEOFS%
}
"""

_STRUCT = re.compile(r"struct\s+(Opf\w+Params)\s*\{(?P<body>[^}]*)\};", re.S)
_FIELD = re.compile(r"^\s*(int64_t|int32_t|uint32_t|float)\s+(\w+)\s*;", re.M)
_CTYPES = {
    "int64_t": ctypes.c_int64,
    "int32_t": ctypes.c_int32,
    "uint32_t": ctypes.c_uint32,
    "float": ctypes.c_float,
}
_DEFINE = re.compile(r"^#define\s+(OPF_\w+)\s+(\d+)\b", re.M)


class Geometry:
    """dispatch.h and the op headers as seen from Python: the host geometry
    functions (compiled from the headers themselves), the buffer-binding and
    tiling constants, and the parameter structs as ctypes types checked against
    the C++ sizeof."""

    def __init__(self) -> None:
        text = "\n".join(h.read_text() for h in _metal_headers())
        self.constants = {name: int(v) for name, v in _DEFINE.findall(text)}
        self.structs: dict[str, type[ctypes.Structure]] = {}
        for m in _STRUCT.finditer(text):
            fields = [(n, _CTYPES[t]) for t, n in _FIELD.findall(m["body"])]
            self.structs[m[1]] = type(m[1], (ctypes.Structure,), {"_fields_": fields})
        self._lib = self._compile(text)
        for name, struct in self.structs.items():
            native = getattr(self._lib, f"emu_sizeof_{name}")()
            if native != ctypes.sizeof(struct):
                raise EmuError(
                    f"{name}: C++ sizeof {native} != parsed layout {ctypes.sizeof(struct)}"
                )

    def _compile(self, text: str) -> ctypes.CDLL:
        sizeofs = "\n".join(
            f"long long emu_sizeof_{n}() {{ return sizeof({n}); }}" for n in self.structs
        )
        includes = "\n".join(f'#include "{h.name}"' for h in _metal_headers())
        src = _GEOMETRY_SRC.replace("%SIZEOFS%", sizeofs).replace("%INCLUDES%", includes)
        key = _digest(text.encode(), src.encode(), _compiler_id().encode())
        lib = _ensure(CACHE) / f"geometry-{key}.so"
        if not lib.exists():
            tmp = Path(tempfile.mkdtemp(dir=CACHE))
            (tmp / "g.cpp").write_text(src)
            proc = subprocess.run(
                [
                    CXX,
                    "-std=c++17",
                    "-O1",
                    "-shared",
                    "-fPIC",
                    "-I",
                    str(METAL_DIR),
                    str(tmp / "g.cpp"),
                    "-o",
                    str(tmp / "g.so"),
                ],
                capture_output=True,
                text=True,
            )
            if proc.returncode != 0:
                raise EmuError(f"compiling the csrc/metal headers failed:\n{proc.stderr}")
            os.replace(tmp / "g.so", lib)
            shutil.rmtree(tmp, ignore_errors=True)
        cdll = ctypes.CDLL(str(lib))
        for fn in (
            "emu_nms_col_blocks",
            "emu_deform_im2col_items",
            "emu_deform_col2im_items",
            "emu_deform_coord_items",
        ):
            getattr(cdll, fn).restype = ctypes.c_longlong
        cdll.emu_nms_col_blocks.argtypes = [ctypes.c_longlong]
        for n in self.structs:
            getattr(cdll, f"emu_sizeof_{n}").restype = ctypes.c_longlong
        return cdll

    @staticmethod
    def _result(rc: int, out) -> Dispatch:
        if rc != 0:
            raise EmuError("dispatch.h refused the problem size")
        return Dispatch(tuple(out[:3]), tuple(out[3:]))

    def dispatch_1d(self, work_items: int, pipeline_max_threads: int = 1024) -> Dispatch:
        out = (ctypes.c_uint * 6)()
        return self._result(
            self._lib.emu_dispatch_1d(
                ctypes.c_ulonglong(work_items), ctypes.c_uint(pipeline_max_threads), out
            ),
            out,
        )

    def dispatch_nms_mask(self, num_boxes: int) -> Dispatch:
        out = (ctypes.c_uint * 6)()
        return self._result(self._lib.emu_dispatch_nms_mask(ctypes.c_longlong(num_boxes), out), out)

    def dispatch_nms_reduce(self, pipeline_max_threads: int = 1024) -> Dispatch:
        out = (ctypes.c_uint * 6)()
        return self._result(
            self._lib.emu_dispatch_nms_reduce(ctypes.c_uint(pipeline_max_threads), out), out
        )

    def nms_col_blocks(self, n: int) -> int:
        return self._lib.emu_nms_col_blocks(n)

    def deform_items(self, kind: str, params: ctypes.Structure) -> int:
        return getattr(self._lib, f"emu_deform_{kind}_items")(ctypes.byref(params))

    def params(self, struct: str, **fields) -> ctypes.Structure:
        cls = self.structs[struct]
        known = {f for f, _ in cls._fields_}
        unknown = set(fields) - known
        if unknown:
            raise EmuError(f"{struct} has no field(s) {sorted(unknown)}")
        return cls(**fields)

    def buffer(self, name: str) -> int:
        return self.constants[name]


def params_bytes(p: ctypes.Structure) -> bytes:
    return ctypes.string_at(ctypes.addressof(p), ctypes.sizeof(p))


# ------------------------------------ the MPS host code (csrc/mps), emulated
MPS_DIR = EXTENSION / "csrc" / "mps"
CSRC = EXTENSION / "csrc"


def _torch_build_flags() -> tuple[list[str], list[str]]:
    import torch
    from torch.utils import cpp_extension

    cflags = [f"-isystem{p}" for p in cpp_extension.include_paths()]
    cflags.append(f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}")
    lib_dir = Path(torch.__file__).parent / "lib"
    ldflags = [f"-L{lib_dir}", f"-Wl,-rpath,{lib_dir}", "-lc10", "-ltorch_cpu", "-ltorch"]
    return cflags, ldflags


def _load_embed():
    import importlib.util

    spec = importlib.util.spec_from_file_location("opforge_metal_embed", METAL_DIR / "embed.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The stable MPS wheel's floor: torch_mps_set_arg_bytes is new in torch 2.14's shim.
STABLE_MPS_FLOOR = (2, 14)
SHIM_DECLARATIONS = """#include <torch/csrc/inductor/aoti_torch/c/shim_mps.h>
// torch < 2.14 headers: the one shim function the stable MPS host needs that they lack
extern "C" AOTITorchError torch_mps_set_arg_bytes(AOTIMetalKernelFunctionHandle func,
                                                  unsigned idx, const void* ptr, uint64_t size);
"""


def _torch_version() -> tuple[int, int]:
    import torch

    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def _host_units(stable: bool, metal_files: list[Path], host_files: list[Path]) -> dict[str, str]:
    tables = [re.sub(r"\W", "_", p.stem) for p in metal_files]
    units = {
        f"kernels_{t}.cpp": prepass.translate(p, [METAL_DIR], None, CXX, library=True)[0]
        for t, p in zip(tables, metal_files)
    }
    units["runtime.cpp"] = (
        f"#define OPF_EMU_TABLES(X) {' '.join(f'X({t})' for t in tables)}\n"
        f'#include "{HERE / "emu_runtime.h"}"\n'
    )
    if stable:
        # one translation unit per op, as the wheel compiles them
        units["shim_emu.cpp"] = f'#include "{HERE / "shim_emu.h"}"\n'
        units.update({f"host_{p.stem}.cpp": f'#include "{p}"\n' for p in host_files})
    else:
        units["host.cpp"] = "\n".join(f'#include "{p}"' for p in host_files) + "\n"
    return units


def _host_flags(stable: bool, tmp: Path) -> list[str]:
    if not stable:
        return ["-DOPFORGE_MPS_EMULATED"]
    # the stable MPS wheel's flags (extension/setup.py), at its floor where the torch at hand
    # has it; older headers get the declaration of torch_mps_set_arg_bytes from the test
    version = min(_torch_version(), STABLE_MPS_FLOOR)
    flags = [
        "-DOPFORGE_STABLE_ABI",
        "-DTORCH_STABLE_ONLY",
        f"-DTORCH_TARGET_VERSION=0x{version[0]:02x}{version[1]:02x}000000000000",
        "-DUSE_MPS",
        "-DOPFORGE_MPS_EMULATED",
    ]
    if _torch_version() < STABLE_MPS_FLOOR:
        (tmp / "shim_declarations.h").write_text(SHIM_DECLARATIONS)
        flags += ["-include", str(tmp / "shim_declarations.h")]
    return flags


def _build_host(stable: bool) -> Path:
    import torch

    metal_files = sorted(METAL_DIR.glob("*.metal"))
    host_files = sorted(MPS_DIR.glob("*_kernel.cpp"))
    units = _host_units(stable, metal_files, host_files)
    cflags, ldflags = _torch_build_flags()
    inputs = [u.encode() for u in units.values()]
    inputs += [p.read_bytes() for p in host_files + [MPS_DIR / "metal_host.h"]]
    inputs += [p.read_bytes() for p in sorted(CSRC.glob("*.h"))]  # common.h, abi*.h
    inputs += [p.read_bytes() for p in metal_files] + _emu_sources()
    inputs += [(HERE / "shim_emu.h").read_bytes(), b"stable" if stable else b"legacy"]
    key = _digest(*inputs, torch.__version__.encode(), " ".join(cflags).encode())
    name = "mps-shim-host" if stable else "mps-host"
    lib = _ensure(CACHE) / f"{name}-{key}" / f"libopforge_{name.replace('-', '_')}_emulated.so"
    if lib.exists():
        return lib
    # xdist workers meeting this build at once (the metal_shim_emu tests run on any worker)
    # take turns: one compiles, the others wait for its library instead of compiling it too
    with build_lock(CACHE / f"{name}-{key}.lock"):
        if lib.exists():
            return lib
        tmp = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=CACHE))
        try:
            _load_embed().generate(metal_files, tmp / "generated", metallib="never")
            torch_flags = ["-x", "c++", *cflags, *_host_flags(stable, tmp)]

            def compile_unit(unit: str, text: str) -> str:
                (tmp / unit).write_text(text)
                # the kernels and the runtime need no torch: one object serves both host builds
                shared = unit.startswith(("kernels_", "runtime"))
                flags = ["-Wno-attributes"] if shared else torch_flags
                cmd = [CXX, "-std=c++20", "-O1", "-fPIC", "-pthread", "-c", *flags]
                obj = tmp / f"{unit}.o"
                if shared:
                    obj = _ensure(CACHE / "objects") / f"{unit}-{_digest(text.encode(), ' '.join(cmd).encode(), _compiler_id().encode())}.o"
                    if obj.exists():
                        return str(obj)
                out = tmp / f"{unit}.o"
                cmd += [f"-I{tmp / 'generated'}", f"-I{CSRC}", str(tmp / unit), "-o", str(out)]
                proc = subprocess.run(cmd, capture_output=True, text=True)
                if proc.returncode != 0:
                    raise EmuError(f"compiling {unit} of the emulated {name} failed:\n{proc.stderr[-8000:]}")
                if shared:
                    shutil.copyfile(out, tmp / f"{unit}.o.part")
                    os.replace(tmp / f"{unit}.o.part", obj)  # atomic publish
                return str(obj)

            with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
                objects = [f.result() for f in [pool.submit(compile_unit, n, t) for n, t in units.items()]]
            link = subprocess.run(
                [CXX, "-shared", "-pthread", *objects, "-o", str(tmp / lib.name), *ldflags],
                capture_output=True,
                text=True,
            )
            if link.returncode != 0:
                raise EmuError(f"linking the emulated {name} failed:\n{link.stderr[-8000:]}")
            try:
                tmp.rename(lib.parent)
            except OSError:
                shutil.rmtree(tmp, ignore_errors=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return lib


def build_host_library() -> Path:
    """csrc/mps/*_kernel.cpp, legacy ABI, built with OPFORGE_MPS_EMULATED into one library.

    Loaded with torch.ops.load_library, it registers opforge_emu::<op> on the
    CPU key: the very host code the Mac runs (checks, parameter structs,
    strides, chunking, ATen GEMMs, crossover), with every Metal dispatch run by
    the emulation.  No sanitizers here: the library lives inside Python.
    """
    return _build_host(stable=False)


def build_shim_host_library() -> Path:
    """csrc/mps/*_kernel.cpp as the stable-ABI MPS wheel builds them (torch's C shim only),
    linked with shim_emu.h, the emulated MPS shim: registers opforge_shim_emu::<op> on the CPU
    key, every shim call and Metal dispatch emulated."""
    return _build_host(stable=True)


HOST_NAMESPACE = "opforge_emu"
SHIM_HOST_NAMESPACE = "opforge_shim_emu"
_HOST_LIBRARIES: dict = {}


def _load(namespace: str, build) -> object:
    import torch

    if namespace not in _HOST_LIBRARIES:
        library = torch.library.Library(namespace, "FRAGMENT")
        for schema in torch._C._jit_get_all_schemas():
            if schema.name.startswith("opforge::"):
                library.define(str(schema).split("::", 1)[1])
        torch.ops.load_library(str(build()))
        _HOST_LIBRARIES[namespace] = library  # a Library unregisters its ops when collected
    return getattr(torch.ops, namespace)


def load_host():
    """torch.ops.opforge_emu: the legacy host code (build_host_library) registered under the
    schemas of the built extension's torch.ops.opforge, every Metal dispatch emulated."""
    return _load(HOST_NAMESPACE, build_host_library)


def load_shim_host():
    """torch.ops.opforge_shim_emu: the stable-ABI host code on the emulated shim
    (build_shim_host_library), under the schemas of torch.ops.opforge."""
    return _load(SHIM_HOST_NAMESPACE, build_shim_host_library)
