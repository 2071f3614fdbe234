"""Every variant has its path: in a pipeline (a workflow whose cells run ``opforge smoke``), each
cell is built, uploaded, downloaded by a later job on its runner and smoke-tested, on push and
on pull_request."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from opforge.workflows.cells import is_per_cell, matrix_producer
from opforge.workflows.commands import Command, ScriptError, classify, commands
from opforge.workflows.context import context, resolved_commands
from opforge.workflows.expressions import ExpressionError, condition, render, to_str
from opforge.workflows.project import Project
from opforge.workflows.workflow import Report, Workflow, action_name, all_needs, line_of, steps_of

FILTER_FLAGS = ("--variant", "--platform", "--python", "--file")


@dataclass
class _Found:
    """Where one cell's wheel is built, uploaded, downloaded and smoke-tested."""

    build: list[tuple[str, str]] = field(default_factory=list)      # (job, step)
    upload: list[tuple[str, str]] = field(default_factory=list)
    download: list[tuple[str, str, str]] = field(default_factory=list)  # + path
    smoke: list[tuple[str, str, Command]] = field(default_factory=list)


def runs_smoke(wf: Workflow) -> bool:
    """A pipeline: some per-cell job runs ``opforge smoke`` (or its nox session)."""
    for job in wf.jobs.values():
        if not is_per_cell(job):
            continue
        for step, _ in steps_of(job):
            try:
                cmds = [classify(argv) for argv in commands(str(step.get("run", "")))]
            except ScriptError:
                continue
            if any(c.subcommand == "smoke" or c.tool == "nox" and "smoke" in c.sessions
                   for c in cmds):
                return True
    return False


def check_variant_paths(wf: Workflow, project: Project, report: Report,
                        inputs: dict[str, Any] | None = None) -> None:
    """In a pipeline (a workflow that smoke-tests cells), with its default inputs or a
    caller's: every variant is built, uploaded, downloaded and smoked."""
    producers = {job_id: matrix_producer(job)[1] for job_id, job in wf.jobs.items()}
    producers = {job_id: cmds for job_id, cmds in producers.items() if cmds}
    if not producers:
        report(wf, line_of(wf.data, "jobs"), "jobs",
               "no job runs 'opforge matrix --github' to feed the cells")
        return
    for job_id in producers:
        job = wf.jobs[job_id]
        for step, _ in steps_of(job):
            try:
                argvs = resolved_commands(wf, job, step, context(wf, None, inputs=inputs))
                cmds = [classify(argv) for argv in argvs]
            except (ScriptError, ExpressionError):
                continue  # reported by check_run_steps
            for cmd in cmds:
                if cmd.subcommand != "matrix":
                    continue
                for flag in FILTER_FLAGS:
                    if cmd.option(flag) or flag in cmd.args and cmd.option(flag) is None:
                        report(wf, line_of(job), f"jobs.{job_id}",
                               f"'opforge matrix {flag} {cmd.option(flag) or ''}' drops cells: "
                               f"{wf.path.name} builds every variant (--pull-request trims "
                               "Pythons, nothing else)")
    for variant in project.matrix.variants:
        for cell in [c for c in project.cells if c["variant"] == variant.name]:
            problems = _cell_path_problems(wf, project, cell, inputs)
            for problem in problems:
                report(wf, line_of(wf.data, "jobs"), f"variant {variant.name}",
                       f"{problem} (cell {cell['name']})")
            if problems:
                break  # one cell shows what is wrong with the variant


def _cell_path_problems(wf: Workflow, project: Project, cell: dict[str, Any],
                        inputs: dict[str, Any] | None = None) -> list[str]:
    problems: list[str] = []
    for event in ("push", "pull_request"):
        found = _find_path(wf, cell, context(wf, cell, event, inputs))
        problems = _judge_path(wf, cell, found)
        if problems:
            return [f"on {event}: {p}" for p in problems]
    return problems


def _find_path(wf: Workflow, cell: dict[str, Any], ctx: dict[str, Any]) -> _Found:
    found = _Found()
    for job_id, job in wf.jobs.items():
        if not is_per_cell(job):
            continue
        try:
            if not condition(job.get("if"), {**ctx, "matrix": {}}):
                continue
        except ExpressionError:
            pass  # a job-level if cannot read the matrix; the steps decide
        for step, swhere in steps_of(job):
            try:
                if not condition(step.get("if"), ctx):
                    continue
                args = {k: to_str(render(v, ctx)) for k, v in (step.get("with") or {}).items()}
                argvs = resolved_commands(wf, job, step, ctx) if "run" in step else []
            except (ExpressionError, ScriptError):
                continue  # reported by check_run_steps
            action = action_name(step.get("uses"))
            if action == "actions/upload-artifact" and args.get("name") == cell["artifact"]:
                found.upload.append((job_id, swhere))
            if action == "actions/download-artifact" and args.get("name") == cell["artifact"]:
                found.download.append((job_id, swhere, args.get("path", "")))
            for argv in argvs:
                try:
                    cmd = classify(argv)
                except ScriptError:
                    continue
                if cmd.tool == "nox" and cell["build_session"] in cmd.sessions or \
                        cmd.subcommand == "build" and cmd.option("--variant") == cell["variant"]:
                    found.build.append((job_id, swhere))
                if cmd.subcommand == "smoke" or cmd.tool == "nox" and "smoke" in cmd.sessions:
                    found.smoke.append((job_id, swhere, cmd))
    return found


def _judge_path(wf: Workflow, cell: dict[str, Any], found: _Found) -> list[str]:
    problems = []
    if not found.build:
        problems.append(f"no step builds it (opforge build --variant {cell['variant']}, or "
                        f"nox -s {cell['build_session']})")
    if not found.upload:
        problems.append(f"no step uploads artifact {cell['artifact']!r}")
    if not found.download:
        problems.append(f"no job downloads artifact {cell['artifact']!r}")
    if not found.smoke:
        problems.append("no step runs opforge smoke")
    build_jobs = {job for job, _ in found.build + found.upload}
    for job, _, _ in found.download:
        if job in build_jobs:
            problems.append(f"jobs.{job} smokes the wheel in the job that built it; use a "
                            "fresh job so nothing from the build leaks in")
        elif not build_jobs & all_needs(wf.jobs, job):
            problems.append(f"jobs.{job} downloads the wheel without needing the build job")
    downloads = {job: path for job, _, path in found.download}
    for job, swhere, cmd in found.smoke:
        where = f"jobs.{job}.{swhere}"
        if job not in downloads:
            problems.append(f"{where} smokes a wheel its job did not download")
            continue
        if (wf.jobs[job] or {}).get("container") is not None:
            problems.append(f"jobs.{job} smokes inside a container; smoke on the cell's runner, "
                            "where users run")
        wheel = cmd.option("--wheel") or ""
        if downloads[job] and not wheel.startswith(downloads[job].rstrip("/") + "/"):
            problems.append(f"{where} smokes --wheel {wheel or '(none)'}, not the wheel "
                            f"downloaded into {downloads[job]}")
        if cmd.option("--variant") != cell["variant"]:
            problems.append(f"{where} does not pass --variant {cell['variant']}")
        checks = cmd.option("--device-checks")
        if (checks == "skip") == bool(cell["device_checks"]):
            problems.append(f"{where} passes --device-checks {checks or '(nothing)'}, but "
                            f"matrix.yaml says device_checks: "
                            f"{str(bool(cell['device_checks'])).lower()}")
    return problems
