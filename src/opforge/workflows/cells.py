"""One source of truth: the jobs that run per cell take their matrix, runner, image, Python and
fields from an ``opforge matrix --github`` step (a bisect round's from an ``opforge bisect
--plan K`` step); nothing matrix.yaml holds is typed in a workflow."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from opforge.workflows.commands import Command, ScriptError, classify, commands
from opforge.workflows.expressions import expressions
from opforge.workflows.project import Project
from opforge.workflows.workflow import (
    Report,
    Workflow,
    action_name,
    line_of,
    needs_of,
    steps_of,
    strings_in,
)

_FROMJSON_OF = r"^\$\{\{\s*fromjson\(\s*needs\.([\w-]+)\.outputs\.([\w-]+)\s*\)%s\s*\}\}$"
_FROMJSON = re.compile(_FROMJSON_OF % "", re.I)
_FROMJSON_INCLUDE = re.compile(_FROMJSON_OF % r"\.include", re.I)
_MATRIX_FIELD = re.compile(r"(?<![\w.-])matrix\.([A-Za-z_][\w-]*)")
_NEEDS_OUTPUT = re.compile(r"\bneeds\.([\w-]+)\.outputs\.([\w-]+)")


def _squash(value: Any) -> str:
    return re.sub(r"\s+", "", str(value))


@dataclass(frozen=True)
class Probes:
    """A bisect round's matrix: ``{<dimension>: fromJSON(needs.<producer>.outputs.<output>)}``,
    the keys an ``opforge bisect --plan K`` step wrote, optionally with ``include:
    fromJSON(needs.<job>.outputs.<out>).include`` (the cell those keys are probed on)."""

    dimension: str
    producer: str
    output: str
    cells: tuple[str, str] | None  # (job, output) of the include, or None


def probe_matrix(job: Any) -> Probes | None:
    """The job's matrix as a bisect round's, or None when it is not of that form."""
    strategy = job.get("strategy") if isinstance(job, dict) else None
    matrix = strategy.get("matrix") if isinstance(strategy, dict) else None
    if not isinstance(matrix, dict):
        return None
    keys = [k for k in matrix if k != "include"]
    if len(keys) != 1 or set(matrix) - {keys[0], "include"}:
        return None
    m = _FROMJSON.match(str(matrix[keys[0]]).strip())
    if not m:
        return None
    cells = None
    if "include" in matrix:
        inc = _FROMJSON_INCLUDE.match(str(matrix["include"]).strip())
        if not inc:
            return None
        cells = (inc.group(1), inc.group(2))
    return Probes(str(keys[0]), m.group(1), m.group(2), cells)


def matrix_source(job: Any) -> tuple[str, str] | None:
    """(producer job, output) of a ``fromJSON(needs.X.outputs.Y)`` matrix; ("", "") if typed.

    A bisect round's matrix (``probe_matrix``) has the source of the cells it includes, or
    None when it includes none (it runs like a job without a matrix)."""
    strategy = job.get("strategy") if isinstance(job, dict) else None
    if not isinstance(strategy, dict) or "matrix" not in strategy:
        return None
    probes = probe_matrix(job)
    if probes is not None:
        return probes.cells
    m = _FROMJSON.match(str(strategy["matrix"]).strip()) \
        if isinstance(strategy["matrix"], str) else None
    return (m.group(1), m.group(2)) if m else ("", "")


def is_per_cell(job: Any) -> bool:
    return matrix_source(job) not in (None, ("", ""))


# what one `opforge matrix --github` step writes: the cells, the cells that compile, the
# stable variants' compat cells (a matrix each), and whether there are any compat cells
MATRIX_OUTPUTS = ("matrix", "builds", "compat", "has_compat")


def matrix_producer(job: Any) -> tuple[set[str], list[Command]]:
    """The outputs of ``job`` that carry an ``opforge matrix --github`` step's matrix."""
    ids, cmds = set(), []
    for step, _ in steps_of(job):
        try:
            found = [classify(argv) for argv in commands(str(step.get("run", "")))]
        except ScriptError:
            continue
        for cmd in found:
            if cmd.subcommand == "matrix" and "--github" in cmd.args or \
                    cmd.tool == "nox" and "matrix" in cmd.sessions and "--github" in cmd.posargs:
                cmds.append(cmd)
                if step.get("id"):
                    ids.add(str(step["id"]))
    outputs = job.get("outputs") if isinstance(job, dict) else None
    fed = {name for name, value in (outputs or {}).items()
           if any(f"steps.{i}.outputs.{out}" in _squash(value) for i in ids
                  for out in MATRIX_OUTPUTS)}
    return fed, cmds


