"""Build one variant's wheel: a plan made once from the matrix entry (``plan``), then run
(``execute``). The platform-specific parts (toolchain, host check, repair) are the variant's
backend's (opforge.platforms)."""

from opforge.build.execute import (
    _not_info,
    _run,
    backend_requires,
    build_facts,
    build_wheel,
    compile_,
    execute,
    expand,
    finish,
    needs_repair,
    prepare,
    stamp,
    torch_install_hint,
    verify,
)
from opforge.build.plan import (
    BUILD_TOOLS,
    DELOCATE_EXCLUDES,
    LEGACY_BUILD_REQUIRES,
    TORCH_LIBRARIES,
    BuildPlan,
    Step,
    build_requires,
    check_host,
    parse_build_env,
    plan_build,
    read_pyproject,
)
from opforge.platforms import host_platform, toolchain

__all__ = ["BUILD_TOOLS", "DELOCATE_EXCLUDES", "LEGACY_BUILD_REQUIRES", "TORCH_LIBRARIES",
           "BuildPlan", "Step", "_not_info", "_run", "backend_requires", "build_facts",
           "build_requires", "build_wheel", "check_host", "compile_", "execute", "expand",
           "finish", "host_platform", "needs_repair", "parse_build_env", "plan_build",
           "prepare", "read_pyproject", "stamp", "toolchain", "torch_install_hint", "verify"]
