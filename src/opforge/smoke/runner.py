"""Run the smoke probe where users run: a fresh environment, a user's install, a new interpreter.

``prepare_environment`` makes the environment (or takes ``--python``), ``run_probe`` ships the
probe package there as one zip archive, runs it from a scratch directory outside the source
tree and returns its JSON document;
``opforge.smoke.report`` turns that document into a table, JUnit XML, a step summary and an
exit code.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import Version

from opforge import bytecode
from opforge.errors import OpforgeError, UsageError
from opforge.platforms import backend_of
from opforge.smoke.archive import probe_archive
from opforge.smoke.live import run_with_progress
from opforge.smoke.probe import crashes
from opforge.smoke.probe.causes import add_cause, crash_cause
from opforge.torchsource import pip_index_args
from opforge.venv import installer
from opforge.wheels import inspect_wheel

# what the build record of an installed package says, read by the probe's own reader
FACTS_SOURCE = Path(__file__).with_name("probe") / "facts.py"
# The probe imports torch and compiles a few ops; anything slower than this is hung.
PROBE_TIMEOUT_S = 900
# A probe killed by a call (probe/crashes.py) runs again without it, for at most this many calls.
MAX_CRASHES = 8
# Variables that would let the checkout or a user's site leak into a fresh environment.
_LEAKY_ENV = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONSAFEPATH", "VIRTUAL_ENV")
# ...and that would send a fresh environment's bytecode elsewhere, or nowhere: opforge keeps
# it for the next fresh environment (opforge.bytecode)
_BYTECODE_ENV = ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")


@dataclass(frozen=True)
class ProbeRequest:
    """What the probe checks: which package and namespace, which ops with which keys.

    ``op_keys`` maps each declared op to the keys it must have; ``default_keys`` applies to the
    ops found when none is declared. These are the promises of the one variant under test
    (``Matrix.promises``), or of the command line's options: the probe only checks them.
    """

    package: str
    namespace: str
    op_keys: dict[str, tuple[str, ...]] = field(default_factory=dict)
    backward_ops: tuple[str, ...] = ()
    default_keys: tuple[str, ...] = ()
    device_checks: str = "auto"
    recipes: Path | None = None
    # the speed check: {"enabled": bool, "factor": x, "op_factors": {op: x}, "devices": [...]}
    speed: dict = field(default_factory=dict)
    # the compiled modules the variant promises: [{name, backend, load, functions}]
    modules: tuple[dict, ...] = ()
    # op -> the devices it has no kernel for by design (matrix.yaml: no_kernel)
    no_kernel: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def promises(self) -> bool:
        return bool(self.op_keys or self.default_keys)

    def promising(self, promises) -> ProbeRequest:
        """This request with ``promises`` (a ``opforge.matrix.Promises``) to check."""
        modules = tuple({"name": m.name, "backend": m.backend, "load": m.load,
                         "functions": list(m.functions)} for m in promises.modules)
        return replace(self, op_keys=dict(promises.op_keys),
                       backward_ops=tuple(promises.backward_ops),
                       default_keys=tuple(promises.default_keys), modules=modules,
                       no_kernel=dict(promises.no_kernel))

    def spec(self) -> dict:
        return {"op_keys": {op: list(keys) for op, keys in self.op_keys.items()},
                "backward_ops": list(self.backward_ops),
                "default_keys": list(self.default_keys),
                "recipes": str(self.recipes.resolve()) if self.recipes else None,
                "speed": self.speed, "modules": list(self.modules),
                "no_kernel": {op: list(d) for op, d in self.no_kernel.items()}}

    def argv(self, out: Path, spec_path: Path) -> list[str]:
        return ["--package", self.package, "--namespace", self.namespace,
                "--spec", str(spec_path), "--device-checks", self.device_checks,
                "--out", str(out)]


@dataclass(frozen=True)
class Target:
    """Where the probe runs: a wheel or requirement in a fresh env, or an existing interpreter."""

    wheel: Path | None = None
    requirement: str | None = None
    python: Path | None = None
    torch_spec: str | None = None      # install this torch beside the wheel (--no-deps wheel)
    torch_index: str | None = None     # resolved index (None: pip's default)
    variant_torch: str | None = None   # the variant's torch, installed before the wheel
    env_dir: Path | None = None        # where to create the env; default: a temporary dir

    def describe(self) -> str:
        if self.python:
            return f"existing interpreter {self.python}"
        what = self.wheel.name if self.wheel else self.requirement
        extra = f" beside {self.torch_spec or self.variant_torch}" \
            if self.torch_spec or self.variant_torch else ""
        return f"fresh environment with {what}{extra}"


@dataclass
class Environment:
    python: Path
    fresh: bool
    env_dir: Path | None = None
    timings: dict[str, float] = field(default_factory=dict)
    installs: list[str] = field(default_factory=list)
    torch_installed: str | None = None
    installer: str | None = None   # "uv" or "pip": what made the fresh environment
    subject: str | None = None     # the wheel's distribution: its bytecode is not kept
    temporary: bool = False        # made in the temporary directory (no --env-dir)


def _pip_args(index: str | None) -> list[str]:
    return pip_index_args(index)


def prepare_environment(target: Target) -> Environment:
    """Create the environment and install the target the way a user would."""
    if target.python is not None:
        python = Path(target.python)
        if not python.exists():
            raise UsageError(f"--python {python}: no such interpreter")
        return Environment(python=python, fresh=False)
    if target.wheel is not None and not target.wheel.is_file():
        raise UsageError(f"--wheel {target.wheel}: no such file")
    if target.env_dir is not None and target.env_dir.exists() and any(target.env_dir.iterdir()):
        raise UsageError(f"--env-dir {target.env_dir} exists and is not empty: remove it or "
                         "choose another directory")
    made = target.env_dir is None or not target.env_dir.exists()
    env_dir = target.env_dir or Path(tempfile.mkdtemp(prefix="opforge-smoke-env-"))
    try:
        env = _install(target, env_dir)
        env.temporary = target.env_dir is None
        return env
    except BaseException:
        # never leave half an environment: a folder we made goes, an empty one is emptied
        # again (so the same command can run once the cause is fixed)
        if made:
            shutil.rmtree(env_dir, ignore_errors=True)
        else:
            for child in env_dir.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink(missing_ok=True)
        raise


def _install(target: Target, env_dir: Path) -> Environment:
    tool = installer()
    env = Environment(python=Path(), fresh=True, env_dir=env_dir, installer=tool.name)
    t0 = time.monotonic()
    env.python = tool.create(env_dir)
    env.timings["create_env_s"] = round(time.monotonic() - t0, 2)
    index = _pip_args(target.torch_index)
    subject = str(target.wheel.resolve()) if target.wheel else target.requirement
    t0 = time.monotonic()
    # env.installs says each step as the pip command a user would type
    if target.torch_spec:
        # The wheel pins its torch; to pair it with another one, torch first, then the wheel
        # without its dependencies (what a user who forces a torch upgrade ends up with).
        env.installs.append(f"pip install {target.torch_spec} {' '.join(index)}".strip())
        tool.install(env.python, target.torch_spec, *index)
        env.installs.append(f"pip install --no-deps {subject}")
        tool.install(env.python, "--no-deps", subject)
    else:
        if target.variant_torch:
            # the variant's torch first, from the variant's index: the resolver cannot then
            # substitute another build (a CUDA torch for the cpu variant, a newer release)
            env.installs.append(f"pip install {target.variant_torch} {' '.join(index)}".strip())
            tool.install(env.python, target.variant_torch, *index)
        env.installs.append(f"pip install {subject} {' '.join(index)}".strip())
        tool.install(env.python, subject, *index)
    env.timings["install_s"] = round(time.monotonic() - t0, 2)
    env.torch_installed = installed_version(env.python, "torch", env_dir)
    env.subject = target.wheel.name.split("-")[0] if target.wheel else None
    env.timings["bytecode_linked"] = bytecode.restore(env_dir, exclude=env.subject)
    return env


def installed_version(python: Path, distribution: str,
                      env_dir: Path | None = None) -> str | None:
    """The version of ``distribution`` in ``python``'s environment (None: not installed);
    a fresh ``env_dir``'s own site-packages is read from here, without starting
    ``python``."""
    site = bytecode.site_packages(env_dir) if env_dir is not None else None
    if site is not None:
        found = next(iter(importlib.metadata.distributions(name=distribution,
                                                           path=[str(site)])), None)
        return found.version if found is not None else None
    code = ("import importlib.metadata as m, sys\n"
            "try: print(m.version(sys.argv[1]))\n"
            "except m.PackageNotFoundError: pass")
    result = subprocess.run([str(python), "-c", code, distribution], capture_output=True,
                            text=True, env=_clean_env(True))
    return result.stdout.strip() or None


def installed_build_record(env: Environment, package: str) -> tuple[dict | None, str | None]:
    """The build record of the distribution that provides ``package`` in ``env``, and that
    distribution's name: read by the probe's own reader, without importing the package."""
    # facts.py is standard library only and imports nothing of the probe's: it runs as it is
    code = FACTS_SOURCE.read_text(encoding="utf-8") + (
        "\nimport sys as _sys\n_facts = read_build_facts(_sys.argv[1])\n"
        "print(json.dumps([_facts.get('build_info'), _facts.get('distribution')]))\n")
    scratch = Path(tempfile.mkdtemp(prefix="opforge-smoke-record-"))
    try:
        result = subprocess.run([str(env.python), "-c", code, package], cwd=scratch,
                                env=_clean_env(env.fresh), capture_output=True, text=True,
                                timeout=120)
        record, distribution = json.loads(result.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError, TypeError):
        return None, None  # the probe then reports what is wrong with the environment
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return (record if isinstance(record, dict) else None,
            distribution if isinstance(distribution, str) else None)


def torch_mismatch(spec: str | None, installed: str | None) -> str | None:
    """Why the installed torch is not the one ``spec`` (the variant's) names, or None."""
    if not spec or not installed:
        return None
    try:
        req = Requirement(spec)
        version = Version(installed)
    except (InvalidRequirement, ValueError):
        return None
    if req.specifier and not req.specifier.contains(Version(version.public), prereleases=True):
        return (f"the environment has torch {installed}, but the variant's torch is {spec}: "
                "the wheel was resolved beside another torch (its torch pin differs from the "
                "matrix, or the index served another build)")
    return None


def _clean_env(fresh: bool) -> dict[str, str]:
    env = dict(os.environ)
    if fresh:
        for name in (*_LEAKY_ENV, *_BYTECODE_ENV):
            env.pop(name, None)
        env["PYTHONNOUSERSITE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _source_roots() -> list[Path]:
    """Directories the probe must not import from: the checkout opforge runs from."""
    here = Path(__file__).resolve().parents[3]
    return [here] if (here / "matrix.yaml").exists() or (here / ".git").exists() else []


def run_probe(env: Environment, request: ProbeRequest, timeout_s: float = PROBE_TIMEOUT_S,
              mode: tuple[str, ...] = (), extra_argv: tuple[str, ...] = (),
              parts: str | None = None) -> dict:
    """Run the probe with a new interpreter in a scratch directory; return its document.

    ``mode`` ``("bench",)`` runs the benchmark instead, with ``extra_argv`` its own options;
    ``parts`` names the step whose progress lines it writes (the bench's rows) while it runs.
    """
    scratch = Path(tempfile.mkdtemp(prefix="opforge-smoke-run-"))
    try:
        probe = probe_archive(scratch / "opforge_smoke_probe.pyz")
        out = scratch / "result.json"
        spec_path = scratch / "spec.json"
        at = scratch / "at.json"
        spec = request.spec()
        if not mode:  # the smoke: a call that kills the interpreter is named, then left out
            spec.update(at=str(at), crashed={})
        cmd = [str(env.python), str(probe), *mode, *request.argv(out, spec_path), *extra_argv]
        t0 = time.monotonic()
        while True:
            spec_path.write_text(json.dumps(spec, indent=1), encoding="utf-8")
            rc, stderr = _run(cmd, scratch, env, out, timeout_s, parts)
            crashed = crashes.read(str(at)) if rc is not None and rc < 0 and not mode else None
            where = crashes.key(crashed["kind"], crashed["name"]) if crashed else None
            if where is None or where in spec["crashed"] or len(spec["crashed"]) >= MAX_CRASHES:
                break
            crashed["signal"] = _signal_name(rc)
            spec["crashed"][where] = crashed
            at.unlink(missing_ok=True)
            out.unlink(missing_ok=True)
        wall = round(time.monotonic() - t0, 2)
        doc = _read_document(out, rc, stderr, request, timeout_s)
        if spec.get("crashed"):
            doc.setdefault("runner", {})["crashed"] = spec["crashed"]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if env.fresh and env.env_dir:
        bytecode.save(env.env_dir, exclude=env.subject)
    runner = doc.setdefault("runner", {})
    runner.update({"python": str(env.python), "fresh_env": env.fresh, "cwd": str(scratch),
                   "probe_wall_s": wall, "installs": env.installs, **env.timings})
    if env.installer:
        runner["installer"] = env.installer
    if env.env_dir:
        runner["env_dir"] = str(env.env_dir)
    _check_not_from_checkout(doc)
    return doc


def _run(cmd: list[str], scratch: Path, env: Environment, out: Path, timeout_s: float,
         parts: str | None = None) -> tuple[int | None, str]:
    """One probe process: its exit status (None: timed out; negative: the signal) and stderr;
    ``parts``: the step whose progress lines it writes (a bench's rows), shown as they come."""
    try:
        if parts is not None:
            return run_with_progress(cmd, scratch, _clean_env(env.fresh), timeout_s, parts)
        proc = subprocess.run(cmd, cwd=scratch, env=_clean_env(env.fresh),
                              capture_output=True, text=True, timeout=timeout_s)
        return proc.returncode, proc.stderr
    except subprocess.TimeoutExpired as exc:
        return None, (exc.stderr or b"").decode(errors="replace") \
            if isinstance(exc.stderr, bytes) else (exc.stderr or "")
    except OSError as exc:
        raise OpforgeError(f"cannot run {env.python}: {exc.strerror}") from None
    except KeyboardInterrupt as exc:  # Ctrl-C, or a stop signal: keep what was finished
        exc.partial_document = _partial(out)
        raise


def _signal_name(rc: int) -> str:
    return signal.Signals(-rc).name if -rc in signal.Signals._value2member_map_ else str(-rc)


def _read_document(out: Path, rc: int | None, stderr: str, request: ProbeRequest,
                   timeout_s: float) -> dict:
    tail = " | ".join(stderr.strip().splitlines()[-3:])
    if out.is_file():
        try:
            doc = json.loads(out.read_text(encoding="utf-8"))
            if doc.get("probe_error"):
                add_check(doc, "probe", "fail",
                           "the probe itself failed: " + doc["probe_error"].strip().splitlines()[-1])
            elif doc.get("complete") is False:  # a bench's last whole report before it stopped
                add_check(doc, "probe", "fail", f"{_why_stopped(rc, request, timeout_s, partial=True)} "
                          f"({len(doc.get('missing') or [])} rows not measured)"
                          f"{': ' + tail if tail else ''}")
            return doc
        except ValueError:
            pass
    why = _why_stopped(rc, request, timeout_s)
    doc = {"schema": 1, "package": request.package, "namespace": request.namespace,
           "checks": [], "environment": {}, "stderr": stderr[-4000:]}
    add_check(doc, "probe", "fail", f"{why}{': ' + tail if tail else ''}")
    _cause_of_crash(doc, stderr)
    return doc


def _cause_of_crash(doc: dict, stderr: str) -> None:
    """What a dying probe printed can name the cause (a C++ exception while loading)."""
    found = crash_cause(stderr)
    if found:
        cls = found.pop("cls")
        add_cause(doc, cls, explains=["probe"], **found)
        summary = doc.setdefault("summary", {})
        summary["fail"] = summary.get("fail", 0) + 1


def _why_stopped(rc: int | None, request: ProbeRequest, timeout_s: float,
                 partial: bool = False) -> str:
    if rc is None:
        why = f"the probe did not finish within {timeout_s:.0f} s (hung import or kernel?)"
    elif rc < 0:
        name = _signal_name(rc)
        why = (f"the interpreter died with {name} while probing: loading {request.package} or "
               f"running one of its ops crashed the process")
    else:
        why = f"the probe exited {rc} without {'finishing' if partial else 'writing'} its report"
    return why


def _partial(out: Path) -> dict | None:
    """The last whole report an interrupted probe wrote (a bench writes one after each row)."""
    try:
        doc = json.loads(out.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def add_check(doc: dict, check_id: str, status: str, message: str, category: str = "probe") -> None:
    doc.setdefault("checks", []).append({"id": check_id, "category": category, "status": status,
                                         "message": message})
    summary = doc.setdefault("summary", {"pass": 0, "fail": 0, "warn": 0, "skip": 0})
    summary[status] = summary.get(status, 0) + 1
    if status == "fail":
        summary["status"] = "fail"


def _check_not_from_checkout(doc: dict) -> None:
    """A smoke run that imported the package from the source tree proves nothing."""
    imported = (doc.get("import") or {}).get("file") or (doc.get("import") or {}).get("package_dir")
    if not imported:
        return
    path = Path(imported).resolve()
    for root in _source_roots():
        if path.is_relative_to(root) and ".venv" not in path.parts and "site-packages" not in path.parts:
            add_check(doc, "import-location", "fail",
                       f"{doc.get('package')} was imported from the source tree ({path}), not "
                       "from the installed wheel")


TRASH_SUFFIX = ".removing"


def cleanup(env: Environment, keep: bool) -> None:
    """Remove the fresh environment. One opforge made in the temporary directory is renamed
    aside at once and removed by a detached process: unlinking torch's 15,000 files took
    2.4 s here, a third of a warm smoke, and nothing the command reports waits for it.
    An --env-dir is removed before the command returns."""
    if not (env.fresh and env.env_dir and not keep):
        return
    if env.temporary:
        trash = env.env_dir.with_name(f".{env.env_dir.name}{TRASH_SUFFIX}")
        try:
            os.rename(env.env_dir, trash)
            subprocess.Popen([sys.executable, "-I", "-S", "-c",
                              "import shutil, sys; shutil.rmtree(sys.argv[1], True)", str(trash)],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
            return
        except OSError:
            if trash.exists():
                shutil.rmtree(trash, ignore_errors=True)
    shutil.rmtree(env.env_dir, ignore_errors=True)


def device_code_cause(doc: dict, wheel: Path, variant) -> None:
    """A cause when the wheel lacks device code the variant's backend promises (for CUDA: a
    cubin or PTX for each arch of its arch_list; ``Backend.missing_device_code``).

    Read from the wheel file (opforge.wheels), not in the probe: the GPU that would fail with
    "no kernel image is available" need not be on this machine.
    """
    backend = backend_of(variant)
    if not backend.checks_device_code:
        return
    try:
        info = inspect_wheel(wheel)
    except OpforgeError:
        return  # an unreadable wheel could not have been installed: its failure is said there
    cause = backend.missing_device_code(info, variant)
    if not cause:
        return
    add_cause(doc, "device_code", cause.pop("title"), cause.pop("evidence"), cause.pop("fix"),
              **cause)
    summary = doc.setdefault("summary", {})
    summary["fail"] = summary.get("fail", 0) + 1
    summary["status"] = "fail"