# what one `opforge bisect --plan K` step writes: the keys to probe (a JSON list), and
# whether there are any (probe) or the search needs none (done)
PLAN_OUTPUTS = ("probes", "status")


def _plan_producer(job: Any) -> set[str]:
    """The outputs of ``job`` that carry an ``opforge bisect --plan K`` step's probe keys."""
    ids = set()
    for step, _ in steps_of(job):
        try:
            found = [classify(argv) for argv in commands(str(step.get("run", "")))]
        except ScriptError:
            continue
        if step.get("id") and any(c.subcommand == "bisect" and "--plan" in
                                  {a.split("=", 1)[0] for a in c.args} for c in found):
            ids.add(str(step["id"]))
    outputs = job.get("outputs") if isinstance(job, dict) else None
    return {name for name, value in (outputs or {}).items()
            if _squash(value) in {f"${{{{steps.{i}.outputs.probes}}}}" for i in ids}}


def check_matrix_use(wf: Workflow, project: Project, report: Report) -> None:
    for job_id, job in wf.jobs.items():
        if not isinstance(job, dict):
            continue
        where, source = f"jobs.{job_id}", matrix_source(job)
        runs_on, container = job.get("runs-on"), job.get("container")
        if isinstance(container, dict):
            container = container.get("image")
        probes = probe_matrix(job)
        fields = project.fields if source is not None else set()
        if probes is not None:
            _check_probes(wf, job, where, probes, project, report)
            fields = fields | {probes.dimension}
        if source is None:
            _check_plain_job(wf, job, where, runs_on, container, project, report)
            if probes is not None:
                _check_fields(wf, job, where, fields, report)
        else:
            _check_cell_job(wf, job, where, source, runs_on, container, fields, report,
                            imaged=any(j.container for j in project.matrix.jobs()
                                       if j.platform.os == "linux"))
        for text in strings_in(job):
            for need, output in _NEEDS_OUTPUT.findall(text):
                if need not in needs_of(job):
                    report(wf, line_of(job), where, f"reads needs.{need} without needs: {need}")
                elif output not in ((wf.jobs.get(need) or {}).get("outputs") or {}):
                    report(wf, line_of(job), where, f"job {need} has no output {output!r}")
    typed = {v.container: "container image" for v in project.matrix.variants if v.container}
    typed.update({p.container: "container image" for p in project.matrix.platforms.values()
                  if p.container})
    typed.update({v.option("arch_list"): "CUDA arch list" for v in project.matrix.variants
                  if v.option("arch_list")})
    typed[project.matrix.torch.index.rstrip("/")] = "torch index"
    for number, text in enumerate(wf.lines, 1):
        for value, what in typed.items():
            if value in text:
                report(wf, number, "(text)", f"{what} {value!r} typed in the workflow; it "
                                             "comes from matrix.yaml through the matrix job")


def _check_plain_job(wf: Workflow, job: dict, where: str, runs_on: Any, container: Any,
                     project: Project, report: Report) -> None:
    if container is not None:
        report(wf, line_of(job, "container"), f"{where}.container",
               f"{container!r}: images come from matrix.yaml; run the job per cell with "
               "container: ${{ matrix.container }}")
    for label in [runs_on] if isinstance(runs_on, str) else list(runs_on or []):
        label = str(label)
        if "${{" in label:
            if "needs." not in label:
                report(wf, line_of(job, "runs-on"), f"{where}.runs-on",
                       f"{label!r}: runners come from matrix.yaml through the matrix job")
        elif label not in project.runners:
            report(wf, line_of(job, "runs-on"), f"{where}.runs-on",
                   f"runner {label!r} is not declared in matrix.yaml "
                   f"({', '.join(sorted(project.runners))})")


