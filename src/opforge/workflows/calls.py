"""Jobs that call a reusable workflow (``jobs.<id>.uses``): what they pass, and how opforge's
own reusable workflows are called from a repository that is not opforge."""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Any

from opforge.workflows.context import context, input_defaults
from opforge.workflows.expressions import ExpressionError, render, to_str
from opforge.workflows.paths import check_variant_paths, runs_smoke
from opforge.workflows.project import Project
from opforge.workflows.runsteps import opforge_spec_problems
from opforge.workflows.workflow import Report, Workflow, line_of

# opforge's reusable workflows (.github/workflows/ of opforge's repository)
REUSABLE = ("reusable-build-smoke.yml", "reusable-nightly.yml", "reusable-bisect.yml",
            "reusable-release.yml")
_EXPRESSION_ONLY = re.compile(r"^\s*\$\{\{.*\}\}\s*$", re.S)


def called_file(uses: Any) -> str:
    """``owner/repo/.github/workflows/x.yml@ref`` or ``./.github/workflows/x.yml`` -> ``x.yml``."""
    path = str(uses or "").split("@", 1)[0]
    return PurePosixPath(path).name if "/.github/workflows/" in f"/{path}" else ""


def calls_opforge(job: Any) -> bool:
    return isinstance(job, dict) and called_file(job.get("uses")) in REUSABLE


def uses_opforge(wf: Workflow) -> bool:
    """The workflow calls one of opforge's reusable workflows or runs ``opforge``."""
    for job in wf.jobs.values():
        if calls_opforge(job):
            return True
        for step in (job.get("steps") or []) if isinstance(job, dict) else []:
            if isinstance(step, dict) and re.search(r"(^|[\s/\"'])opforge(\s|$)",
                                                    str(step.get("run", "")), re.M):
                return True
    return False


def check_calls(wf: Workflow, project: Project, local: dict[str, Workflow],
                report: Report) -> None:
    """Each calling job passes inputs its workflow declares (a local one is read), every
    required one, and, calling opforge's workflows from another repository, a pinned opforge.
    A local pipeline is also checked with the inputs this caller gives it."""
    for job_id, job in wf.jobs.items():
        if not isinstance(job, dict) or "uses" not in job:
            continue
        where, uses = f"jobs.{job_id}", str(job["uses"])
        given = job.get("with") if isinstance(job.get("with"), dict) else {}
        called = local.get(called_file(uses)) if uses.startswith("./") else None
        if called is not None:
            _check_inputs(wf, job, where, called, given, report)
        if calls_opforge(job) and not project.is_opforge and "opforge" in given:
            for problem in opforge_spec_problems(str(given["opforge"]), project):
                report(wf, line_of(given, "opforge"), f"{where}.with.opforge", problem)
        if called is not None and project.matrix is not None and runs_smoke(called):
            _check_pipeline_as_called(wf, job, where, called, given, project, report)


def _check_inputs(wf: Workflow, job: dict, where: str, called: Workflow, given: dict,
                  report: Report) -> None:
    declared = called.call_inputs
    if "workflow_call" not in called.triggers:
        report(wf, line_of(job, "uses"), where, f"{called.rel} has no on: workflow_call")
        return
    for name in given:
        if name not in declared:
            report(wf, line_of(given, name), f"{where}.with.{name}",
                   f"{called.rel} has no input {name!r} ({', '.join(declared) or 'none'})")
    for name, spec in declared.items():
        if isinstance(spec, dict) and spec.get("required") and name not in given:
            report(wf, line_of(job), where, f"{called.rel} requires input {name!r}")


def _check_pipeline_as_called(wf: Workflow, job: dict, where: str, called: Workflow,
                              given: dict, project: Project, report: Report) -> None:
    """The called pipeline's every-variant check, with the inputs this job passes."""
    ctx = context(wf, None)
    inputs: dict[str, Any] = {}
    for name, value in given.items():
        try:
            rendered = render(value, ctx) if isinstance(value, str) else value
        except ExpressionError:
            continue
        inputs[name] = rendered if isinstance(rendered, (bool, int, float)) else to_str(rendered)
    if inputs == {k: v for k, v in input_defaults(called).items() if k in inputs}:
        return  # the called workflow's own check covers its defaults
    found = Report()
    check_variant_paths(called, project, found, inputs)
    for problem in found.problems:
        report(wf, line_of(job, "with") or line_of(job), f"{where} (calls {called.rel})",
               problem.split(": ", 1)[1])
