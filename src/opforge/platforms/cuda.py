"""The CUDA backend: Linux wheels built with exactly the toolkit of the variant's CUDA version.

Validation knows which SM architectures each nvcc accepts; the build gets that toolkit
(CUDA_HOME, CUDACXX, its bin first on PATH, every other nvcc off it) and FORCE_CUDA=1 with
TORCH_CUDA_ARCH_LIST; the wheel must embed a fat binary with exactly those architectures.
"""

from __future__ import annotations

import re

from opforge.platforms import toolchain
from opforge.platforms.base import Backend, BuildEnv, VariantFields, split_arch_list

# SM architectures each nvcc accepts (compute capability "X.Y"); PTX-only or family suffixes
# ("a", "f") are checked separately. CUDA 13 dropped Maxwell, Pascal and Volta (< 7.5).
NVCC_ARCHS = {
    "11.8": ("3.5", "3.7", "5.0", "5.2", "5.3", "6.0", "6.1", "6.2", "7.0", "7.2", "7.5",
             "8.0", "8.6", "8.7", "8.9", "9.0"),
    "12.6": ("5.0", "5.2", "5.3", "6.0", "6.1", "6.2", "7.0", "7.2", "7.5", "8.0", "8.6",
             "8.7", "8.9", "9.0"),
    "12.8": ("5.0", "5.2", "5.3", "6.0", "6.1", "6.2", "7.0", "7.2", "7.5", "8.0", "8.6",
             "8.7", "8.9", "9.0", "10.0", "10.1", "12.0"),
    "12.9": ("5.0", "5.2", "5.3", "6.0", "6.1", "6.2", "7.0", "7.2", "7.5", "8.0", "8.6",
             "8.7", "8.9", "9.0", "10.0", "10.1", "10.3", "12.0", "12.1"),
    "13.0": ("7.5", "8.0", "8.6", "8.7", "8.8", "8.9", "9.0", "10.0", "10.3", "11.0", "12.0",
             "12.1"),
}
ARCH_SUFFIXES = {"9.0": ("a",), "10.0": ("a", "f"), "10.3": ("a", "f"), "11.0": ("a", "f"),
                 "12.0": ("a", "f"), "12.1": ("a", "f"), "10.1": ("a", "f")}
_ARCH = re.compile(r"(\d+\.\d+)([af]?)(\+PTX)?\Z")
# the CUDA runtime libraries torch's CUDA wheels bring (never vendored into ours)
CUDA_LIBRARIES = ("libcudart.so*", "libcuda.so*", "libnvrtc*.so*", "libcublas*.so*",
                  "libcusparse*.so*", "libcufft*.so*", "libcurand*.so*", "libcusolver*.so*",
                  "libnvToolsExt*.so*", "libnvJitLink*.so*", "libcudnn*.so*", "libnccl*.so*",
                  "libcupti*.so*")


def arch_problems(arch_list: str, cuda: str) -> list[str]:
    """What nvcc ``cuda`` would refuse in a TORCH_CUDA_ARCH_LIST (empty: it takes it)."""
    entries = split_arch_list(arch_list)
    if not entries:
        return ["must list at least one architecture"]
    for entry in entries:
        match = _ARCH.match(entry)
        if not match:
            return [f"{entry!r} is not an architecture like 8.0, 9.0a or 12.0+PTX"]
        arch, suffix, _ = match.groups()
        if arch not in NVCC_ARCHS[cuda]:
            return [f"nvcc {cuda} does not accept sm_{arch.replace('.', '')} ({entry}); it "
                    f"accepts {', '.join(NVCC_ARCHS[cuda])}"]
        if suffix and suffix not in ARCH_SUFFIXES.get(arch, ()):
            return [f"{entry!r}: sm_{arch.replace('.', '')} has no '{suffix}' variant"]
    return []


def arch_sort_key(arch: str) -> tuple[int, int]:
    """sm_90 < sm_100 < compute_100 (numeric, SASS before PTX of the same arch)."""
    digits = re.sub(r"\D", "", arch)
    return (int(digits) if digits else 0, 0 if arch.startswith("sm_") else 1)


def expected_archs(arch_list: str) -> tuple[set[str], set[str]]:
    """The SASS (sm_XY) and PTX (compute_XY) a fat binary built for ``arch_list`` holds."""
    sass, ptx = set(), set()
    for entry in split_arch_list(arch_list):
        number = entry.replace("+PTX", "").replace(".", "")
        sass.add(f"sm_{number}")
        if entry.endswith("+PTX"):
            ptx.add(f"compute_{number}")
    return sass, ptx


