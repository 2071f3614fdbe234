"""Triggers and inputs: dispatch choices list matrix.yaml's values; a workflow runs the opforge
command it exists for."""

from __future__ import annotations

from opforge.workflows.commands import ScriptError, classify, commands
from opforge.workflows.project import Project
from opforge.workflows.workflow import Report, Workflow, line_of, steps_of


def check_bisect_dispatch(wf: Workflow, project: Project, report: Report) -> None:
    """Dispatch choice inputs named variant, platform or python list exactly matrix.yaml's."""
    inputs = wf.dispatch_inputs
    expected = {"variant": [v.name for v in project.matrix.variants],
                "platform": list(project.matrix.platforms),
                "python": list(project.matrix.pythons)}
    for name, want in expected.items():
        spec = inputs.get(name)
        if isinstance(spec, dict) and spec.get("type") == "choice":
            options = [str(o) for o in spec.get("options") or []]
            if options != want:
                report(wf, line_of(spec, "options"), f"on.workflow_dispatch.inputs.{name}",
                       f"options {options} differ from matrix.yaml's {want}")


def check_runs_command(wf: Workflow, subcommand: str, report: Report) -> None:
    """The workflow has a step that runs ``opforge <subcommand>`` (or its nox session)."""
    for job in wf.jobs.values():
        for step, _ in steps_of(job):
            try:
                cmds = [classify(argv) for argv in commands(str(step.get("run", "")))]
            except ScriptError:
                continue
            if any(c.subcommand == subcommand or c.tool == "nox" and subcommand in c.sessions
                   for c in cmds):
                return
    report(wf, line_of(wf.data, "jobs"), "jobs", f"no step runs opforge {subcommand}")
