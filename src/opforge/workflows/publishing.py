"""Rules for the jobs that publish: trusted publishing, provenance, the least write access.

* A step that uploads to PyPI (``pypa/gh-action-pypi-publish``) runs in a job with
  ``id-token: write`` (trusted publishing: PyPI trusts the workflow through OIDC) and an
  ``environment:`` (protect it in the repository's settings), and never with a token: no
  ``password:``/``user:`` input, no ``secrets.`` anywhere in the job.
* A workflow that uploads to PyPI or deploys Pages attests what it ships first: a job with
  ``actions/attest-build-provenance`` (``id-token`` and ``attestations: write``) that the
  uploading job needs, directly or through others.
* ``actions/deploy-pages`` runs in a job with ``pages: write``, ``id-token: write`` and an
  ``environment:`` (github-pages).
* Write access only where it is used: ``allowed_writes`` gives the scopes a job's own steps
  need (``id-token``, ``attestations``, ``pages``; a job calling opforge's release workflow
  gets the union its jobs need); hygiene reports every other ``write``, and any ``write`` at
  the top level.
* A call of opforge's reusable workflows pinned to a commit: where this opforge is a release
  (its commit stamped in ``opforge/_release.py``) and the ``# vX.Y.Z`` comment names it, the
  pin must be that release's commit; any other commit is one no release published.
"""

from __future__ import annotations

import re
from typing import Any

from opforge import __version__, _release
from opforge.workflows.calls import called_file, calls_opforge
from opforge.workflows.commands import ScriptError, classify, commands
from opforge.workflows.workflow import (
    Report,
    Workflow,
    action_name,
    all_needs,
    line_of,
    steps_of,
    strings_in,
)

PYPI_PUBLISH = "pypa/gh-action-pypi-publish"
ATTEST = ("actions/attest-build-provenance", "actions/attest")
DEPLOY_PAGES = "actions/deploy-pages"
RELEASE_WORKFLOW = "reusable-release.yml"
_TOKEN_INPUTS = ("password", "user", "api-token")


def _actions(job: Any) -> set[str]:
    return {action_name(step.get("uses")) for step, _ in steps_of(job) if "uses" in step}


def _calls_release(job: Any) -> bool:
    return isinstance(job, dict) and called_file(job.get("uses")) == RELEASE_WORKFLOW


def allowed_writes(job: Any) -> set[str]:
    """The scopes a job may hold ``write`` on: those its own steps need."""
    actions = _actions(job)
    allowed: set[str] = set()
    if PYPI_PUBLISH in actions:
        allowed.add("id-token")
    if actions & set(ATTEST):
        allowed |= {"id-token", "attestations"}
    if DEPLOY_PAGES in actions:
        allowed |= {"id-token", "pages"}
    if _calls_release(job):
        allowed |= {"id-token", "attestations", "pages"}
    return allowed


def _writes(job: dict) -> set[str]:
    perms = job.get("permissions")
    return {k for k, v in perms.items() if v == "write"} if isinstance(perms, dict) else set()


def check_publishing(wf: Workflow, report: Report) -> None:
    jobs = {k: v for k, v in wf.jobs.items() if isinstance(v, dict)}
    attesting = {job_id for job_id, job in jobs.items() if _actions(job) & set(ATTEST)}
    for job_id, job in jobs.items():
        where, actions, writes = f"jobs.{job_id}", _actions(job), _writes(job)
        if PYPI_PUBLISH in actions:
            _pypi_job(wf, job, where, writes, report)
        if DEPLOY_PAGES in actions:
            for scope in ("pages", "id-token"):
                if scope not in writes:
                    report(wf, line_of(job, "permissions") or line_of(job), where,
                           f"actions/deploy-pages needs {scope}: write on this job")
            if "environment" not in job:
                report(wf, line_of(job), where, "deploy Pages from its environment "
                                                "(environment: github-pages)")
        if actions & set(ATTEST):
            for scope in ("id-token", "attestations"):
                if scope not in writes:
                    report(wf, line_of(job, "permissions") or line_of(job), where,
                           f"attesting provenance needs {scope}: write on this job")
        if (PYPI_PUBLISH in actions or DEPLOY_PAGES in actions) and \
                not (all_needs(jobs, job_id) | {job_id}) & attesting:
            report(wf, line_of(job), where,
                   "publishes files whose provenance no job attested first: add a job with "
                   "actions/attest-build-provenance (id-token and attestations: write) over "
                   "every file, and list it in this job's needs")


def _pypi_job(wf: Workflow, job: dict, where: str, writes: set[str], report: Report) -> None:
    if "id-token" not in writes:
        report(wf, line_of(job, "permissions") or line_of(job), where,
               "trusted publishing needs id-token: write on the uploading job (and only there)")
    if "environment" not in job:
        report(wf, line_of(job), where, "upload from a protected environment (environment: "
                                        "pypi), the one PyPI's trusted publisher names")
    for step, swhere in steps_of(job):
        if action_name(step.get("uses")) != PYPI_PUBLISH:
            continue
        given = step.get("with") if isinstance(step.get("with"), dict) else {}
        for name in _TOKEN_INPUTS:
            if name in given:
                report(wf, line_of(given, name), f"{where}.{swhere}.with.{name}",
                       "a token upload: trusted publishing needs no password or user (remove "
                       "it and the secret; add this workflow as the project's trusted publisher)")
    if any("secrets." in text for text in strings_in(job)):
        report(wf, line_of(job), where, "reads a secret in the job that uploads to PyPI: "
                                        "trusted publishing uses no token")


