"""Run one cell of a workflow's jobs here, step by step, the way a GitHub runner would.

``run:`` steps run exactly as written: the step's text with ``${{ }}`` substituted, in
``bash --noprofile --norc -eo pipefail``, with the variables a runner sets (GITHUB_OUTPUT,
GITHUB_STEP_SUMMARY, GITHUB_ENV, GITHUB_PATH, RUNNER_TEMP, ...) pointing at local files.
The few actions the jobs use are emulated:

* ``actions/checkout``: the working tree's files (``git ls-files -co --exclude-standard``) are
  synced into the job's workspace. A workspace given as ``persistent`` keeps what the job left
  there (like a self-hosted runner with ``clean: false``), so a second build reuses its cache;
* ``actions/setup-python``: a fresh virtual environment of this interpreter's Python, put first
  on PATH (its ``cache:`` is pip's own cache, already on this machine);
* ``actions/upload-artifact`` / ``download-artifact``: files copied into, and out of, a
  directory that stands for the run's artifact store;
* ``actions/cache``: the runner's own disk (a self-hosted runner): the paths keep what the
  last run left, so the compiler cache is this machine's (``opforge build``'s default).

A job that calls a reusable workflow of this repository (``uses: ./.github/workflows/x.yml``)
is followed with ``Runner.call(job_id)``: a runner for the called workflow, given the caller's
``with:`` (rendered in the caller's context) over the called workflow's input defaults, with
the same artifact store and ``github`` context (as on GitHub, where the called workflow runs in
the caller's run). Any other action fails the run: teach this module about it rather than
skip it.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opforge.workflows.expressions import condition, render, to_str
from opforge.workflows.workflow import Workflow, action_name, load_yaml


class EmulationError(AssertionError):
    """The workflow did something the emulated runner cannot do, or a step failed."""


@dataclass
class StepResult:
    name: str
    outcome: str            # success | failure | skipped
    seconds: float = 0.0
    command: str = ""
    output: str = ""
    summary: str = ""


@dataclass
class JobResult:
    job: str
    status: str = "success"
    steps: list[StepResult] = field(default_factory=list)
    outputs: dict[str, str] = field(default_factory=dict)

    def step(self, name: str) -> StepResult:
        for step in self.steps:
            if step.name == name:
                return step
        raise KeyError(f"{self.job} has no step {name!r}: {[s.name for s in self.steps]}")


def load_workflow(path: Path) -> Workflow:
    return Workflow(path, path.name, path.read_text(), load_yaml(path.read_text()))


def sync_checkout(source: Path, workspace: Path) -> None:
    """actions/checkout: make ``workspace`` hold ``source``'s working tree (mtimes of unchanged
    files kept, so a persistent workspace's build cache stays valid)."""
    listed = subprocess.run(["git", "-C", str(source), "ls-files", "-co", "--exclude-standard",
                             "-z"], capture_output=True, text=True, check=True).stdout
    files = sorted({f for f in listed.split("\0") if f and (source / f).is_file()})
    workspace.mkdir(parents=True, exist_ok=True)
    manifest = workspace / ".emulated-checkout"
    previous = set(manifest.read_text().splitlines()) if manifest.exists() else set()
    for rel in previous - set(files):
        (workspace / rel).unlink(missing_ok=True)
    for rel in files:
        src, dst = source / rel, workspace / rel
        if dst.exists() and dst.stat().st_size == src.stat().st_size and \
                dst.read_bytes() == src.read_bytes():
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
    manifest.write_text("\n".join(files))


