"""Build opforge-ops: the torch.ops.opforge C++ extension.

What is built is chosen explicitly, never guessed from the build host:

  OPFORGE_BACKEND       cpu | cuda | mps: what is compiled (default: cuda with FORCE_CUDA=1, mps with
                        FORCE_MPS=1, else cpu). opforge build passes it from the variant's backend;
                        this file keeps no list of variants
  OPFORGE_VARIANT       the variant's name, recorded only (opforge stamps it into the build record)
  OPFORGE_ABI           legacy (default: ATen/torch::Library, one wheel per torch and Python)
                        | stable (LibTorch stable ABI + CPython limited API: one abi3 wheel that
                        loads on every torch from the floor up)
  OPFORGE_TORCH_FLOOR   stable only: the oldest torch the wheel supports, "2.N" (default and
                        minimum 2.10, the first torch whose shim has what the kernels call;
                        2.14 with FORCE_MPS=1: torch_mps_set_arg_bytes);
                        compiled in as TORCH_TARGET_VERSION, so a shim function newer than the
                        floor does not compile
  FORCE_CUDA=1          compile csrc/cuda (fails if CUDA cannot be compiled)
  FORCE_MPS=1           compile csrc/mps/*_kernel.cpp + csrc/metal/*.metal (macOS only): as
                        Objective-C++ on Metal (legacy), or plain C++ on torch's MPS C shim
                        (stable)
  TORCH_CUDA_ARCH_LIST  e.g. "8.0;9.0" (read by torch.utils.cpp_extension)
  OPFORGE_OMIT_KERNELS  fault injection: "roi_align:cpu,nms:cuda" leaves those kernel files out
                        (this extension's own switch: opforge build --build-env passes it)
  MAX_JOBS              parallel compile jobs (read by torch.utils.cpp_extension)

`opforge build` sets these and stamps the wheel afterwards (local version +<variant>, the torch
pin, the build record in the .dist-info that opforge_ops.build_info() reads): this file writes
none of that itself.
"""

import importlib.util
import os
import platform
import sys
from pathlib import Path

import torch
from setuptools import setup
from torch.utils import cpp_extension

ROOT = Path(__file__).resolve().parent
CSRC = ROOT / "csrc"
BASE_VERSION = "0.1.0"
# what this extension has kernels for (csrc/cpu, csrc/cuda, csrc/mps)
BACKENDS = ("cpu", "cuda", "mps")
ABIS = ("legacy", "stable")
# The stable kernels call torch_parallel_for, torch_call_dispatcher, torch_library_impl and the
# typed data pointers of torch::stable::Tensor, all new in torch 2.10's shim. The CUDA kernels
# add aoti_torch_get_current_cuda_stream and aoti_torch_create/delete_device_guard, which torch
# 2.9's shim already has: the floor is the same with or without CUDA.
MIN_STABLE_FLOOR = (2, 10)
# The stable MPS host (csrc/mps/metal_host.h) binds each kernel's parameter struct with
# torch_mps_set_arg_bytes, new in torch 2.14's shim; the rest of the MPS shim is 2.10's.
MIN_STABLE_MPS_FLOOR = (2, 14)
# abi3 wheels are tagged for the oldest CPython pyproject.toml allows.
LIMITED_API_TAG = "cp310"
# Backend folder -> the kernel file name pattern inside it (used by OPFORGE_OMIT_KERNELS).
KERNEL_FILES = {
    "cpu": "cpu/{op}_kernel.cpp",
    "quantized": "quantized/cpu/{op}_kernel.cpp",
    "autocast": "autocast/{op}_kernel.cpp",
    "autograd": "autograd/{op}_kernel.cpp",
    "cuda": "cuda/{op}_kernel.cpp",  # with its device code, cuda/{op}_device.cu
    "mps": "mps/{op}_kernel.cpp",
}


class BuildConfigError(SystemExit):
    def __init__(self, message):
        super().__init__(f"opforge-ops build: error: {message}")


def env_flag(name):
    value = os.environ.get(name, "").strip()
    if value not in ("", "0", "1"):
        raise BuildConfigError(f"{name} must be 0 or 1, got {value!r}")
    return value == "1"


def parse_omitted_kernels(text):
    """'roi_align:cpu,nms:cuda' -> [('roi_align', 'cpu'), ('nms', 'cuda')], each checked to exist."""
    omitted = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        op, sep, backend = item.partition(":")
        if not sep or backend not in KERNEL_FILES:
            raise BuildConfigError(
                f"OPFORGE_OMIT_KERNELS entry {item!r} must look like op:backend with backend "
                f"one of {', '.join(KERNEL_FILES)}"
            )
        path = CSRC / KERNEL_FILES[backend].format(op=op)
        if not path.exists():
            raise BuildConfigError(
                f"OPFORGE_OMIT_KERNELS names {item!r}, but {path.relative_to(ROOT)} does not exist"
            )
        omitted.append((op, backend))
    return omitted


