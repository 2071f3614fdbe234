"""The caller workflows ``opforge init`` writes (CI, nightly canary, bisect), and the commit
of opforge's reusable workflows they are pinned to."""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import yaml

from opforge import __version__, _release
from opforge.errors import UsageError

_COMMIT = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class WorkflowsPin:
    """Which commit of opforge's repository the callers ``uses:``, and the opforge they install."""

    commit: str
    opforge: str       # the pip requirement the reusable workflows install
    source: str        # where the commit came from, for the note init prints


def workflows_pin(explicit: str | None = None) -> WorkflowsPin:
    """``--workflows-ref``, else the commit stamped into this release, else the commit of a
    git checkout of a release (its ``v<version>`` tag on HEAD); a UsageError otherwise: a
    commit in no release may never be published, and every caller pinned to it breaks."""
    release = f"opforge=={__version__}"
    if explicit is not None:
        if not _COMMIT.fullmatch(explicit):
            raise UsageError(f"--workflows-ref {explicit!r}: give the full 40-hex commit of "
                             f"{_release.WORKFLOWS_REPOSITORY} (a tag or branch can be moved; "
                             f"`git ls-remote https://github.com/{_release.WORKFLOWS_REPOSITORY} "
                             f"v{__version__}` prints the release's)")
        return WorkflowsPin(explicit, release, "--workflows-ref")
    if _COMMIT.fullmatch(_release.WORKFLOWS_COMMIT):
        return WorkflowsPin(_release.WORKFLOWS_COMMIT, release, f"the opforge {__version__} release")
    commit, where, folder = _source_commit()
    if commit and _release_tagged(commit, folder):
        return WorkflowsPin(commit, release, f"{where}, tagged v{__version__}")
    if commit:
        raise UsageError(
            f"this opforge ({__version__}) is not a release: {where} is at "
            f"{commit}, a commit in no release of {_release.WORKFLOWS_REPOSITORY}, and "
            "workflows pinned to it break for every caller if it is never published; install "
            "a release (pip install opforge), or pass --workflows-ref <40-hex commit> to pin "
            "that commit knowingly")
    raise UsageError(f"cannot tell which commit of {_release.WORKFLOWS_REPOSITORY} this opforge "
                     f"({__version__}) is, to pin the workflows to; pass --workflows-ref "
                     "<40-hex commit>")


def _release_tagged(commit: str, folder: Path | None) -> bool:
    """The checkout's commit carries this version's release tag (``v<version>``)."""
    if folder is None:
        return False
    try:
        tags = subprocess.run(["git", "-C", str(folder), "tag", "--points-at", commit],
                              capture_output=True, text=True, timeout=30).stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        return False
    return f"v{__version__}" in tags


def _source_commit() -> tuple[str | None, str, Path | None]:
    """The commit of the git checkout this opforge is imported from (a development tree,
    or a ``pip install git+...@commit`` / of a checkout, per its direct_url.json)."""
    try:
        direct = metadata.distribution("opforge").read_text("direct_url.json")
        info = json.loads(direct) if direct else {}
    except (metadata.PackageNotFoundError, ValueError, OSError):
        info = {}
    tree = Path(__file__).resolve().parents[3]  # src/opforge/init/callers.py
    commit = (info.get("vcs_info") or {}).get("commit_id") if isinstance(info, dict) else None
    if isinstance(commit, str) and _COMMIT.fullmatch(commit) and \
            not (tree / "pyproject.toml").is_file():
        return commit, f"the git install of opforge ({info.get('url')})", None
    for folder in (tree, _file_url_path(info.get("url") if isinstance(info, dict) else None)):
        if folder is None or not (folder / "pyproject.toml").is_file():
            continue
        if 'name = "opforge"' not in (folder / "pyproject.toml").read_text(encoding="utf-8"):
            continue
        try:
            head = subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"],
                                  capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            continue
        if _COMMIT.fullmatch(head):
            return head, f"the opforge checkout at {folder}", folder
    return None, "", None


def _file_url_path(url: object) -> Path | None:
    return Path(url[len("file://"):]) if isinstance(url, str) and url.startswith("file://") \
        else None


