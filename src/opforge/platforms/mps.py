"""The MPS backend: macOS arm64 wheels with Metal kernels, built with Xcode's toolchain.

Validation keeps it on macos-* platforms; the build gets FORCE_MPS=1 and the variant's
MACOSX_DEPLOYMENT_TARGET, and torch answers torch.backends.mps.is_available() True (hosted
macOS runners have no usable Metal device); the wheel must carry Metal shaders and a
macosx_*_arm64 tag. Not buildable on this Linux host: its build is exercised on the macOS
runner in CI.
"""

from __future__ import annotations

import shutil

from opforge.errors import OpforgeError
from opforge.platforms import toolchain
from opforge.platforms.base import Backend, BuildEnv, deployment_target


class MpsBackend(Backend):
    name = "mps"
    device = "mps"
    device_code = "mps"
    code_markers = (b"/Metal.framework/", b"MTLCreateSystemDefaultDevice",
                    b"newLibraryWithSource", b"newLibraryWithData", b"kernel void ")
    oses = ("macos",)
    toolchain_mode = "mps"
    variables = ("FORCE_MPS", "MACOSX_DEPLOYMENT_TARGET")
    flag_field = "mps"
    option_fields = ("macos_deployment_target",)
    dispatch_words = ("MPS",)

    def foreign_key(self, variant: str, key: str, backend: str) -> str:
        return f"variant {variant!r} expects MPS kernels but does not set mps: true"

    def wrong_platform(self, variant: str, plat: str) -> str:
        return f"MPS variant {variant!r} cannot target {plat} (MPS needs macOS)"

    # variant_properties: none, the null variant: the platform tag (macOS arm64 at the
    # deployment target) already selects a Mac whose GPU runs the Metal kernels

    def describe(self, variant) -> str:
        target = variant.option("macos_deployment_target", "the SDK's default")
        return (f"{variant.name}: CPU + MPS (Metal) kernels, macOS {target} and newer "
                f"({', '.join(variant.platforms)})")

    def kernels(self, variant) -> str:
        return "MPS (Metal)"

    def record_fields(self, variant) -> dict:
        return {**super().record_fields(variant), "mps": True}

    def build_env(self, variant, env, site_dir) -> BuildEnv:
        given, unset = toolchain.environment("mps", None, site_dir)
        return BuildEnv(deployment_target(variant, given), unset)

    def check_host(self, variant, host, env, where) -> None:
        if host != "macos-arm64":
            raise OpforgeError(f"{variant.build_session} needs macOS on Apple silicon with "
                               f"Xcode command-line tools (this host is {host}); {where}")
        if shutil.which("xcrun", path=env.get("PATH")) is None:
            raise OpforgeError(f"{variant.build_session} needs Xcode command-line tools "
                               f"(xcrun not found: run xcode-select --install); {where}")

    def check_wheel(self, report, variant, info) -> list[str]:
        problems = super().check_wheel(report, variant, info)
        compiled = report.libraries
        if not (report.metal_sources or report.metallibs
                or any(lib.embedded_metal for lib in compiled)):
            problems.append("no Metal shaders (sources, metallib or embedded source) in the wheel")
        tags = " ".join(report.tags)
        if "macosx" not in tags or "arm64" not in tags:
            problems.append(f"MPS wheel has platform tags {tags}, expected macosx_*_arm64")
        return problems


BACKEND = MpsBackend()
