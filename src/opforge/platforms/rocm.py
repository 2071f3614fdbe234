"""The ROCm backend: Linux wheels with HIP kernels, built by hipcc of the variant's ROCm.

matrix.yaml: ``backend: rocm``, ``toolkit: "6.4"`` (the ROCm version), ``arch_list:
"gfx90a;gfx942"`` (``--offload-arch`` targets, passed as PYTORCH_ROCM_ARCH, which
torch.utils.cpp_extension reads). The build gets ROCM_HOME / ROCM_PATH / HIP_PATH of that
ROCm, its bin (hipcc) first on PATH and no nvcc, FORCE_CUDA=1 (a torch ROCm build compiles
CUDAExtension sources through hipify, as torchvision's does) and torch.cuda.is_available()
True (torch's HIP devices are "cuda"). The wheel must hold HIP device code.

Written to the interface and unit-tested (validation, build environment, host check,
description) against fake ROCm trees; no ROCm runner has built a wheel with it yet.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from opforge.errors import OpforgeError
from opforge.platforms import toolchain
from opforge.platforms.base import Backend, BuildEnv, VariantFields, split_arch_list

_VERSION = re.compile(r"\d+\.\d+\Z")
# an --offload-arch target: gfx90a, gfx942, gfx1100, with optional features (gfx90a:xnack+)
_GFX = re.compile(r"gfx[0-9]{2,4}[0-9a-f]?(:(xnack|sramecc)[+-])*\Z")
ROCM_VARIABLES = ("ROCM_HOME", "ROCM_PATH", "HIP_PATH", "HIP_PLATFORM", "PYTORCH_ROCM_ARCH")
# the ROCm runtime torch's ROCm wheels bring (never vendored into ours)
ROCM_LIBRARIES = ("libamdhip64.so*", "libhiprtc*.so*", "libhsa-runtime64.so*",
                  "librocblas.so*", "libhipblas*.so*", "libhipsparse*.so*", "libhipfft*.so*",
                  "libhiprand.so*", "librocrand.so*", "libhipsolver*.so*", "librocsolver.so*",
                  "libMIOpen.so*", "librccl.so*", "libroctx64.so*", "libroctracer64.so*",
                  "librocm_smi64.so*", "libdrm*.so*")


def rocm_version(home: Path) -> str | None:
    """'6.4' for a ROCm tree: its .info/version file, else hipcc --version."""
    info = home / ".info" / "version"
    text = ""
    if info.is_file():
        text = info.read_text(encoding="utf-8", errors="replace")
    elif (home / "bin" / "hipcc").exists():
        try:
            text = subprocess.run([str(home / "bin" / "hipcc"), "--version"],
                                  capture_output=True, text=True, timeout=60).stdout
        except (OSError, subprocess.TimeoutExpired):
            return None
        text = text.split("HIP version:", 1)[-1]
    match = re.search(r"(\d+)\.(\d+)", text)
    return f"{match.group(1)}.{match.group(2)}" if match else None


def find_rocm(env, version: str | None = None) -> list[toolchain.Toolkit]:
    """Every ROCm the host offers: ROCM_HOME, ROCM_PATH, /opt/rocm-<version>*, /opt/rocm."""
    candidates = [(Path(env[name]), name) for name in ("ROCM_HOME", "ROCM_PATH") if env.get(name)]
    if version:
        candidates += [(p, str(p)) for p in sorted(Path("/opt").glob(f"rocm-{version}*"))]
    candidates.append((Path("/opt/rocm"), "/opt/rocm"))
    found, seen = [], set()
    for home, how in candidates:
        if not (home / "bin" / "hipcc").exists() or home.resolve() in seen:
            continue
        seen.add(home.resolve())
        found.append(toolchain.Toolkit(home, rocm_version(home), how, compiler="hipcc"))
    return found


class RocmBackend(Backend):
    name = "rocm"
    device = "cuda"          # torch's ROCm build: HIP devices are "cuda", kernels the CUDA key
    device_code = "hip"
    code_markers = (b"__hipRegisterFatBinary", b"__hip_fatbin")
    oses = ("linux",)
    runtime_libraries = ROCM_LIBRARIES
    toolchain_mode = "rocm"
    variables = ("FORCE_CUDA", *ROCM_VARIABLES)
    toolkit_variables = ROCM_VARIABLES
    needs_toolkit = True
    takes_arch_list = True
    option_fields = ("arch_list",)
    # its kernels register under CUDA (torch's HIP devices are "cuda"); torch's HIP keys too
    dispatch_words = ("CUDA", "HIP")
    torch_attribute = "hip"  # "6.4.43482-0f2d60242": its ROCm release first

    @property
    def title(self) -> str:
        return "ROCm"

    def check_variant(self, fields: VariantFields) -> list[tuple[str, str]]:
        if fields.toolkit is not None and not _VERSION.match(fields.toolkit):
            return [("toolkit", f"{fields.toolkit!r} is not a ROCm version like 6.4")]
        return super().check_variant(fields)

    def check_arch_list(self, fields: VariantFields) -> list[str]:
        entries = split_arch_list(fields.arch_list or "")
        if not entries:
            return ["must list at least one --offload-arch target"]
        bad = [e for e in entries if not _GFX.match(e)]
        if bad:
            return [f"{bad[0]!r} is not an --offload-arch target like gfx90a, gfx942 or "
                    "gfx90a:xnack+"]
        return []

    def describe(self, variant) -> str:
        return (f"{variant.name}: CPU + ROCm {variant.toolkit} HIP kernels for "
                f"{variant.option('arch_list')} ({', '.join(variant.platforms)})")

    def kernels(self, variant) -> str:
        return f"ROCm {variant.toolkit} HIP ({variant.option('arch_list')})"

    def variant_properties(self, variant) -> list[str]:
        """ROCm's floor and the gfx targets built; no provider plugin answers for the ``amd``
        namespace yet (variant_provider None), so ``opforge build --variants`` refuses it."""
        targets = sorted({t.split(":", 1)[0]
                          for t in split_arch_list(variant.option("arch_list", ""))})
        return [f"amd :: rocm_version_lower_bound :: {variant.toolkit}",
                *(f"amd :: gfx_arch :: {t}" for t in targets)]

    def torch_index(self, variant) -> str:
        return f"rocm{variant.toolkit}"

    def build_env(self, variant, env, site_dir) -> BuildEnv:
        targets = split_arch_list(variant.option("arch_list", ""))
        given = {toolchain.MODE_VARIABLE: self.toolchain_mode, "PYTHONPATH": str(site_dir),
                 "FORCE_CUDA": "1", "PYTORCH_ROCM_ARCH": ";".join(targets)}
        unset = tuple(v for v in toolchain.CUDA_VARIABLES if v != "FORCE_CUDA")
        rocm = next((t for t in find_rocm(env, variant.toolkit)
                     if t.version == variant.toolkit), None)
        if rocm is None:
            return BuildEnv(given, unset, None, f"no ROCm {variant.toolkit} found on this host")
        home = str(rocm.home)
        given.update({"ROCM_HOME": home, "ROCM_PATH": home, "HIP_PATH": home,
                      "HIP_PLATFORM": "amd"})
        return BuildEnv(given, unset, rocm, f"{rocm.bin} (hipcc) first, no nvcc")

    def check_host(self, variant, host, env, where) -> None:
        super().check_host(variant, host, env, where)
        found = find_rocm(env, variant.toolkit)
        if any(t.version == variant.toolkit for t in found):
            return
        have = "; ".join(f"{t.home} is ROCm {t.version or 'of unknown version'} ({t.found_by})"
                         for t in found) or "no ROCm found (ROCM_HOME, ROCM_PATH, /opt/rocm)"
        raise OpforgeError(f"{variant.build_session} needs ROCm {variant.toolkit} (hipcc); "
                           f"{have}; set ROCM_HOME to a ROCm {variant.toolkit} tree; {where}")


BACKEND = RocmBackend()
