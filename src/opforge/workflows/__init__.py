"""Check .github/workflows against matrix.yaml, the noxfile, the CLI and CI hygiene rules.

``python -m opforge.workflows [REPO]`` prints one line per problem (``file:line: where: what``)
and exits 1 when there is any, 0 when there is none, 2 when matrix.yaml is malformed.
``check_workflows(repo_root)`` returns the same lines. The rules, each pinned by a test in
tests/workflows/:

* One source of truth (drift.py): per-cell jobs take ``strategy.matrix`` from
  ``fromJSON(needs.<job>.outputs.<out>)`` of a job that runs ``opforge matrix --github``, run
  on ``${{ matrix.runner }}`` in ``${{ matrix.container }}`` and set up ``${{ matrix.python }}``;
  a runner label is typed only on a job that runs no cell (matrix, lint, tests) and must be one
  matrix.yaml declares; container images, CUDA arch lists and the torch index are never typed;
  every ``matrix.<field>`` is one ``opforge matrix --github`` emits.
* Every variant has its path (ci.yml, nightly.yml): the matrix is not filtered, and for every
  cell, on push and on pull_request, a step runs the cell's build session, a step uploads the
  cell's artifact, a later job that needs the build downloads it on the cell's runner (no
  container) and runs ``opforge smoke --wheel <that download> --variant <the cell's>`` with
  ``--device-checks skip`` exactly where matrix.yaml says ``device_checks: false``.
  nightly.yml and bisect.yml run ``opforge bisect``; bisect.yml's choice inputs list exactly
  matrix.yaml's variants, platforms and Pythons.
* ``run:`` steps (commands.py): ``pip install`` of nox or the harness, ``nox -s <a session the
  noxfile defines>``, ``opforge <command>`` with arguments its parser accepts; one plain
  command per line, no shell operators; only trusted contexts expanded inside ``run:``.
* Hygiene (hygiene.py): top-level ``permissions`` with nothing above ``read``; no
  ``pull_request_target``/``workflow_run``; ``concurrency`` on ``github.workflow`` with
  ``cancel-in-progress``; ``timeout-minutes`` on every job; actions pinned to a 40-hex commit
  with a ``# vX.Y.Z`` comment; ``persist-credentials: false`` on checkout; cache keys built
  from what the cache depends on.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from opforge.workflows.drift import (
    check_bisect_dispatch,
    check_matrix_use,
    check_run_steps,
    check_runs_command,
    check_variant_paths,
)
from opforge.workflows.hygiene import check_hygiene
from opforge.workflows.project import load_project
from opforge.workflows.workflow import Report, Workflow, line_of, load_yaml

WORKFLOW_DIR = Path(".github") / "workflows"
REQUIRED = ("ci.yml", "nightly.yml", "bisect.yml")
FULL_MATRIX = ("ci.yml", "nightly.yml")   # every variant built and smoke-tested
RUN_BISECT = ("nightly.yml", "bisect.yml")

__all__ = ["check_workflows", "load_workflows"]


def load_workflows(root: Path, report: Report) -> list[Workflow]:
    workflows = []
    for path in sorted([*(root / WORKFLOW_DIR).glob("*.yml"),
                        *(root / WORKFLOW_DIR).glob("*.yaml")]):
        rel = path.relative_to(root).as_posix()
        text = path.read_text(encoding="utf-8")
        try:
            data = load_yaml(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            report.problems.append(f"{rel}:{mark.line + 1 if mark else 0}: (yaml): "
                                   f"{getattr(exc, 'problem', None) or exc}")
            continue
        wf = Workflow(path, rel, text, data)
        if not isinstance(data, dict) or not wf.jobs:
            report(wf, 1, "(top)", "not a workflow: no jobs")
            continue
        workflows.append(wf)
    return workflows


def check_workflows(repo_root: str | Path) -> list[str]:
    """Every problem with the repository's workflows, one line each; [] when all is well.

    Raises MatrixError (a UsageError, exit 2) when matrix.yaml itself is malformed.
    """
    root = Path(repo_root)
    report = Report()
    for name in REQUIRED:
        if not (root / WORKFLOW_DIR / name).exists():
            report.problems.append(f"{(WORKFLOW_DIR / name).as_posix()}:0: (file): missing")
    project = load_project(root)
    if project.session_error:
        report.problems.append(f"noxfile.py:0: (sessions): {project.session_error}")
    for wf in load_workflows(root, report):
        check_hygiene(wf, report)
        check_matrix_use(wf, project, report)
        check_run_steps(wf, project, report)
        if wf.path.name in FULL_MATRIX:
            check_variant_paths(wf, project, report)
        if wf.path.name in RUN_BISECT:
            check_runs_command(wf, "bisect", report)
        if wf.path.name == "bisect.yml":
            check_bisect_dispatch(wf, project, report)
        if wf.path.name == "nightly.yml" and "schedule" not in wf.triggers:
            report(wf, line_of(wf.data, "on") or 1, "on.schedule",
                   "the nightly canary needs a schedule")
    return report.problems