def parse_torch_floor(text):
    """'2.10' -> (2, 10), checked against what the stable kernels need and the torch at hand."""
    major, dot, minor = text.partition(".")
    if not (dot and major.isdigit() and minor.isdigit()):
        raise BuildConfigError(f"OPFORGE_TORCH_FLOOR must look like 2.N (e.g. 2.10), got {text!r}")
    floor = (int(major), int(minor))
    if floor < MIN_STABLE_FLOOR:
        raise BuildConfigError(
            f"OPFORGE_TORCH_FLOOR={text} is below {MIN_STABLE_FLOOR[0]}.{MIN_STABLE_FLOOR[1]}, the first "
            "torch whose stable C shim has torch_parallel_for and torch_call_dispatcher, which the "
            "kernels call"
        )
    building = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
    if floor > building:
        raise BuildConfigError(
            f"OPFORGE_TORCH_FLOOR={text} is newer than the torch being built against "
            f"({torch.__version__}): build against torch {text} or newer"
        )
    return floor


def kernel_sources(folder, pattern, omitted):
    skip = {CSRC / KERNEL_FILES[b].format(op=op) for op, b in omitted}
    skip |= {CSRC / "cuda" / f"{op}_device.cu" for op, b in omitted if b == "cuda"}
    return [p for p in sorted((CSRC / folder).glob(pattern)) if p not in skip]


def cuda_include_dirs():
    # torch's CUDA headers include cusparse.h and friends, which pip ships in nvidia/cu13.
    dirs = []
    for entry in map(Path, sys.path):
        candidate = entry / "nvidia" / "cu13" / "include"
        if candidate.is_dir() and str(candidate) not in dirs:
            dirs.append(str(candidate))
    return dirs


def embed_metal_sources(out_dir, metallib="auto"):
    """csrc/metal/<op>.metal -> <out_dir>/opforge_metal/<op>.h (csrc/metal/embed.py); returns
    (include dir, whether metallibs were embedded)."""
    spec = importlib.util.spec_from_file_location(
        "opforge_metal_embed", CSRC / "metal" / "embed.py"
    )
    embed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(embed)
    try:
        info = embed.generate(sorted((CSRC / "metal").glob("*.metal")), out_dir, metallib)
    except embed.EmbedError as exc:
        raise BuildConfigError(f"embedding the Metal kernels failed: {exc}") from None
    return out_dir, info["metallib"]


