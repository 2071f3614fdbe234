"""`opforge workflows check` on publishing jobs, in any repository: trusted publishing only,
provenance attested first, write access only where a step needs it, release pins."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from publish_wheelkit import repo_copy

from opforge import __version__, _release
from opforge.cli.commands import check_repository

ROOT = Path(__file__).resolve().parents[2]
PYPI = "pypa/gh-action-pypi-publish@dc37677b2e1c63e2034f94d8a5b11f265b73ba33 # v1.14.2"
ATTEST = "actions/attest-build-provenance@977bb373ede98d70efbf0b7b13af9c3d6651dc60 # v4.1.0"
PAGES = "actions/deploy-pages@d6db90164ac5ed86f2b6aed7e0febac5b3c0c03e # v4.0.5"

GOOD = f"""\
name: publish
on:
  push:
    tags: ["v*"]
permissions:
  contents: read
concurrency:
  group: ${{{{ github.workflow }}}}-${{{{ github.ref }}}}
  cancel-in-progress: true
jobs:
  attest:
    runs-on: ubuntu-24.04
    timeout-minutes: 10
    permissions:
      contents: read
      id-token: write
      attestations: write
    steps:
      - uses: {ATTEST}
        with:
          subject-path: dist/*
  pages:
    needs: attest
    runs-on: ubuntu-24.04
    timeout-minutes: 10
    environment: github-pages
    permissions:
      contents: read
      pages: write
      id-token: write
    steps:
      - uses: {PAGES}
  pypi:
    needs: attest
    runs-on: ubuntu-24.04
    timeout-minutes: 10
    environment: pypi
    permissions:
      contents: read
      id-token: write
    steps:
      - uses: {PYPI}
        with:
          packages-dir: dist/
"""

RULES = ("trusted publishing", "protected environment", "a token upload", "reads a secret",
         "no job attested", "needs pages: write", "needs id-token: write",
         "attesting provenance needs", "nothing here needs more than read",
         "pin third-party actions", "deploy Pages from its environment", "was not released")


def _problems(tmp_path: Path, text: str, name: str = "publish.yml") -> list[str]:
    root = tmp_path / "repo"
    wf = root / ".github" / "workflows"
    wf.mkdir(parents=True, exist_ok=True)
    (wf / name).write_text(text)
    found = check_repository(root, every=True).problems
    return [p for p in found if any(rule in p for rule in RULES)]


def test_a_trusted_publishing_workflow_passes(tmp_path):
    assert _problems(tmp_path, GOOD) == []


@pytest.mark.parametrize("old, new, expected", [
    ("      contents: read\n      id-token: write\n    steps:\n      - uses: pypa",
     "      contents: read\n    steps:\n      - uses: pypa",
     "jobs.pypi: trusted publishing needs id-token: write"),
    ("    environment: pypi\n", "",
     "jobs.pypi: upload from a protected environment"),
    ("          packages-dir: dist/\n",
     "          packages-dir: dist/\n          password: ${{ secrets.PYPI_TOKEN }}\n",
     ".with.password: a token upload"),
    ("permissions:\n  contents: read\nconcurrency",
     "permissions:\n  contents: read\n  id-token: write\nconcurrency",
     "permissions.id-token: 'write': nothing here needs more than read"),
    ("  pypi:\n    needs: attest\n", "  pypi:\n",
     "jobs.pypi: publishes files whose provenance no job attested first"),
    (PYPI, "pypa/gh-action-pypi-publish@release/v1",
     "pin third-party actions and workflows to a full 40-hex commit SHA"),
    ("      pages: write\n", "",
     "jobs.pages: actions/deploy-pages needs pages: write"),
    ("    environment: github-pages\n", "",
     "jobs.pages: deploy Pages from its environment"),
    ("      attestations: write\n", "",
     "jobs.attest: attesting provenance needs attestations: write"),
])
def test_each_broken_rule_is_one_line_naming_the_job(tmp_path, old, new, expected):
    assert old in GOOD
    found = _problems(tmp_path, GOOD.replace(old, new, 1))
    assert any(expected in p for p in found), found
    assert all(p.startswith(".github/workflows/publish.yml:") for p in found)


def test_id_token_on_a_job_that_publishes_nothing_is_flagged(tmp_path):
    text = GOOD + (
        "  build:\n"
        "    runs-on: ubuntu-24.04\n"
        "    timeout-minutes: 10\n"
        "    permissions:\n"
        "      contents: read\n"
        "      id-token: write\n"
        "    steps:\n"
        "      - run: echo build\n")
    assert "build" in yaml.safe_load(text)["jobs"]
    found = _problems(tmp_path, text)
    assert any("jobs.build.permissions.id-token: 'write'" in p for p in found), found


def test_this_repositorys_release_workflows_pass(tmp_path):
    problems = check_repository(ROOT).problems
    assert not [p for p in problems if "release.yml" in p], problems


def test_the_reusable_release_workflow_checks_what_it_promises():
    data = yaml.safe_load((ROOT / ".github/workflows/reusable-release.yml").read_text())
    assert data["permissions"] == {"contents": "read"}
    jobs = data["jobs"]
    with_id_token = {j for j, job in jobs.items()
                     if (job.get("permissions") or {}).get("id-token") == "write"}
    assert with_id_token == {"attest", "pages", "pypi"}
    assert set(jobs["pypi"]["needs"]) >= {"attest"} and set(jobs["pages"]["needs"]) >= {"attest"}
    assert "environment" in jobs["pypi"] and "environment" in jobs["pages"]
    assert "secrets" not in (ROOT / ".github/workflows/reusable-release.yml").read_text()


def test_dropping_the_attestation_from_the_reusable_release_is_caught(tmp_path):
    root = repo_copy(tmp_path / "repo")
    wf = root / ".github/workflows/reusable-release.yml"
    wf.write_text(wf.read_text().replace("    needs: [index, attest]\n", "    needs: index\n"))
    found = check_repository(root).problems
    assert sum("provenance no job attested" in p and "reusable-release.yml" in p
               for p in found) == 2, found


CALLER = """\
name: ci
on: [push]
permissions:
  contents: read
concurrency:
  group: ${{{{ github.workflow }}}}
  cancel-in-progress: true
jobs:
  wheels:
    uses: opforge/opforge/.github/workflows/reusable-build-smoke.yml@{ref} # v{version}
"""


def test_a_pin_to_a_commit_the_named_release_was_not_cut_from_is_flagged(tmp_path, monkeypatch):
    monkeypatch.setattr(_release, "WORKFLOWS_COMMIT", "e" * 40)
    bad = _problems(tmp_path, CALLER.format(ref="d" * 40, version=__version__), "ci.yml")
    assert any("jobs.wheels: pinned to dddddddddddd..., which opforge" in p for p in bad), bad
    good = _problems(tmp_path, CALLER.format(ref="e" * 40, version=__version__), "ci.yml")
    assert good == []
    monkeypatch.setattr(_release, "WORKFLOWS_COMMIT", "")  # a development opforge cannot tell
    assert _problems(tmp_path, CALLER.format(ref="d" * 40, version=__version__), "ci.yml") == []


def _break(tmp_path, name: str, old: str, new: str) -> list[str]:
    root = repo_copy(tmp_path / "repo")
    wf = root / ".github/workflows" / name
    text = wf.read_text()
    assert old in text
    wf.write_text(text.replace(old, new))
    return check_repository(root).problems


@pytest.mark.parametrize("name, old, new, expected", [
    ("reusable-build-smoke.yml", "name: variant-${{ matrix.artifact }}",
     "name: ${{ matrix.artifact }}-variants",
     "uploads wheel variants as ${{ matrix.artifact }}-variants: name the artifact variant-"),
    ("reusable-build-smoke.yml", "path: dist/${{ matrix.variant }}/variants/*.whl",
     "path: dist/${{ matrix.variant }}/extra/*.whl",
     "builds wheel variants (opforge build --variants) but uploads none"),
    ("reusable-release.yml", "          path: dist/wheel-variants\n          merge-multiple: true\n"
     "      - if: inputs.index-url != ''",
     "          path: dist\n          merge-multiple: true\n      - if: inputs.index-url != ''",
     "downloads wheel variants into dist, but opforge index reads them from dist/wheel-variants"),
    ("reusable-release.yml", "          subject-path: dist/wheel-variants/*.whl\n",
     "          subject-path: dist/*.whl\n",
     "publishes wheel variants no job attested"),
])
def test_the_wheel_variants_path_from_build_to_index_is_checked(tmp_path, name, old, new,
                                                                expected):
    found = _break(tmp_path, name, old, new)
    assert [p for p in found if expected in p and name in p], found


def test_the_reusable_workflows_carry_the_wheel_variants_when_asked():
    build = yaml.safe_load((ROOT / ".github/workflows/reusable-build-smoke.yml").read_text())
    release = yaml.safe_load((ROOT / ".github/workflows/reusable-release.yml").read_text())
    for data in (build, release):
        spec = data[True]["workflow_call"]["inputs"]["wheel-variants"]  # YAML 1.1: on is True
        assert spec["type"] == "boolean" and spec["default"] is False
    steps = build["jobs"]["build"]["steps"]
    runs = [s for s in steps if "opforge build" in s.get("run", "")]
    assert [s.get("if") for s in runs] == [None, "inputs.wheel-variants"]
    assert runs[1]["run"] == runs[0]["run"] + " --variants-only"
    index = release["jobs"]["index"]["steps"]
    got = [s["with"] for s in index if "download-artifact" in s.get("uses", "")]
    assert got[1] == {"pattern": "variant-wheel-*", "path": "dist/wheel-variants",
                      "merge-multiple": True}