class Runner:
    """Runs jobs of one workflow for one cell, sharing an artifact store between them."""

    def __init__(self, workflow: Workflow, source: Path, scratch: Path,
                 extra_env: dict[str, str] | None = None, event: str = "push",
                 inputs: dict[str, Any] | None = None):
        self.wf, self.source, self.scratch = workflow, source, scratch
        self.inputs = dict(inputs or {})
        self.artifacts = scratch / "artifacts"
        self.artifacts.mkdir(parents=True, exist_ok=True)
        self.extra_env = dict(extra_env or {})
        self.event = event
        self.results: dict[str, JobResult] = {}
        sha = subprocess.run(["git", "-C", str(source), "rev-parse", "HEAD"],
                             capture_output=True, text=True).stdout.strip()
        self.github = {"event_name": event, "workflow": str(workflow.data.get("name", "")),
                       "run_id": str(int(time.time())), "run_attempt": "1",
                       "sha": sha or "0" * 40, "ref": "refs/heads/main", "event": {},
                       "repository": "local/opforge", "server_url": "https://github.com"}

    # ----------------------------------------------------------------------------- jobs

    def call(self, job_id: str) -> Runner:
        """The runner of the reusable workflow that job ``job_id`` calls, with its inputs."""
        job = self.wf.jobs[job_id]
        uses = str(job.get("uses", ""))
        if not uses.startswith("./.github/workflows/"):
            raise EmulationError(f"{job_id}: calls {uses or 'nothing'}; only a reusable workflow "
                                 "of this repository (./.github/workflows/...) can be followed")
        called = load_workflow(self.source / uses[2:])
        on = called.data.get("on") or {}
        declared = ((on.get("workflow_call") or {}) if isinstance(on, dict) else {}).get(
            "inputs") or {}
        ctx = self._ctx(None, {}, {}, dict(self.wf.data.get("env") or {}))
        given = {k: render(v, ctx) for k, v in (job.get("with") or {}).items()}
        unknown = sorted(set(given) - set(declared))
        if unknown:
            raise EmulationError(f"{job_id} passes {unknown}, which {uses} does not declare")
        inputs = {}
        for name, spec in declared.items():
            value = given.get(name, spec.get("default"))
            if value is None and spec.get("required"):
                raise EmulationError(f"{job_id} does not pass {uses}'s required input {name!r}")
            inputs[name] = value if spec.get("type") in ("boolean", "number") else \
                to_str(value if value is not None else "")
        runner = Runner(called, self.source, self.scratch, self.extra_env, self.event, inputs)
        runner.artifacts, runner.github = self.artifacts, self.github
        return runner

    def run_job(self, job_id: str, cell: dict[str, Any] | None = None,
                workspace: Path | None = None, timeout: float | None = None) -> JobResult:
        job = self.wf.jobs[job_id]
        if "uses" in job:
            raise EmulationError(f"{job_id} calls {job['uses']}: follow it with call({job_id!r})")
        if job.get("container") and render(job["container"], self._ctx(cell, {}, {})):
            raise EmulationError(f"{job_id} runs in a container for this cell; the emulator "
                                 "runs container-free cells only")
        home = self.scratch / f"job-{job_id}"
        workspace = workspace or home / "workspace"
        temp = home / "runner-temp"
        shutil.rmtree(temp, ignore_errors=True)
        temp.mkdir(parents=True)
        result = JobResult(job_id)
        needs = {n: {"result": self.results[n].status, "outputs": self.results[n].outputs}
                 for n in _needs(job)}
        if not condition(job.get("if"), {**self._ctx(cell, needs, {}), "matrix": {}}):
            result.status = "skipped"
            self.results[job_id] = result
            return result
        env = {**_clean_environ(), **self.extra_env, "CI": "true", "GITHUB_ACTIONS": "true",
               "GITHUB_WORKSPACE": str(workspace), "GITHUB_EVENT_NAME": self.event,
               "GITHUB_SHA": self.github["sha"], "GITHUB_RUN_ID": self.github["run_id"],
               "GITHUB_JOB": job_id, "RUNNER_OS": "Linux", "RUNNER_ARCH": "X64",
               "RUNNER_TEMP": str(temp)}
        steps_ctx: dict[str, Any] = {}
        deadline = time.monotonic() + (timeout or 60 * float(job.get("timeout-minutes", 360)))
        # workflow- and job-level env: rendered once, in order, like the runner does
        for scope in (self.wf.data.get("env"), job.get("env")):
            for key, value in (scope or {}).items():
                env[key] = to_str(render(value, self._ctx(cell, needs, steps_ctx, env)))
        env.update(self.extra_env)  # the local differences win over what the workflow sets
        for index, step in enumerate(job.get("steps") or []):
            name = str(step.get("name") or step.get("id") or step.get("uses")
                       or str(step.get("run", "")).strip().splitlines()[0])
            ctx = {**self._ctx(cell, needs, steps_ctx, env), "__status__": result.status}
            if not condition(step.get("if"), ctx):
                result.steps.append(StepResult(name, "skipped"))
                continue
            step_env = dict(env)
            for key, value in (step.get("env") or {}).items():
                step_env[key] = to_str(render(value, {**ctx, "env": step_env}))
            started = time.monotonic()
            if "uses" in step:
                outcome, command, output = self._action(step, ctx, workspace, step_env, env)
                summary, outputs = "", {}
            else:
                outcome, command, output, summary, outputs = self._run(
                    step, ctx, workspace, temp, step_env, env, index,
                    max(1.0, deadline - time.monotonic()))
            if step.get("id"):
                steps_ctx[str(step["id"])] = {"outputs": outputs, "outcome": outcome,
                                              "conclusion": outcome}
            result.steps.append(StepResult(name, outcome, time.monotonic() - started, command,
                                           output, summary))
            if outcome == "failure":
                result.status = "failure"
        final = self._ctx(cell, needs, steps_ctx, env)
        result.outputs = {k: to_str(render(v, final)) for k, v in (job.get("outputs") or {}).items()}
        self.results[job_id] = result
        return result

    def _ctx(self, cell: dict[str, Any] | None, needs: dict[str, Any], steps: dict[str, Any],
             env: dict[str, str] | None = None) -> dict[str, Any]:
        env = env or {}
        return {"matrix": cell or {}, "needs": needs, "steps": steps, "env": env,
                "github": {**self.github, "workspace": env.get("GITHUB_WORKSPACE", "")},
                "runner": {"os": "Linux", "arch": "X64", "temp": env.get("RUNNER_TEMP", "")},
                "inputs": self.inputs, "vars": {}, "secrets": {}, "strategy": {"fail-fast": False},
                "job": {"status": "success"},
                "__hashfiles__": lambda *patterns: "local"}

    # ----------------------------------------------------------------------------- run: steps

    def _run(self, step: dict, ctx: dict, workspace: Path, temp: Path, env: dict[str, str],
             job_env: dict[str, str], index: int, timeout: float):
        script = to_str(render(str(step["run"]), ctx))
        files = {name: temp / f"{name.lower()}-{index}" for name in
                 ("GITHUB_OUTPUT", "GITHUB_STEP_SUMMARY", "GITHUB_ENV", "GITHUB_PATH")}
        for path in files.values():
            path.write_text("")
        path_file = temp / f"step-{index}.sh"
        path_file.write_text(script + "\n")
        env = {**env, **{name: str(path) for name, path in files.items()}}
        shell = step.get("shell") or (self.wf.data.get("defaults") or {}).get("run", {}).get(
            "shell", "bash")
        if shell != "bash":
            raise EmulationError(f"step {step!r}: only bash steps are emulated")
        try:
            proc = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail",
                                   str(path_file)], cwd=workspace, env=env, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  timeout=timeout)
            outcome, output = ("success" if proc.returncode == 0 else "failure"), proc.stdout
        except subprocess.TimeoutExpired as exc:
            outcome, output = "failure", f"timed out after {timeout:.0f}s\n{exc.stdout or ''}"
        # what a step hands on: outputs, env and PATH for the later steps
        for key, value in _key_values(files["GITHUB_ENV"].read_text()).items():
            job_env[key] = value
        for line in files["GITHUB_PATH"].read_text().splitlines():
            if line.strip():
                job_env["PATH"] = f"{line.strip()}{os.pathsep}{job_env['PATH']}"
        outputs = _key_values(files["GITHUB_OUTPUT"].read_text())
        return outcome, script.strip(), output, files["GITHUB_STEP_SUMMARY"].read_text(), outputs

    # ----------------------------------------------------------------------------- actions

    def _action(self, step: dict, ctx: dict, workspace: Path, env: dict[str, str],
                job_env: dict[str, str]):
        action = action_name(step["uses"])
        args = {k: to_str(render(v, ctx)) for k, v in (step.get("with") or {}).items()}
        if action == "actions/checkout":
            sync_checkout(self.source, workspace)
            return "success", f"checkout {self.source} -> {workspace}", ""
        if action == "actions/setup-python":
            return self._setup_python(args, workspace.parent, job_env)
        if action == "actions/upload-artifact":
            return self._upload(args, workspace)
        if action == "actions/download-artifact":
            return self._download(args, workspace)
        if action == "actions/cache":
            return self._cache(args)
        raise EmulationError(f"{step['uses']}: not an action this emulator knows; add it to "
                             f"{Path(__file__).name}")

    def _cache(self, args: dict[str, str]):
        """A persistent runner's disk: the cached paths hold what the last run left (nothing
        is copied in or out); a step without a key or a path fails, as on GitHub."""
        paths = [line.strip() for line in args.get("path", "").splitlines() if line.strip()]
        if not args.get("key") or not paths:
            return "failure", "cache", "actions/cache needs `key` and `path`"
        kept = [p for p in paths if Path(os.path.expanduser(p)).exists()]
        return "success", f"cache {args['key']}", \
            f"the runner's disk keeps {', '.join(kept) or 'none of ' + ', '.join(paths)}"

    def _setup_python(self, args: dict[str, str], home: Path, job_env: dict[str, str]):
        want = args.get("python-version", "")
        have = f"{sys.version_info[0]}.{sys.version_info[1]}"
        if want != have:
            raise EmulationError(f"setup-python {want!r}: this emulator runs Python {have} only")
        env_dir = home / "setup-python"
        shutil.rmtree(env_dir, ignore_errors=True)
        base = getattr(sys, "_base_executable", sys.executable)
        proc = subprocess.run([base, "-m", "venv", str(env_dir)], capture_output=True, text=True)
        if proc.returncode != 0:
            return "failure", f"python -m venv {env_dir}", proc.stderr
        job_env["PATH"] = f"{env_dir / 'bin'}{os.pathsep}{job_env['PATH']}"
        return "success", f"fresh Python {have} at {env_dir}", ""

    def _upload(self, args: dict[str, str], workspace: Path):
        name = args["name"]
        matched = [Path(p) for line in args.get("path", "").splitlines() if line.strip()
                   for p in glob.glob(str(workspace / line.strip()), recursive=True)]
        files = [p for p in matched if p.is_file()] + \
            [f for p in matched if p.is_dir() for f in p.rglob("*") if f.is_file()]
        if not files:
            if args.get("if-no-files-found", "warn") == "error":
                return "failure", f"upload {name}", f"no files match {args.get('path')!r}"
            return "success", f"upload {name}", "no files: nothing uploaded"
        store = self.artifacts / name
        if store.exists():
            return "failure", f"upload {name}", f"artifact {name!r} already exists in this run"
        base = Path(os.path.commonpath([str(p.parent) for p in files]))
        for f in files:
            dst = store / f.relative_to(base)
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, dst)
        return "success", f"upload {name}", "\n".join(str(f.relative_to(base)) for f in files)

    def _download(self, args: dict[str, str], workspace: Path):
        name = args["name"]
        store = self.artifacts / name
        if not store.is_dir():
            return "failure", f"download {name}", f"no artifact {name!r} in this run"
        target = workspace / args.get("path", ".")
        shutil.copytree(store, target, dirs_exist_ok=True)
        files = sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file())
        return "success", f"download {name} -> {target}", "\n".join(files)


