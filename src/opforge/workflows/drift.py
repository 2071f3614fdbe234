"""Rules that tie the workflows to matrix.yaml, the noxfile and the ``opforge`` CLI."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from opforge import __version__
from opforge.errors import OpforgeError
from opforge.workflows.commands import Command, ScriptError, classify, commands
from opforge.workflows.expressions import (
    RUNTIME,
    ExpressionError,
    Placeholder,
    condition,
    expressions,
    render,
    to_str,
)
from opforge.workflows.project import Project
from opforge.workflows.workflow import (
    Report,
    Workflow,
    action_name,
    all_needs,
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
_ENV_REF = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?")
FILTER_FLAGS = ("--variant", "--platform", "--python", "--file")


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


def input_defaults(wf: Workflow) -> dict[str, Any]:
    """``inputs`` as a run that passes none would see them (dispatch or workflow_call)."""
    inputs: dict[str, Any] = {}
    for name, spec in {**wf.dispatch_inputs, **wf.call_inputs}.items():
        spec = spec if isinstance(spec, dict) else {}
        default = spec.get("default", (spec.get("options") or [None])[0])
        if default is None:
            inputs[name] = f"{RUNTIME}inputs.{name}__"
        elif spec.get("type") in ("boolean", "number"):
            inputs[name] = default
        else:
            inputs[name] = to_str(default)
    return inputs


def context(wf: Workflow, cell: dict[str, Any] | None, event: str = "push",
            inputs: dict[str, Any] | None = None) -> dict[str, Any]:
    """Contexts to judge a step by: the cell, the event, the inputs (default: each input's
    default); run-time values as placeholders."""
    inputs = {**input_defaults(wf), **(inputs or {})}
    return {
        "matrix": cell or {}, "inputs": inputs, "env": {}, "strategy": {}, "job": {},
        "vars": {}, "secrets": {},
        "github": {"event_name": event, "workflow": str(wf.data.get("name", "")),
                   "run_id": "1", "run_attempt": "1", "sha": "0" * 40,
                   "ref": "refs/heads/main", "workspace": "/workspace", "event": {}},
        "runner": {"os": "Linux", "arch": "X64", "temp": "/runner-temp"},
        "steps": Placeholder("steps"), "needs": Placeholder("needs"),
    }


def resolved_commands(wf: Workflow, job: dict, step: dict, ctx: dict[str, Any]
                      ) -> list[list[str]]:
    """The step's argv lists as the runner would run them for ``ctx``.

    Like GitHub: ``${{ }}`` is substituted into the script text first (so an expression that
    renders empty leaves no argument), then the line is split, then ``$VARS`` from ``env:``
    are filled in. The rendered text passes the same allow-list checks as the source.
    """
    env: dict[str, str] = {}
    for scope in (wf.data.get("env"), job.get("env"), step.get("env")):
        for key, value in (scope or {}).items():
            env[key] = to_str(render(value, {**ctx, "env": env}))
    script = to_str(render(str(step.get("run", "")), {**ctx, "env": env}))
    return [[_ENV_REF.sub(lambda m: env.get(m.group(1), m.group(0)), arg) for arg in argv]
            for argv in commands(script)]


# what one `opforge matrix --github` step writes: the cells, the cells that compile, the
# stable variants' compat cells (a matrix each), and whether there are any compat cells
MATRIX_OUTPUTS = ("matrix", "builds", "compat", "has_compat")


def _matrix_producer(job: Any) -> tuple[set[str], list[Command]]:
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
    typed.update({v.arch_list: "CUDA arch list" for v in project.matrix.variants if v.arch_list})
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
        fed, _ = _matrix_producer(wf.jobs.get(producer))
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


# --------------------------------------------------------------------------- every variant's path


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
    producers = {job_id: _matrix_producer(job)[1] for job_id, job in wf.jobs.items()}
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


# --------------------------------------------------------------------------- triggers and inputs


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
