"""The CPU backend: no accelerator toolkit reaches the build, whatever the host holds."""

from __future__ import annotations

from opforge.platforms.base import Backend


class CpuBackend(Backend):
    name = "cpu"
    toolchain_mode = "cpu"

    def describe(self, variant) -> str:
        abi = "stable ABI, torch>=" + str(variant.torch_floor) if variant.stable else \
            "pinned to its build torch"
        return f"{variant.name}: CPU kernels only ({abi}) for {', '.join(variant.platforms)}"


BACKEND = CpuBackend()
