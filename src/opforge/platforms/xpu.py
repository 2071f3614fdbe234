"""The XPU backend: Intel GPU wheels with SYCL kernels, built by the oneAPI DPC++ compiler.

matrix.yaml: ``backend: xpu``, ``toolkit: "2025.1"`` (the oneAPI compiler release),
``arch_list: "pvc;bmg"`` (ahead-of-time targets, passed as TORCH_XPU_ARCH_LIST, which
torch.utils.cpp_extension's SyclExtension reads). The build gets that compiler's bin (icpx)
first on PATH, CMPLR_ROOT and ONEAPI_ROOT, no CUDA variable, and torch.xpu.is_available()
True. The wheel must hold SYCL device code. Linux and Windows, as torch's XPU wheels.

Written to the interface and unit-tested (validation, build environment, host check,
description) against fake oneAPI trees; no XPU runner has built a wheel with it yet.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from opforge.errors import OpforgeError
from opforge.platforms import toolchain
from opforge.platforms.base import Backend, BuildEnv, VariantFields, split_arch_list

_VERSION = re.compile(r"20\d\d\.\d+\Z")
_TARGET = re.compile(r"[a-z][a-z0-9]*(-[a-z0-9]+)*\Z")  # pvc, bmg, lnl-m, dg2-g10, ...
XPU_VARIABLES = ("TORCH_XPU_ARCH_LIST", "CMPLR_ROOT", "ONEAPI_ROOT")
# the SYCL / Level Zero runtime torch's XPU wheels bring (never vendored into ours)
XPU_LIBRARIES = ("libsycl.so*", "libur_loader.so*", "libur_adapter_*.so*", "libze_loader.so*",
                 "libOpenCL.so*", "libsvml.so", "libimf.so", "libintlc.so*", "libirng.so",
                 "libumf.so*", "libtcm*.so*", "libmkl_*.so*", "libccl.so*")


def compiler_version(root: Path) -> str | None:
    """'2025.1' for a compiler tree (<oneapi>/compiler/<release>): icpx --version."""
    try:
        out = subprocess.run([str(root / "bin" / "icpx"), "--version"], capture_output=True,
                             text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"Compiler (\d{4})\.(\d+)", out)
    return f"{match.group(1)}.{match.group(2)}" if match else None


def find_oneapi(env, version: str | None = None) -> list[toolchain.Toolkit]:
    """Every DPC++ compiler the host offers: CMPLR_ROOT, <ONEAPI_ROOT or /opt/intel/oneapi>/
    compiler/<version>, .../compiler/latest."""
    candidates = [(Path(env["CMPLR_ROOT"]), "CMPLR_ROOT")] if env.get("CMPLR_ROOT") else []
    oneapi = Path(env.get("ONEAPI_ROOT") or "/opt/intel/oneapi")
    how = "ONEAPI_ROOT" if env.get("ONEAPI_ROOT") else "/opt/intel/oneapi"
    if version:
        candidates.append((oneapi / "compiler" / version, how))
    candidates.append((oneapi / "compiler" / "latest", how))
    found, seen = [], set()
    for root, found_by in candidates:
        if not (root / "bin" / "icpx").exists() or root.resolve() in seen:
            continue
        seen.add(root.resolve())
        found.append(toolchain.Toolkit(root, compiler_version(root), found_by, compiler="icpx"))
    return found


class XpuBackend(Backend):
    name = "xpu"
    device = "xpu"
    device_code = "xpu"
    # DPC++'s offload wrapper registers a library's SYCL device images by this call
    code_markers = (b"__sycl_register_lib",)
    oses = ("linux", "windows")
    runtime_libraries = XPU_LIBRARIES
    toolchain_mode = "xpu"
    variables = XPU_VARIABLES
    toolkit_variables = ("CMPLR_ROOT", "ONEAPI_ROOT")
    needs_toolkit = True
    takes_arch_list = True
    option_fields = ("arch_list",)
    dispatch_words = ("XPU",)
    torch_attribute = "xpu"

    def torch_matches(self, variant, value: str) -> bool:
        # torch.version.xpu is the SYCL compiler's build date (20250100), not oneAPI's
        # release: any XPU torch builds against the variant's oneAPI
        return True

    def check_variant(self, fields: VariantFields) -> list[tuple[str, str]]:
        if fields.toolkit is not None and not _VERSION.match(fields.toolkit):
            return [("toolkit", f"{fields.toolkit!r} is not a oneAPI compiler release like "
                                "2025.1")]
        return super().check_variant(fields)

    def check_arch_list(self, fields: VariantFields) -> list[str]:
        entries = split_arch_list(fields.arch_list or "")
        if not entries:
            return ["must list at least one ahead-of-time target (e.g. pvc, bmg)"]
        bad = [e for e in entries if not _TARGET.match(e)]
        if bad:
            return [f"{bad[0]!r} is not an XPU target like pvc, bmg or lnl-m"]
        return []

    def describe(self, variant) -> str:
        return (f"{variant.name}: CPU + XPU (SYCL) kernels, oneAPI {variant.toolkit}, for "
                f"{variant.option('arch_list')} ({', '.join(variant.platforms)})")

    def kernels(self, variant) -> str:
        return f"XPU (SYCL) oneAPI {variant.toolkit} ({variant.option('arch_list')})"

    def variant_properties(self, variant) -> list[str]:
        """oneAPI's floor and the ahead-of-time device targets; no provider plugin answers for
        the ``intel`` namespace yet (variant_provider None): ``build --variants`` refuses it."""
        return [f"intel :: oneapi_version_lower_bound :: {variant.toolkit}",
                *(f"intel :: device_arch :: {t}" for t in sorted(split_arch_list(
                    variant.option("arch_list", ""))))]

    def torch_index(self, variant) -> str:
        return "xpu"

    def build_env(self, variant, env, site_dir) -> BuildEnv:
        targets = split_arch_list(variant.option("arch_list", ""))
        given = {toolchain.MODE_VARIABLE: self.toolchain_mode, "PYTHONPATH": str(site_dir),
                 "CUDA_VISIBLE_DEVICES": "", "TORCH_XPU_ARCH_LIST": ",".join(targets)}
        compiler = next((t for t in find_oneapi(env, variant.toolkit)
                         if t.version == variant.toolkit), None)
        if compiler is None:
            return BuildEnv(given, toolchain.CUDA_VARIABLES, None,
                            f"no oneAPI {variant.toolkit} compiler found on this host")
        given["CMPLR_ROOT"] = str(compiler.home)
        given["ONEAPI_ROOT"] = str(compiler.home.parent.parent)
        return BuildEnv(given, toolchain.CUDA_VARIABLES, compiler,
                        f"{compiler.bin} (icpx) first, no nvcc")

    def check_host(self, variant, host, env, where) -> None:
        super().check_host(variant, host, env, where)
        found = find_oneapi(env, variant.toolkit)
        if any(t.version == variant.toolkit for t in found):
            return
        have = "; ".join(f"{t.home} is oneAPI {t.version or 'of unknown version'} "
                         f"({t.found_by})" for t in found) or \
            "no DPC++ compiler found (CMPLR_ROOT, ONEAPI_ROOT, /opt/intel/oneapi)"
        raise OpforgeError(f"{variant.build_session} needs the oneAPI {variant.toolkit} DPC++ "
                           f"compiler (icpx); {have}; source its setvars.sh or set CMPLR_ROOT; "
                           f"{where}")


BACKEND = XpuBackend()
