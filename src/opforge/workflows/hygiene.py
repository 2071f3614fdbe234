"""Rules every workflow keeps, whatever it runs: permissions, triggers, pins, timeouts, caches."""

from __future__ import annotations

import re
from typing import Any

from opforge.workflows.expressions import expressions
from opforge.workflows.publishing import allowed_writes
from opforge.workflows.workflow import Report, Workflow, action_name, line_of, steps_of

MAX_TIMEOUT = 360  # GitHub-hosted jobs are killed at 6 h anyway
UNSAFE_TRIGGERS = ("pull_request_target", "workflow_run")
# contexts an attacker can write (PR titles, branch names, dispatch inputs) or must not leak
UNTRUSTED_IN_RUN = re.compile(r"\b(secrets|inputs|github\.event|github\.head_ref|vars)\b")
_SHA = re.compile(r"[0-9a-f]{40}\Z")
_VERSION_COMMENT = re.compile(r"#\s*v\d+\.\d+\.\d+\b")


def check_hygiene(wf: Workflow, report: Report) -> None:
    data = wf.data
    if not wf.triggers:
        report(wf, 1, "on", "no triggers")
    for name in UNSAFE_TRIGGERS:
        if name in wf.triggers:
            report(wf, line_of(data.get("on"), name) or line_of(data, "on"), f"on.{name}",
                   "runs with a write token next to untrusted code; use pull_request")
    if "permissions" not in data:
        report(wf, 1, "permissions", "missing top-level permissions (contents: read)")
    else:
        _permissions(wf, data["permissions"], line_of(data, "permissions"), "permissions", report)
    _concurrency(wf, report)
    for job_id, job in wf.jobs.items():
        where = f"jobs.{job_id}"
        if not isinstance(job, dict):
            report(wf, line_of(wf.jobs, job_id), where, "not a mapping")
            continue
        _timeout(wf, job, where, report)
        if "permissions" in job:
            _permissions(wf, job["permissions"], line_of(job, "permissions"),
                         f"{where}.permissions", report, allowed_writes(job))
        if "uses" in job:
            _called(wf, job, where, report)
        for step, swhere in steps_of(job):
            swhere = f"{where}.{swhere}"
            if "uses" in step:
                _pinned(wf, str(step["uses"]), line_of(step, "uses"), swhere, report)
                _action_inputs(wf, job, step, swhere, report)
            if "run" in step:
                _run_text(wf, step, swhere, report)


def _concurrency(wf: Workflow, report: Report) -> None:
    conc = wf.data.get("concurrency")
    if wf.is_called_only:
        # the caller's run holds the group; in a called workflow github.workflow is the
        # caller's name, so a group keyed on it here equals the caller's (GitHub cancels one)
        if conc is not None and "github.workflow" in str(conc):
            report(wf, line_of(wf.data, "concurrency"), "concurrency",
                   "a reusable workflow's group on github.workflow is its caller's group: "
                   "leave concurrency to the caller")
        return
    if not isinstance(conc, dict):
        report(wf, line_of(wf.data, "concurrency") or 1, "concurrency",
               "missing a concurrency group with cancel-in-progress: true")
        return
    if "github.workflow" not in str(conc.get("group", "")):
        report(wf, line_of(conc, "group"), "concurrency.group",
               "key the group on github.workflow, so two workflows never cancel each other")
    if conc.get("cancel-in-progress") in (None, False, "false"):
        report(wf, line_of(conc), "concurrency.cancel-in-progress",
               "superseded runs must be cancelled (cancel-in-progress: true)")


def _timeout(wf: Workflow, job: dict, where: str, report: Report) -> None:
    timeout = job.get("timeout-minutes")
    if timeout is None:
        if "uses" not in job:  # a reusable workflow call sets its own jobs' timeouts
            report(wf, line_of(job), where, "missing timeout-minutes")
    elif not (isinstance(timeout, str) and "${{" in timeout) and not (
            isinstance(timeout, (int, float)) and not isinstance(timeout, bool)
            and 0 < timeout <= MAX_TIMEOUT):
        report(wf, line_of(job, "timeout-minutes"), f"{where}.timeout-minutes",
               f"{timeout!r} is not a number of minutes in 1..{MAX_TIMEOUT}")