class CudaBackend(Backend):
    name = "cuda"
    device = "cuda"
    device_code = "cuda"
    # a fat binary's magic, and what nvcc's registration code leaves in the library
    code_markers = (b"\x50\xed\x55\xba", b"__cudaRegisterFatBinary", b"__fatbinwrap",
                    b".nv_fatbin")
    oses = ("linux",)
    runtime_libraries = CUDA_LIBRARIES
    toolchain_mode = "cuda"
    variables = ("FORCE_CUDA", "TORCH_CUDA_ARCH_LIST", "CUDA_VISIBLE_DEVICES",
                 *toolchain.CUDA_VARIABLES)
    toolkit_variables = tuple(v for v in toolchain.CUDA_VARIABLES if v != "FORCE_CUDA")
    toolkit_field = "cuda"
    needs_toolkit = True
    takes_arch_list = True
    option_fields = ("arch_list",)
    dispatch_words = ("CUDA",)
    torch_attribute = "cuda"

    def wrong_platform(self, variant: str, plat: str) -> str:
        return f"CUDA variant {variant!r} cannot target {plat} (CUDA wheels are Linux-only here)"

    def owned_variable(self, name: str, toolkit: str | None) -> str:
        return (f"a CUDA variant builds with the toolkit of its cuda version "
                f"({toolkit}): opforge sets {name} to it")

    def foreign_key(self, variant: str, key: str, backend: str) -> str:
        return f"variant {variant!r} expects {key} kernels but sets no cuda version"

    def check_variant(self, fields: VariantFields) -> list[tuple[str, str]]:
        if fields.toolkit is not None and fields.toolkit not in NVCC_ARCHS:
            return [("cuda", f"unknown CUDA version {fields.toolkit!r} "
                             f"(known: {', '.join(NVCC_ARCHS)})")]
        return super().check_variant(fields)

    def check_arch_list(self, fields: VariantFields) -> list[str]:
        return arch_problems(fields.arch_list or "", fields.toolkit or "")

    def describe(self, variant) -> str:
        return (f"{variant.name}: CPU + CUDA {variant.toolkit} kernels for sm "
                f"{variant.option('arch_list')} ({', '.join(variant.platforms)})")

    def kernels(self, variant) -> str:
        return f"CUDA {variant.toolkit} ({variant.option('arch_list')})"

    def record_fields(self, variant) -> dict:
        return {**super().record_fields(variant), "cuda_version": variant.toolkit,
                "cuda_arch_list": variant.option("arch_list"),
                "cuda_major": variant.toolkit.split(".")[0]}

    def torch_index(self, variant) -> str:
        return f"cu{variant.toolkit.replace('.', '')}"

    # the names nvidia-variant-provider answers for (driver's CUDA, compute capabilities)
    variant_provider = ("nvidia", ("nvidia-variant-provider>=0.0.1,<1.0.0",),
                        "nvidia_variant_provider.plugin:NvidiaVariantPlugin")

    def variant_properties(self, variant) -> list[str]:
        """The driver's CUDA floor (the toolkit's version: a driver that runs its kernels)
        and the architectures embedded, as CMake names them (90_real: SASS, 120_virtual: PTX)."""
        props = [f"nvidia :: cuda_version_lower_bound :: {variant.toolkit}"]
        for entry in split_arch_list(variant.option("arch_list", "")):
            match = _ARCH.match(entry)
            if match is None:
                continue  # the matrix parser refused it already
            arch, suffix, ptx = match.groups()
            number = arch.replace(".", "") + suffix
            props.append(f"nvidia :: sm_arch :: {number}_real")
            if ptx:
                props.append(f"nvidia :: sm_arch :: {number}_virtual")
        return props

    def build_env(self, variant, env, site_dir) -> BuildEnv:
        toolkit = toolchain.variant_toolkit(variant.toolkit, env)
        given, unset = toolchain.environment("cuda", toolkit, site_dir)
        given["FORCE_CUDA"] = "1"  # with no toolkit too: the host check says what is missing
        if variant.option("arch_list"):
            given["TORCH_CUDA_ARCH_LIST"] = variant.option("arch_list")
        if toolkit is None:  # a dry run shows the rest of the plan
            return BuildEnv(given, unset, None,
                            f"no CUDA {variant.toolkit} toolkit found on this host")
        return BuildEnv(given, unset, toolkit, f"{toolkit.bin} first, no other nvcc")

    def check_host(self, variant, host, env, where) -> None:
        super().check_host(variant, host, env, where)
        toolchain.require_toolkit(variant.toolkit, env, variant.build_session, where)

    def check_wheel(self, report, variant, info) -> list[str]:
        problems = super().check_wheel(report, variant, info)
        sass, ptx = expected_archs(variant.option("arch_list", ""))
        found = set(report.cuda_archs)
        if not found:
            problems.append("no CUDA fat binary embedded: the CUDA kernels are missing")
        else:

            missing = sorted((sass | ptx) - found, key=arch_sort_key)
            extra = sorted({a for a in found if a.startswith("sm_")} - sass, key=arch_sort_key)
            if missing:
                problems.append(f"CUDA architectures missing: {', '.join(missing)} "
                                f"(embedded: {', '.join(sorted(found, key=arch_sort_key))})")
            if extra:
                problems.append(f"CUDA architectures not requested: {', '.join(extra)}")
        if info and info.get("cuda_version") and info["cuda_version"] != variant.toolkit:
            problems.append(f"built with CUDA {info['cuda_version']}, expected {variant.toolkit}")
        return problems

    checks_device_code = True

    def missing_device_code(self, report, variant) -> dict | None:
        """The archs (cubin or PTX) the variant's arch_list promises that no library embeds:
        on such a GPU the kernels fail with "no kernel image is available"."""
        arch_list = variant.option("arch_list", "")
        sass, ptx = expected_archs(arch_list)
        found = set(report.cuda_archs)
        missing = sorted((sass | ptx) - found, key=arch_sort_key)
        if not missing:
            return None
        compiled = [lib for lib in report.libraries if not lib.note]
        evidence = [f"{lib.path}: {', '.join(lib.cuda_archs) or 'no CUDA fat binary'}"
                    for lib in compiled][:4]
        name = variant.name
        return {"title": f"the wheel has no device code for {', '.join(missing)}, which variant "
                         f"{name} promises (arch_list {arch_list!r}): on such a GPU its kernels "
                         "fail with \"no kernel image is available for execution on the device\"",
                "evidence": evidence + [f"embedded: "
                                        f"{', '.join(sorted(found, key=arch_sort_key)) or 'none'}"],
                "fix": f"build with TORCH_CUDA_ARCH_LIST=\"{arch_list}\" (opforge build --variant "
                       f"{name} sets it from matrix.yaml); a setup.py that sets its own -gencode "
                       "flags or arch list overrides it",
                "missing": missing, "embedded": sorted(found)}


BACKEND = CudaBackend()
