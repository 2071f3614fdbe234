"""``run:`` steps: every command is on the allow-list (commands.py) for every cell it runs for:
``nox -s`` a session the noxfile defines, ``opforge <command>`` with arguments its parser
accepts, and outside opforge's own repository opforge installed pinned."""

from __future__ import annotations

import re
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from opforge import __version__
from opforge.errors import OpforgeError
from opforge.workflows.cells import is_per_cell, probe_matrix
from opforge.workflows.commands import Command, ScriptError, classify, commands
from opforge.workflows.context import context, resolved_commands
from opforge.workflows.expressions import RUNTIME, ExpressionError
from opforge.workflows.project import Project
from opforge.workflows.workflow import Report, Workflow, line_of, steps_of


def check_run_steps(wf: Workflow, project: Project, report: Report) -> None:
    """Every run: step is on the allow-list, for every cell it runs for."""
    for job_id, job in wf.jobs.items():
        if not isinstance(job, dict):
            continue
        cells: list[dict[str, Any] | None] = \
            list(project.cells if is_per_cell(job) else []) or [None]
        probes = probe_matrix(job)
        if probes is not None:  # a key the plan step picks at run time
            key = {probes.dimension: f"{RUNTIME}matrix.{probes.dimension}__"}
            cells = [{**(cell or {}), **key} for cell in cells]
        for step, swhere in steps_of(job):
            if "run" not in step:
                continue
            where, line, seen = f"jobs.{job_id}.{swhere}", line_of(step, "run"), set()
            try:
                commands(str(step["run"]))
            except ScriptError as exc:
                report(wf, line, where, str(exc))
                continue
            for cell in cells:
                try:
                    argvs = resolved_commands(wf, job, step, context(wf, cell))
                    problems = []
                    for argv in argvs:
                        problems += _command_problems(classify(argv), project)
                except (ScriptError, ExpressionError) as exc:
                    problems = [str(exc)]
                for problem in problems:
                    if problem not in seen:
                        seen.add(problem)
                        report(wf, line, where, problem + (f" (cell {cell['name']})"
                                                           if cell and "name" in cell else ""))


def _command_problems(cmd: Command, project: Project) -> list[str]:
    problems = _install_problems(cmd, project) if cmd.tool == "pip" else []
    if cmd.tool == "nox" and project.sessions is not None:
        for session in cmd.sessions:
            if session not in project.sessions:
                problems.append(f"nox session {session!r} is not defined in noxfile.py "
                                f"(defined: {', '.join(sorted(project.sessions))})")
    if cmd.tool == "opforge":
        parser = project.opforge_commands.get(cmd.subcommand or "")
        if parser is None:
            problems.append(f"'opforge {cmd.subcommand}' is not an opforge command "
                            f"({', '.join(sorted(project.opforge_commands))})")
        elif not any(RUNTIME in arg for arg in cmd.args):  # run-time values: cannot judge
            try:
                parser.parse_args(list(cmd.args[1:]))
            except OpforgeError as exc:
                problems.append(f"'opforge {' '.join(cmd.args)}': {exc}")
            except SystemExit:
                problems.append(f"'opforge {' '.join(cmd.args)}' exits while parsing")
    return problems


def _install_problems(cmd: Command, project: Project) -> list[str]:
    """Outside opforge's own repository, opforge is installed pinned, never from ``.``."""
    if project.is_opforge:
        return []
    problems = []
    for arg in cmd.args[1:]:
        if arg.startswith("-"):
            continue
        problems += opforge_spec_problems(arg, project)
    return problems


def opforge_spec_problems(spec: str, project: Project) -> list[str]:
    """What is wrong with installing ``spec`` as opforge in ``project`` (not opforge's own)."""
    if project.is_opforge or RUNTIME in spec:
        return []
    if re.fullmatch(r"\.(\[[\w,-]+\])?|\.?\.?/.*|file:.*", spec.strip()):
        what = f"this repository ({project.distribution})" if project.distribution \
            else "this repository"
        return [f"pip install {spec!r} installs {what}, not opforge: install a pinned "
                f"opforge (opforge=={__version__})"]
    try:
        requirement = Requirement(spec)
    except InvalidRequirement:
        return []  # classify() has said so
    if canonicalize_name(requirement.name) == "opforge" and not requirement.url and \
            not any(s.operator in ("==", "===") for s in requirement.specifier):
        return [f"opforge is not pinned ({spec!r}): a new release would change CI under you; "
                f"install opforge=={__version__}"]
    return []