def check_release_pins(wf: Workflow, report: Report) -> None:
    """Calls of opforge's reusable workflows pinned to a commit no release of this version has."""
    released = _release.WORKFLOWS_COMMIT
    if not re.fullmatch(r"[0-9a-f]{40}", released or ""):
        return  # a development opforge cannot tell which commits were released
    for job_id, job in wf.jobs.items():
        if not calls_opforge(job) or str(job.get("uses", "")).startswith("./"):
            continue
        uses, line = str(job["uses"]), line_of(job, "uses")
        ref = uses.split("@", 1)[1] if "@" in uses else ""
        text = wf.lines[line - 1] if 0 < line <= len(wf.lines) else ""
        comment = re.search(r"#\s*v(\S+)", text)
        if comment and comment.group(1) == __version__ and ref != released:
            report(wf, line, f"jobs.{job_id}",
                   f"pinned to {ref[:12]}..., which opforge {__version__} was not released "
                   f"from ({released}): a commit no release published may vanish or change "
                   "under its callers; pin the release's commit (opforge init writes it)")


VARIANT_ARTIFACT = "variant-"   # + the cell's wheel artifact: never taken by a wheel-* pattern
VARIANT_DIR = "wheel-variants"  # where an index job puts them: DIST/wheel-variants (index.py)


def _opforge_commands(step: dict) -> list:
    try:
        return [c for c in (classify(argv) for argv in commands(str(step.get("run", ""))))
                if c.tool == "opforge"]
    except ScriptError:
        return []  # reported by check_run_steps


def _index_dist(cmd) -> str:
    """``opforge index DIST ...``'s DIST (default dist)."""
    takes_value = {"--out", "--merge-from", "--pypi-out", "--resolve", "--index-url",
                   "--host-python"}
    args = list(cmd.args[1:])
    i = 0
    while i < len(args):
        if args[i] in takes_value:
            i += 2
            continue
        if not args[i].startswith("-"):
            return args[i].rstrip("/")
        i += 1
    return "dist"


def check_variant_files(wf: Workflow, report: Report) -> None:
    """The wheel variants reach the index: a job that builds them (``opforge build
    --variants``) uploads ``dist/<variant>/variants/*.whl`` as a ``variant-`` artifact (a
    ``wheel-*`` name would land them among the plain wheels, where their labelled names are
    refused); a job that runs ``opforge index DIST`` downloads such artifacts into
    ``DIST/wheel-variants``; and a workflow that publishes them attests them."""
    jobs = {k: v for k, v in wf.jobs.items() if isinstance(v, dict)}
    variant_downloads = False
    attested = False
    for job_id, job in jobs.items():
        where = f"jobs.{job_id}"
        steps = list(steps_of(job))
        builds = any("--variants" in str(step.get("run", "")) and
                     any(c.subcommand == "build" for c in _opforge_commands(step))
                     for step, _ in steps)
        uploads, downloads, dists = [], [], []
        for step, swhere in steps:
            given = step.get("with") if isinstance(step.get("with"), dict) else {}
            action = action_name(step.get("uses"))
            if action == "actions/upload-artifact" and "/variants/" in str(given.get("path", "")):
                uploads.append((swhere, str(given.get("name", ""))))
            if action == "actions/download-artifact" and \
                    str(given.get("pattern") or given.get("name") or "").startswith(
                        VARIANT_ARTIFACT):
                downloads.append((swhere, str(given.get("path", "")).rstrip("/")))
            if action in ATTEST and VARIANT_DIR in str(given.get("subject-path", "")):
                attested = True
            dists += [_index_dist(c) for c in _opforge_commands(step) if c.subcommand == "index"]
        if builds and not uploads:
            report(wf, line_of(job), where,
                   "builds wheel variants (opforge build --variants) but uploads none: add an "
                   "actions/upload-artifact of dist/<variant>/variants/*.whl named "
                   f"{VARIANT_ARTIFACT}<the wheel's artifact>")
        for swhere, name in uploads:
            if not name.startswith(VARIANT_ARTIFACT):
                report(wf, line_of(job), f"{where}.{swhere}",
                       f"uploads wheel variants as {name or '(no name)'}: name the artifact "
                       f"{VARIANT_ARTIFACT}<the wheel's artifact>; the release downloads "
                       f"{VARIANT_ARTIFACT}wheel-* apart from the plain wheels")
        variant_downloads |= bool(downloads and dists)
        for swhere, path in downloads if dists else []:
            wanted = {f"{d}/{VARIANT_DIR}" for d in dists}
            if path not in wanted:
                report(wf, line_of(job), f"{where}.{swhere}",
                       f"downloads wheel variants into {path or '(the workspace)'}, but opforge "
                       f"index reads them from {' or '.join(sorted(wanted))}")
    if variant_downloads and not attested and any(
            PYPI_PUBLISH in _actions(j) or DEPLOY_PAGES in _actions(j) for j in jobs.values()):
        report(wf, line_of(wf.data, "jobs"), "jobs",
               f"publishes wheel variants no job attested: add an attestation over "
               f"<dist>/{VARIANT_DIR}/*.whl")
