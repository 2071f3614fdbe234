"""Check a repository's GitHub workflows: drift from matrix.yaml, and CI hygiene.

``opforge workflows check [--root PATH]`` prints one line per problem (``file:line: where:
what``) and exits 1 when there is any, 0 when there is none, 2 when the matrix is malformed.
``check_workflows(root, commands=...)`` returns the same lines (``opforge.cli.commands``
has both with the CLI's own commands filled in). It runs on any repository: one that calls
opforge's reusable workflows (what ``opforge init`` writes), and opforge's own. The rules, each
pinned by a test in tests/workflows/:

* Calls (calls.py): a job that calls a reusable workflow passes only inputs it declares and
  every required one (a local ``./.github/workflows/`` file is read); a workflow of another
  repository is pinned to a 40-hex commit with a ``# vX.Y.Z`` comment; no ``secrets:
  inherit``; outside opforge's repository opforge is installed pinned (``opforge==X.Y.Z``),
  never ``.`` (there it would install the extension).
* One source of truth (cells.py): per-cell jobs take ``strategy.matrix`` from
  ``fromJSON(needs.<job>.outputs.<out>)`` of a job that runs ``opforge matrix --github``, run
  on ``${{ matrix.runner }}`` in ``${{ matrix.container }}`` and set up ``${{ matrix.python }}``;
  a runner label is typed only on a job that runs no cell and must be one matrix.yaml
  declares; container images, CUDA arch lists and the torch index are never typed; every
  ``matrix.<field>`` is one ``opforge matrix --github`` emits. A bisect round's job (a matrix
  job per round) takes ``strategy.matrix`` as ``{<key>: fromJSON(needs.<job>.outputs.<out>)}``
  where ``<out>`` carries the ``probes`` of an ``opforge bisect --plan K`` step, optionally
  with ``include: fromJSON(needs.<matrix job>.outputs.matrix).include`` (the cell: then the
  per-cell rules hold); ``matrix.<key>`` is then the one field beside the cell's.
* Every variant has its path (paths.py; a pipeline: a workflow whose cells run ``opforge
  smoke``, with its default inputs and with each local caller's): the matrix is not filtered,
  and for every cell, on push and on pull_request, a step builds it, a step uploads the cell's
  artifact, a later job that needs the build downloads it on the cell's runner (no container)
  and runs ``opforge smoke --wheel <that download> --variant <the cell's>`` with
  ``--device-checks skip`` exactly where matrix.yaml says ``device_checks: false``. Dispatch
  choice inputs named variant, platform or python list exactly matrix.yaml's (triggers.py).
* ``run:`` steps (runsteps.py, commands.py): ``pip install`` of nox or opforge (or ``.`` in
  opforge's own repository), ``nox -s <a session the noxfile defines>``, ``opforge <command>``
  with arguments its parser accepts; one plain command per line, no shell operators; only
  trusted contexts expanded inside ``run:``.
* Hygiene (hygiene.py): top-level ``permissions`` with nothing above ``read``; no
  ``pull_request_target``/``workflow_run``; ``concurrency`` on ``github.workflow`` with
  ``cancel-in-progress`` (left to the caller in a reusable workflow); ``timeout-minutes`` on
  every job; actions pinned to a 40-hex commit with a ``# vX.Y.Z`` comment;
  ``persist-credentials: false`` on checkout; cache keys built from what the cache depends on.
* Publishing (publishing.py): PyPI uploads by trusted publishing only (``id-token: write`` on
  that job alone, a protected ``environment:``, no token), every published file attested
  first (``actions/attest-build-provenance``), Pages deployed from its environment, write
  scopes only where a step needs them, and a pin of opforge's workflows to the commit its
  named release was cut from.
* In opforge's own repository: the three reusable workflows and their callers (ci.yml,
  nightly.yml, bisect.yml) exist; each reusable workflow's ``opforge`` input defaults to this
  release (``opforge==<version>``); the nightly has a schedule; the nightly and the bisect run
  ``opforge bisect``.

Elsewhere only workflows that use opforge (call its reusable workflows or run ``opforge``)
are checked, unless ``every`` is set.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from opforge import __version__
from opforge.errors import UsageError
from opforge.files import read_bytes
from opforge.workflows.calls import REUSABLE, called_file, check_calls, uses_opforge
from opforge.workflows.cells import check_matrix_use
from opforge.workflows.commands import ScriptError, classify, commands
from opforge.workflows.hygiene import check_hygiene
from opforge.workflows.paths import check_variant_paths, runs_smoke
from opforge.workflows.project import load_project
from opforge.workflows.publishing import (
    check_publishing,
    check_release_pins,
    check_variant_files,
)
from opforge.workflows.runsteps import check_run_steps
from opforge.workflows.triggers import check_bisect_dispatch, check_runs_command
from opforge.workflows.workflow import Report, Workflow, line_of, load_yaml, steps_of
from opforge.yamlsafe import MAX_YAML_BYTES

WORKFLOW_DIR = Path(".github") / "workflows"
# opforge's own repository: each caller and the reusable workflow it calls
OWN_CALLERS = {"ci.yml": "reusable-build-smoke.yml", "nightly.yml": "reusable-nightly.yml",
               "bisect.yml": "reusable-bisect.yml"}
RUN_BISECT = ("reusable-nightly.yml", "reusable-bisect.yml")

__all__ = ["Checked", "check_repository", "check_workflows", "load_workflows"]


@dataclass
class Checked:
    problems: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)   # workflow files held to the rules
    skipped: list[str] = field(default_factory=list)   # files that do not use opforge


def load_workflows(root: Path, report: Report) -> list[Workflow]:
    workflows = []
    for path in sorted([*(root / WORKFLOW_DIR).glob("*.yml"),
                        *(root / WORKFLOW_DIR).glob("*.yaml")]):
        rel = path.relative_to(root).as_posix()
        try:  # a FIFO, a directory or a huge file is one problem, never a hang
            text = read_bytes(path, limit=MAX_YAML_BYTES).decode("utf-8", errors="replace")
        except UsageError as exc:
            report.problems.append(f"{rel}:0: (file): {str(exc).split(': ', 1)[-1]}")
            continue
        try:
            data = load_yaml(text, rel)
        except UsageError as exc:
            report.problems.append(str(exc))
            continue
        wf = Workflow(path, rel, text, data)
        if not isinstance(data, dict) or not wf.jobs:
            report(wf, 1, "(top)", "not a workflow: no jobs")
            continue
        workflows.append(wf)
    return workflows


def check_repository(root: str | Path, matrix_file: str | Path | None = None,
                     every: bool = False, *,
                     commands: Mapping[str, argparse.ArgumentParser]) -> Checked:
    """Every problem with the repository's workflows, and which files were checked.

    ``commands``: opforge's subcommands and their parsers, which ``opforge ...`` steps are
    parsed with (``project.subcommand_parsers`` of the CLI's parser; the CLI passes them, so
    this package does not import the CLI). Raises MatrixError (a UsageError, exit 2) when the
    matrix itself is malformed.
    """
    root = Path(root)
    report = Report()
    project = load_project(root, Path(matrix_file) if matrix_file is not None else None,
                           commands=commands)
    workflows = load_workflows(root, report)
    result = Checked(report.problems)
    if project.is_opforge:
        _check_own(root, workflows, report)
    chosen = []
    for wf in workflows:
        if every or project.is_opforge or uses_opforge(wf):
            chosen.append(wf)
            result.checked.append(wf.rel)
        else:
            result.skipped.append(wf.rel)
    if chosen and project.matrix is None:
        report.problems.append("matrix.yaml:0: (file): missing: the workflows run opforge, "
                               "which reads it (opforge init writes one; --file PATH names "
                               "another)")
    if any(_runs_nox(wf) for wf in chosen) and project.session_error:
        report.problems.append(f"noxfile.py:0: (sessions): {project.session_error}")
    local = {wf.path.name: wf for wf in workflows}
    for wf in chosen:
        check_hygiene(wf, report)
        check_publishing(wf, report)
        check_variant_files(wf, report)
        check_release_pins(wf, report)
        check_run_steps(wf, project, report)
        check_calls(wf, project, local, report)
        if project.matrix is None:
            continue
        check_matrix_use(wf, project, report)
        if runs_smoke(wf):
            check_variant_paths(wf, project, report)
        check_bisect_dispatch(wf, project, report)
    return result


def check_workflows(repo_root: str | Path, *,
                    commands: Mapping[str, argparse.ArgumentParser]) -> list[str]:
    """The problems ``check_repository`` finds, one line each; [] when all is well."""
    return check_repository(repo_root, commands=commands).problems


def _runs_nox(wf: Workflow) -> bool:
    for job in wf.jobs.values():
        for step, _ in steps_of(job):
            try:
                if any(classify(argv).tool == "nox" for argv in commands(str(step.get("run", "")))):
                    return True
            except ScriptError:
                continue
    return False


def _check_own(root: Path, workflows: list[Workflow], report: Report) -> None:
    """opforge's repository: the reusable workflows, their callers, the release they install."""
    by_name = {wf.path.name: wf for wf in workflows}
    for caller, reusable in OWN_CALLERS.items():
        for name in (caller, reusable):
            if not (root / WORKFLOW_DIR / name).exists():
                report.problems.append(f"{(WORKFLOW_DIR / name).as_posix()}:0: (file): missing")
        wf = by_name.get(caller)
        if wf is not None and not any(called_file(job.get("uses")) == reusable
                                      for job in wf.jobs.values() if isinstance(job, dict)):
            report(wf, line_of(wf.data, "jobs"), "jobs", f"no job calls {reusable}")
    for name in REUSABLE:
        wf = by_name.get(name)
        if wf is None:
            continue
        if "workflow_call" not in wf.triggers:
            report(wf, line_of(wf.data, "on") or 1, "on", "a reusable workflow needs "
                                                          "on: workflow_call")
        spec = wf.call_inputs.get("opforge")
        want = f"opforge=={__version__}"
        default = spec.get("default") if isinstance(spec, dict) else None
        if default != want:
            report(wf, line_of(spec) or line_of(wf.data, "on") or 1, "on.workflow_call.inputs."
                   "opforge", f"the default must be this release ({want}), found {default!r}: "
                   "a repository that passes no opforge input installs it")
    for name in RUN_BISECT:
        if name in by_name:
            check_runs_command(by_name[name], "bisect", report)
    nightly = by_name.get("nightly.yml")
    if nightly is not None and "schedule" not in nightly.triggers:
        report(nightly, line_of(nightly.data, "on") or 1, "on.schedule",
               "the nightly canary needs a schedule")