def _clean_environ() -> dict[str, str]:
    """This process's environment minus what a fresh runner would not have: an active
    virtual environment, PYTHONPATH, and virtual environments' bin directories on PATH."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "CONDA_PREFIX")
           and not k.startswith(("GITHUB_", "RUNNER_", "NOX_", "PYTEST_"))}
    path = [p for p in env.get("PATH", "").split(os.pathsep)
            if p and not (Path(p).parent / "pyvenv.cfg").exists()]
    env["PATH"] = os.pathsep.join(path)
    return env


def _needs(job: dict) -> list[str]:
    needs = job.get("needs") or []
    return [needs] if isinstance(needs, str) else list(needs)


def _key_values(text: str) -> dict[str, str]:
    """GITHUB_OUTPUT / GITHUB_ENV syntax: ``k=v`` lines and ``k<<EOF ... EOF`` blocks."""
    out, lines = {}, iter(text.splitlines())
    for line in lines:
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            key, marker = line.split("<<", 1)
            body = []
            for inner in lines:
                if inner == marker:
                    break
                body.append(inner)
            out[key] = "\n".join(body)
        elif "=" in line:
            key, value = line.split("=", 1)
            out[key] = value
    return out


def select_cell(matrix_output: str, name: str) -> dict[str, Any]:
    cells = json.loads(matrix_output)["include"]
    for cell in cells:
        if cell["name"] == name:
            return cell
    raise EmulationError(f"no cell {name!r} in the matrix job's output: "
                         f"{[c['name'] for c in cells]}")