def _permissions(wf: Workflow, perms: Any, line: int, where: str, report: Report,
                 writable: set[str] = frozenset()) -> None:
    """Nothing above read, but the scopes the job's publishing steps need (publishing.py)."""
    if isinstance(perms, str):
        report(wf, line, where, f"{perms!r} grants every scope; list what is needed "
                                "(contents: read)")
    elif isinstance(perms, dict):
        for scope, level in perms.items():
            if level not in ("read", "none") and not (level == "write" and scope in writable):
                report(wf, line_of(perms, scope), f"{where}.{scope}",
                       f"{level!r}: nothing here needs more than read")
    elif perms is not None:
        report(wf, line, where, f"{perms!r} is not a permissions mapping")


def _called(wf: Workflow, job: dict, where: str, report: Report) -> None:
    """A job that calls a reusable workflow: this repository's own file, or one pinned."""
    uses, line = str(job["uses"]), line_of(job, "uses")
    if uses.startswith("./"):
        if not re.fullmatch(r"\./\.github/workflows/[\w.-]+\.ya?ml", uses):
            report(wf, line, where, f"{uses}: a local reusable workflow is "
                                    "./.github/workflows/<file>.yml")
        elif not (wf.path.parent / uses.rsplit("/", 1)[1]).is_file():
            report(wf, line, where, f"{uses}: no such workflow")
    else:
        _pinned(wf, uses, line, where, report)
    if job.get("secrets") == "inherit":
        report(wf, line_of(job, "secrets"), f"{where}.secrets",
               "secrets: inherit hands every secret to the called workflow; pass only the "
               "ones it declares (opforge's workflows need none)")


def _pinned(wf: Workflow, uses: str, line: int, where: str, report: Report) -> None:
    if uses.startswith("./"):
        report(wf, line, where, f"{uses}: local actions would hide their steps from this check")
        return
    if uses.startswith("docker://"):
        if "@sha256:" not in uses:
            report(wf, line, where, f"{uses}: pin the image by digest (@sha256:...)")
        return
    ref = uses.split("@", 1)[1] if "@" in uses else ""
    if not _SHA.match(ref):
        report(wf, line, where, f"{uses}: pin third-party actions and workflows to a full "
                                "40-hex commit SHA (a tag or branch can be moved)")
        return
    text = wf.lines[line - 1] if 0 < line <= len(wf.lines) else ""
    if not _VERSION_COMMENT.search(text):
        report(wf, line, where, f"{uses}: name the version it pins in a comment (# vX.Y.Z)")


def _action_inputs(wf: Workflow, job: dict, step: dict, where: str, report: Report) -> None:
    action, args = action_name(step["uses"]), step.get("with") or {}
    if action == "actions/checkout" and args.get("persist-credentials") is not False:
        report(wf, line_of(step), where, "checkout must set persist-credentials: false (else "
                                         "the token stays in .git/config for every later step)")
    if action == "actions/setup-python" and args.get("cache") and \
            not args.get("cache-dependency-path"):
        report(wf, line_of(args, "cache"), where, "a pip cache needs cache-dependency-path: the "
                                                  "files its contents depend on")
    if action.startswith("actions/cache"):
        key = str(args.get("key", ""))
        if "${{" not in key:
            report(wf, line_of(args, "key") or line_of(step), where,
                   f"cache key {key!r} is constant: key it on what the cache depends on")
        elif action == "actions/cache" and "hashfiles(" not in key.lower():
            report(wf, line_of(args, "key"), where,
                   "cache key has no hashFiles(...): it would outlive the files it was made from")
        if "strategy" in job and "matrix." not in key:
            report(wf, line_of(args, "key"), where, "a per-cell cache key must name the cell "
                                                    "(matrix.name), or cells overwrite each other")


def _run_text(wf: Workflow, step: dict, where: str, report: Report) -> None:
    for expr in expressions(str(step["run"])):
        if UNTRUSTED_IN_RUN.search(expr):
            report(wf, line_of(step, "run"), where,
                   f"${{{{ {expr} }}}} is expanded inside run: (script injection); pass it "
                   "through env: and quote \"$VAR\"")
    shell = step.get("shell", "bash")
    if shell not in ("bash", "sh"):
        report(wf, line_of(step, "shell"), where,
               f"shell {shell!r}: run steps are commands, not inline scripts")