class BuildConfig:
    """Everything the environment asks for, validated once."""

    def __init__(self):
        self.abi = os.environ.get("OPFORGE_ABI", "legacy").strip() or "legacy"
        if self.abi not in ABIS:
            raise BuildConfigError(f"OPFORGE_ABI must be one of {', '.join(ABIS)}, got {self.abi!r}")
        self.stable = self.abi == "stable"
        floor_text = os.environ.get("OPFORGE_TORCH_FLOOR", "").strip()
        if floor_text and not self.stable:
            raise BuildConfigError(
                f"OPFORGE_TORCH_FLOOR={floor_text} with OPFORGE_ABI={self.abi}: a torch floor is a "
                "stable-ABI wheel's; set OPFORGE_ABI=stable (opforge build does for a variant with "
                "abi: stable), a legacy wheel runs on exactly the torch it was built against"
            )
        force_cuda, force_mps = env_flag("FORCE_CUDA"), env_flag("FORCE_MPS")
        if force_cuda and force_mps:
            raise BuildConfigError("FORCE_CUDA=1 and FORCE_MPS=1 cannot be combined in one wheel")
        implied = "cuda" if force_cuda else "mps" if force_mps else "cpu"
        self.backend = os.environ.get("OPFORGE_BACKEND", "").strip() or implied
        if self.backend not in BACKENDS:
            raise BuildConfigError(
                f"OPFORGE_BACKEND={self.backend}: this extension has kernels for "
                f"{', '.join(BACKENDS)} only"
            )
        if implied != "cpu" and implied != self.backend:
            raise BuildConfigError(
                f"OPFORGE_BACKEND={self.backend} with FORCE_{implied.upper()}=1: one wheel holds "
                "one backend's kernels"
            )
        self.cuda = self.backend == "cuda"
        self.mps = self.backend == "mps"
        least = MIN_STABLE_MPS_FLOOR if self.mps else MIN_STABLE_FLOOR
        self.floor = parse_torch_floor(floor_text or "{}.{}".format(*least)) if self.stable else None
        if self.stable and self.mps and self.floor < MIN_STABLE_MPS_FLOOR:
            raise BuildConfigError(
                f"OPFORGE_TORCH_FLOOR={floor_text} with FORCE_MPS=1: the stable MPS kernels need torch "
                "{}.{} or newer (they bind their parameters with torch_mps_set_arg_bytes, new in torch "
                "2.14's shim); set OPFORGE_TORCH_FLOOR=2.14".format(*MIN_STABLE_MPS_FLOOR)
            )
        self.metallib = False
        self.omitted = parse_omitted_kernels(os.environ.get("OPFORGE_OMIT_KERNELS", ""))
        if self.cuda:
            if cpp_extension.CUDA_HOME is None:
                raise BuildConfigError(
                    "FORCE_CUDA=1 but no CUDA toolkit was found: set CUDA_HOME (e.g. /usr/local/cuda-13.0)"
                )
            if torch.version.cuda is None:
                raise BuildConfigError(
                    f"FORCE_CUDA=1 but the torch being built against ({torch.__version__}) is a CPU-only build"
                )
        if self.mps and sys.platform != "darwin":
            raise BuildConfigError(
                f"FORCE_MPS=1 needs macOS with Xcode's Metal toolchain; this host is {platform.system()}. "
                "In CI the MPS wheel is built on the macOS runner."
            )

    def sources(self):
        omitted = self.omitted
        sources = [CSRC / "module.cpp", *sorted((CSRC / "ops").glob("*.cpp"))]
        sources += kernel_sources("cpu", "*_kernel.cpp", omitted)
        if not self.stable:
            # The stable ABI has no quantized tensors and no C++ autograd or autocast API:
            # opforge_ops registers Autograd and Autocast from Python there.
            sources += kernel_sources("quantized/cpu", "*_kernel.cpp", omitted)
            sources += kernel_sources("autograd", "*_kernel.cpp", omitted)
            sources += kernel_sources("autocast", "*_kernel.cpp", omitted)
        # an op's CUDA host code (<op>_kernel.cpp) and its device code (<op>_device.cu, which
        # nvcc parses once per arch and so includes no ATen: csrc/cuda/launch.h)
        self.cuda_sources = (kernel_sources("cuda", "*_kernel.cpp", omitted)
                             + kernel_sources("cuda", "*_device.cu", omitted)) if self.cuda else []
        self.mps_sources = kernel_sources("mps", "*_kernel.cpp", omitted) if self.mps else []
        if self.cuda and not self.cuda_sources:
            raise BuildConfigError("FORCE_CUDA=1 but csrc/cuda holds no kernels to compile")
        if self.mps and not self.mps_sources:
            raise BuildConfigError("FORCE_MPS=1 but csrc/mps holds no *_kernel.cpp to compile")
        return [str(p.relative_to(ROOT)) for p in sources + self.cuda_sources + self.mps_sources]

    def extension(self):
        sources = self.sources()
        # -g0: no debug info; it doubles compile time on the 2-core CI machines.
        cxx = ["-O3", "-g0"]
        nvcc = ["-O3", "-Xptxas", "-v"]
        define_macros = []
        include_dirs = [str(CSRC)]
        extra_link_args = []
        if self.stable:
            # TORCH_TARGET_VERSION makes every shim function newer than the floor a compile
            # error, and TORCH_STABLE_ONLY any non-stable torch header.
            major, minor = self.floor
            define_macros += [
                ("OPFORGE_STABLE_ABI", None),
                ("TORCH_STABLE_ONLY", None),
                ("TORCH_TARGET_VERSION", f"0x{major:02x}{minor:02x}000000000000"),
            ]
        elif sys.platform.startswith("linux"):
            # at::parallel_for is inlined OpenMP: without -fopenmp it runs serially.
            # libgomp.so.1 resolves to the copy torch has already loaded.
            cxx.append("-fopenmp")
            extra_link_args.append("-fopenmp")
        if self.cuda:
            define_macros.append(("WITH_CUDA", None))
            if self.stable:
                # the shim declares its CUDA functions (aoti_torch_get_current_cuda_stream) under it
                define_macros.append(("USE_CUDA", None))
            include_dirs += cuda_include_dirs()
        if self.mps and self.stable:
            # torch's MPS C shim only (USE_MPS declares torch_mps_set_arg_bytes); the shim
            # compiles Metal source, so no metallib is built
            define_macros += [("WITH_MPS", None), ("USE_MPS", None)]
            metal_include, self.metallib = embed_metal_sources(
                ROOT / "build" / "metal_generated", metallib="never"
            )
            include_dirs.append(str(metal_include))
        elif self.mps:
            define_macros.append(("WITH_MPS", None))
            cxx.append("-ObjC++")
            metal_include, self.metallib = embed_metal_sources(ROOT / "build" / "metal_generated")
            include_dirs.append(str(metal_include))
            extra_link_args += ["-framework", "Metal", "-framework", "Foundation"]
        kind = cpp_extension.CUDAExtension if self.cuda else cpp_extension.CppExtension
        extra_compile_args = {"cxx": cxx, "nvcc": nvcc} if self.cuda else {"cxx": cxx}
        return kind(
            name="opforge_ops._C",
            sources=sources,
            include_dirs=include_dirs,
            define_macros=define_macros,
            extra_compile_args=extra_compile_args,
            extra_link_args=extra_link_args,
            # Py_LIMITED_API (cpp_extension defines it) and no libtorch_python
            py_limited_api=self.stable,
        )


CONFIG = BuildConfig()
EXTENSION = CONFIG.extension()


setup(
    version=BASE_VERSION,
    packages=["opforge_ops", "opforge_ops.ops"],
    ext_modules=[EXTENSION],
    cmdclass={"build_ext": cpp_extension.BuildExtension.with_options(use_ninja=True)},
    options={"bdist_wheel": {"py_limited_api": LIMITED_API_TAG}} if CONFIG.stable else {},
)