def render_workflows(matrix_text: str, matrix_file: str, pin: WorkflowsPin) -> dict[str, str]:
    """The three caller workflows, by file name under .github/workflows/."""
    matrix = yaml.safe_load(matrix_text)
    uses = f"{_release.WORKFLOWS_REPOSITORY}/.github/workflows/{{}}@{pin.commit} # v{__version__}"
    given = f"      opforge: {_quoted(pin.opforge)}\n      matrix-file: {_quoted(matrix_file)}\n"
    choices = {"variant": [v["name"] for v in matrix["variants"]],
               "platform": list(matrix["platforms"]),
               "python": [str(p) for p in matrix["pythons"]]}
    inputs = "".join(
        f"      {name}:\n        description: \"matrix.yaml {name}\"\n        type: choice\n"
        f"        options: [{', '.join(_quoted(o) for o in options)}]\n"
        f"        default: {_quoted(options[0])}\n" for name, options in choices.items())
    inputs += "".join(
        f"      {name}:\n        description: \"{text}\"\n        type: string\n"
        "        default: \"\"\n" for name, text in _BISECT_TEXT_INPUTS)
    passed = "".join(f"      {name}: ${{{{ inputs.{name} }}}}\n"
                     for name in [*choices, *(name for name, _ in _BISECT_TEXT_INPUTS)])
    return {
        "opforge-ci.yml": _CI.format(header=_header("build each variant of matrix.yaml and "
                                                    "smoke-test its wheel."),
                                     uses=uses.format("reusable-build-smoke.yml"), given=given),
        "opforge-nightly.yml": _NIGHTLY.format(
            header=_header("every variant against today's torch nightly; "
                           "bisect a failure."),
            uses=uses.format("reusable-nightly.yml"), given=given),
        "opforge-bisect.yml": _BISECT.format(
            header=_header("find the torch nightly that broke a cell (by hand)."),
            inputs=inputs, uses=uses.format("reusable-bisect.yml"), given=passed + given),
    }


_BISECT_TEXT_INPUTS = (
    ("good", "a nightly that passes (YYYY-MM-DD); empty: walk back from bad"),
    ("bad", "a nightly that fails (YYYY-MM-DD); empty: the newest"),
    ("match", "count a failure only when its output matches this regex (empty: any)"),
)


def _header(what: str) -> str:
    return (f"# Written by `opforge init` (opforge {__version__}): {what}\n"
            "# It calls opforge's reusable workflow pinned to a commit; `opforge workflows "
            "check` holds it\n# to matrix.yaml. To move to another opforge release: "
            "`opforge init --force` with that release,\n# or edit the commit, its `# v` "
            "comment and the `opforge` input together (docs/adopt.md).\n")


_TOP = """
permissions:
  contents: read

concurrency:
  group: {group}
  cancel-in-progress: true

jobs:
"""
_CI = ("{header}name: opforge\n\non:\n  push:\n    branches: [main, master]\n  pull_request:\n"
       "  workflow_dispatch:\n" + _TOP.format(
           group="${{{{ github.workflow }}}}-${{{{ github.event.pull_request.number || "
                 "github.ref }}}}") +
       "  wheels:\n    uses: {uses}\n    with:\n{given}")
_NIGHTLY = ("{header}name: opforge nightly\n\non:\n  schedule:\n"
            "    - cron: \"23 7 * * *\"  # torch nightlies are out by about 07:00 UTC\n"
            "  workflow_dispatch:\n" + _TOP.format(
                group="${{{{ github.workflow }}}}-${{{{ github.ref }}}}") +
            "  canary:\n    uses: {uses}\n    with:\n{given}")
_BISECT = ("{header}name: opforge bisect\n\non:\n  workflow_dispatch:\n    inputs:\n{inputs}" +
           _TOP.format(group="${{{{ github.workflow }}}}-${{{{ inputs.variant }}}}-"
                             "${{{{ inputs.platform }}}}-${{{{ inputs.python }}}}") +
           "  bisect:\n    uses: {uses}\n    with:\n{given}")


def _quoted(value: str) -> str:
    return json.dumps(str(value))