def _check_cell_job(wf: Workflow, job: dict, where: str, source: tuple[str, str], runs_on: Any,
                    container: Any, fields: set[str], report: Report, *,
                    imaged: bool = False) -> None:
    producer, output = source
    line = line_of(job, "strategy")
    if not producer:
        report(wf, line, f"{where}.strategy.matrix", "matrix typed in the workflow; take it "
                                                     "from fromJSON(needs.<matrix job>.outputs.matrix)")
    else:
        fed, _ = matrix_producer(wf.jobs.get(producer))
        if producer not in needs_of(job):
            report(wf, line, f"{where}.strategy.matrix",
                   f"reads needs.{producer} but does not list it in needs")
        if output not in fed:
            report(wf, line, f"{where}.strategy.matrix", f"needs.{producer}.outputs.{output} is "
                                                         "not fed by an 'opforge matrix --github' step")
    if _squash(runs_on) != "${{matrix.runner}}":
        report(wf, line_of(job, "runs-on"), f"{where}.runs-on",
               f"{runs_on!r}: a per-cell job runs on ${{{{ matrix.runner }}}}")
    if container is not None and _squash(container) != "${{matrix.container}}":
        report(wf, line_of(job, "container"), f"{where}.container",
               f"{container!r}: the image comes from the matrix (${{{{ matrix.container }}}})")
    elif container is None and imaged and _builds(job):
        report(wf, line_of(job), where,
               "builds wheels straight on the runner: its Linux wheels would need the runner's "
               "glibc (ubuntu-24.04: manylinux_2_39), not the image matrix.yaml names; add "
               "container: ${{ matrix.container }}")
    _check_fields(wf, job, where, fields, report)
    for step, swhere in steps_of(job):
        if action_name(step.get("uses")) == "actions/setup-python":
            version = _squash((step.get("with") or {}).get("python-version", ""))
            if version != "${{matrix.python}}":
                report(wf, line_of(step), f"{where}.{swhere}",
                       "a per-cell job sets up python-version: ${{ matrix.python }}")


_BUILDS = re.compile(r"\bopforge\s+build\b|\bnox\b.*\s-s\s+\S*build_|matrix\.build_session")


def _builds(job: dict) -> bool:
    """The job builds wheels (``opforge build``, a ``build_*`` nox session)."""
    return any(_BUILDS.search(str(step.get("run") or "")) for step, _ in steps_of(job))


def _check_fields(wf: Workflow, job: dict, where: str, fields: set[str],
                  report: Report) -> None:
    unknown = sorted({name for text in strings_in(job) for expr in expressions(text)
                      for name in _MATRIX_FIELD.findall(expr)} - fields)
    probes = probe_matrix(job)
    for name in unknown:
        if probes is None:
            what = "a field opforge matrix --github emits"
        elif probes.cells is None:
            what = f"the probe key (matrix.{probes.dimension}), the one field of this matrix"
        else:
            what = (f"a field opforge matrix --github emits, nor the probe key "
                    f"(matrix.{probes.dimension})")
        report(wf, line_of(job), where, f"matrix.{name} is not {what}")


def _check_probes(wf: Workflow, job: dict, where: str, probes: Probes, project: Project,
                  report: Report) -> None:
    """A bisect round: its keys come from an ``opforge bisect --plan`` step's ``probes``
    output, and the probe key does not hide a cell's field."""
    line = line_of(job, "strategy")
    if probes.producer not in needs_of(job):
        report(wf, line, f"{where}.strategy.matrix.{probes.dimension}",
               f"reads needs.{probes.producer} but does not list it in needs")
    if probes.output not in _plan_producer(wf.jobs.get(probes.producer)):
        report(wf, line, f"{where}.strategy.matrix.{probes.dimension}",
               f"needs.{probes.producer}.outputs.{probes.output} is not fed by the 'probes' "
               "output of an 'opforge bisect --plan K' step (steps.<id>.outputs.probes)")
    if probes.cells is not None and probes.dimension in project.fields:
        report(wf, line, f"{where}.strategy.matrix.{probes.dimension}",
               f"the probe key would replace the cell's matrix.{probes.dimension}: name it "
               "otherwise (probe)")
