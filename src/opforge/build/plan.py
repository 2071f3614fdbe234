"""A variant's build plan, made once: the environment and commands its wheel is built with.

The variant is never guessed from the build host: its platform backend (opforge.platforms)
gives the toolchain world (FORCE_CUDA / FORCE_MPS, the arch list, the toolkit, the deployment
target) from matrix.yaml, and a host that cannot build the variant is refused before anything
is installed. The plan is data: ``--dry-run`` prints it, execution (opforge.build.execute) runs
it, and the project's pyproject.toml is read here once.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from opforge import platforms
from opforge.errors import UsageError
from opforge.files import read_text
from opforge.matrix import Matrix, Variant
from opforge.platforms import host_platform, toolchain
from opforge.platforms.base import DELOCATE_EXCLUDES, Step  # noqa: F401  (re-exported)
from opforge.platforms.cuda import CUDA_LIBRARIES
from opforge.platforms.toolchain import Toolkit
from opforge.torchsource import pip_index_args, resolve_index

# Libraries torch's wheel provides: never vendored into our wheel (auditwheel / delocate).
TORCH_LIBRARIES = (*platforms.base.TORCH_LIBRARIES, *CUDA_LIBRARIES)
BUILD_TOOLS = ("setuptools>=69", "wheel", "ninja")
# pyproject.toml without [build-system]: PEP 517's legacy default
LEGACY_BUILD_REQUIRES = ("setuptools>=40.8.0", "wheel")
LEGACY_BUILD_BACKEND = "setuptools.build_meta:__legacy__"
# set from the variant itself: --build-env cannot name them
_OPFORGE_SETS = ("FORCE_MPS", "PATH", "MACOSX_DEPLOYMENT_TARGET", "OPFORGE_TORCH_FLOOR",
                 "TORCH_CUDA_ARCH_LIST", "CUDA_VISIBLE_DEVICES", *toolchain.CUDA_VARIABLES)


@dataclass(frozen=True)
class BuildPlan:
    variant: Variant
    host: str
    extension_dir: Path
    out_dir: Path
    work_dir: Path
    install: tuple[str, ...]      # pip arguments: torch, from the variant's index
    tools: tuple[str, ...]        # pip arguments: build and repair tools, from the default index
    build: Step
    repair: Step | None
    env: dict[str, str]
    extra_env: dict[str, str] = field(default_factory=dict)  # --build-env, recorded as given
    toolkit: Toolkit | None = None  # the variant's accelerator toolkit (None: none, or not found)
    build_backend: str = LEGACY_BUILD_BACKEND  # pyproject.toml's [build-system] build-backend
    path_note: str = "no nvcc"

    @property
    def raw_dir(self) -> Path:
        return self.work_dir / "raw"

    @property
    def stamped_dir(self) -> Path:
        return self.work_dir / "stamped"

    @property
    def repaired_dir(self) -> Path:
        return self.work_dir / "repaired"

    def describe(self) -> str:
        backend = platforms.backend_of(self.variant)
        lines = [f"build plan for variant {self.variant.name} on {self.host}",
                 f"  backend:     {backend.describe(self.variant)}",
                 f"  extension:   {self.extension_dir}",
                 f"  wheel into:  {self.out_dir}",
                 f"  build cache: {self.work_dir}",
                 "  environment:"]
        lines += [f"    {k}={v}" for k, v in sorted(self.env.items())]
        if self.build.unset:
            lines.append("    without: " + " ".join(self.build.unset))
        lines.append("    PATH: " + self.path_note)
        lines.append("  commands:")
        for args in (self.install, self.tools):
            lines.append("    python -m pip install " + " ".join(shlex.quote(a) for a in args))
        lines.append(f"    {self.build.render()}")
        lines.append("      (compiles through sccache when it is installed; "
                     "--no-compiler-cache or OPFORGE_COMPILER_CACHE=off: without)")
        requirement = self.variant.torch_requirement_floor or "torch pin"
        lines.append(f"    opforge stamp: local version +{self.variant.local_version}, "
                     f"{requirement}, build record (.dist-info/opforge-build.json), RECORD")
        if self.repair is not None:
            lines.append(f"    {self.repair.render()}   (platform wheels only)")
        lines.append(f"    move the wheel into {self.out_dir}/ (replacing older wheels)")
        lines.append(f"    opforge inspect <wheel> --expect-variant {self.variant.name}")
        return "\n".join(lines)


def _job_runner(matrix: Matrix, variant: Variant) -> str:
    jobs = matrix.jobs(variant=variant.name)
    runners = sorted({f"{j.runner}" + (f" (container {j.variant.container})"
                                        if j.variant.container else "") for j in jobs})
    return " / ".join(runners)


def check_host(matrix: Matrix, variant: Variant, host: str | None = None,
               env: dict[str, str] | None = None) -> None:
    """Refuse at once, saying what is needed and where the variant runs instead."""
    where = f"it runs on the {_job_runner(matrix, variant)} job in .github/workflows/ci.yml"
    platforms.backend_of(variant).check_host(variant, host or host_platform(),
                                             os.environ if env is None else env, where)


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def parse_build_env(items: list[str] | None) -> dict[str, str]:
    """--build-env NAME=VALUE arguments as a dict (a bad one is a UsageError)."""
    env: dict[str, str] = {}
    for item in items or ():
        name, sep, value = item.partition("=")
        if not sep or not _ENV_NAME.fullmatch(name):
            raise UsageError(f"--build-env takes NAME=VALUE (NAME a variable name), got {item!r}")
        env[name] = value
    return env


def plan_build(matrix: Matrix, variant_name: str, *, out_dir: Path | None = None,
               work_dir: Path | None = None, torch_index: str | None = None,
               torch_spec: str | None = None, extra_env: dict[str, str] | None = None,
               host: str | None = None, max_jobs: int | None = None,
               env: dict[str, str] | None = None) -> BuildPlan:
    variant = matrix.variant(variant_name)
    backend = platforms.backend_of(variant)
    env_in = dict(os.environ if env is None else env)
    root = matrix.path.parent.resolve()
    extension_dir = (root / matrix.extension.path).resolve()
    if not (extension_dir / "setup.py").exists() and not (extension_dir / "pyproject.toml").exists():
        raise UsageError(f"{matrix.path.name}: extension.path {matrix.extension.path!r} has no "
                         "setup.py or pyproject.toml")
    out_dir = Path(out_dir or matrix.dist_dir(variant)).resolve()
    work_dir = Path(work_dir or root / "build" / variant.name).resolve()
    index = resolve_index(matrix.torch_index(variant), torch_index)
    spec = torch_spec or matrix.torch_spec(variant)
    pre = ["--pre"] if matrix.torch.channel == "nightly" else []
    install = (*pre, spec, *pip_index_args(index))
    requires, build_backend = read_pyproject(extension_dir)

    build_env = {
        "OPFORGE_VARIANT": variant.name,
        # what the extension compiles: cpu, cuda, mps, rocm, xpu (a setup.py may read only this)
        "OPFORGE_BACKEND": backend.name,
        # setuptools reads this config: per-variant build dir, so ninja reuses the objects.
        "DIST_EXTRA_CONFIG": str(work_dir / "setup.cfg"),
        # scikit-build-core's build directory, kept per variant for the same reason
        "SKBUILD_BUILD_DIR": str(work_dir / "cmake"),
        "MAX_JOBS": str(max_jobs or env_in.get("MAX_JOBS") or os.cpu_count() or 1),
        # legacy: the C++ API of the torch it builds against; stable: the LibTorch stable ABI
        # (TORCH_STABLE_ONLY, TORCH_TARGET_VERSION = the floor, Py_LIMITED_API, an abi3 tag)
        "OPFORGE_ABI": variant.abi,
    }
    if variant.stable:
        build_env["OPFORGE_TORCH_FLOOR"] = variant.torch_floor or ""
    # the variant's toolchain world (its platform backend): its toolkit or none, torch's answers
    world = backend.build_env(variant, env_in, work_dir / toolchain.SITE_DIR)
    build_env.update(world.given)
    # matrix.yaml may say otherwise (a cpu variant given CUDA_HOME): as written, not taken away
    build_env.update(variant.build_env)
    unset = tuple(name for name in world.unset if name not in build_env)
    extra_env = dict(extra_env or {})
    for name in extra_env:
        if name in build_env or name in (*_OPFORGE_SETS, *backend.variables):
            raise UsageError(f"--build-env {name}: opforge sets {name} from the variant itself")
    build_env.update(extra_env)
    build = Step("compile the extension into a wheel",
                 ("python", "-m", "pip", "wheel", "--no-build-isolation", "--no-deps",
                  "--disable-pip-version-check", "-v", "-w", str(work_dir / "raw"),
                  str(extension_dir)), build_env, unset)
    # the platform the wheel is for: this host when the variant targets it, else the
    # variant's own (a dry run of build_mps on Linux shows the macOS plan)
    host = host or host_platform()
    target = host if host in variant.platforms else variant.platforms[0]
    return BuildPlan(variant=variant, host=target, extension_dir=extension_dir,
                     out_dir=out_dir, work_dir=work_dir, install=install,
                     tools=(*requires, *backend.repair_tools(target)), build=build,
                     repair=backend.repair_step(target, work_dir), env=build_env,
                     extra_env=extra_env, toolkit=world.toolkit, build_backend=build_backend,
                     path_note=world.path_note)


def read_pyproject(extension_dir: Path) -> tuple[tuple[str, ...], str]:
    """(the build tools to install: [build-system] requires, torch left out as the variant's
    is installed; the build-backend), from the project's pyproject.toml read once."""
    pyproject = extension_dir / "pyproject.toml"
    requires: list[str] = list(BUILD_TOOLS)
    backend = LEGACY_BUILD_BACKEND
    if pyproject.is_file():
        # tomllib (~2 ms) when a pyproject.toml is read: build/plan is on the CLI's startup path
        try:
            import tomllib
        except ModuleNotFoundError:  # Python 3.10
            import tomli as tomllib  # type: ignore[no-redef]
        try:
            data = tomllib.loads(read_text(pyproject))
        except tomllib.TOMLDecodeError as exc:
            raise UsageError(f"{pyproject}: not valid TOML: {exc}") from None
        system = data.get("build-system", {})
        declared = system.get("requires", list(LEGACY_BUILD_REQUIRES))
        if not isinstance(declared, list) or not all(isinstance(r, str) for r in declared):
            raise UsageError(f"{pyproject}: [build-system] requires must be a list of strings")
        requires += [r for r in declared if not is_torch(r)]
        backend = system.get("build-backend", backend)
    return tuple(dict.fromkeys(requires)), backend


def build_requires(extension_dir: Path) -> tuple[str, ...]:
    """The project's [build-system] requires (torch left out: the variant's is installed)."""
    return read_pyproject(extension_dir)[0]


def is_torch(requirement: str) -> bool:
    return re.split(r"[\s<>=!~;\[(]", requirement.strip(), maxsplit=1)[0].lower() == "torch"
