"""actionlint, GitHub's workflow schema and zizmor accept the real workflows and reject broken ones.

These are the other checks `nox -s lint` runs. check-jsonschema's `vendor.github-workflows`
schema ships inside the package: the run below has no network (a dead proxy, and no network
namespace at all where `unshare -n` is allowed), so CI cannot pass only because a download did.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
BROKEN = """name: broken
on: push
permissions:
  contents: read
jobs:
  a:
    runs-on: ubuntu-24.04
    timeout-minutes: "soon"
    needs: nowhere
    steps:
      - run: nox -s lint
        uses: actions/checkout@v4
"""


def tool(name: str) -> str:
    found = Path(sys.executable).with_name(name)
    path = str(found) if found.exists() else shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed: pip install -e '.[lint]' (nox -s lint has it)")
    return path


def offline(cmd: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9",
           "NO_PROXY": ""}
    unshare = shutil.which("unshare")
    if unshare and subprocess.run([unshare, "-n", "true"], capture_output=True).returncode == 0:
        cmd = [unshare, "-n", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)


def test_the_callers_and_the_reusable_workflows_exist():
    assert [p.name for p in WORKFLOWS] == ["bisect.yml", "ci.yml", "nightly.yml", "release.yml",
                                           "reusable-bisect.yml", "reusable-build-smoke.yml",
                                           "reusable-nightly.yml", "reusable-release.yml"]


def init_callers(root: Path) -> list[Path]:
    """The caller workflows `opforge init` writes for a small extension at ``root``."""
    from opforge.cli import main

    (root / "csrc").mkdir()
    (root / "csrc" / "ops.cpp").write_text('TORCH_LIBRARY(demo, m) { m.def("f(Tensor x) '
                                           '-> Tensor"); }\n')
    (root / "demo").mkdir()
    (root / "demo" / "__init__.py").write_text("")
    (root / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    assert main(["init", str(root), "--workflows-ref", "b" * 40]) == 0
    written = sorted((root / ".github" / "workflows").glob("*.yml"))
    assert len(written) == 3
    return written


def test_actionlint_accepts_the_callers_opforge_init_writes(tmp_path, capsys):
    written = init_callers(tmp_path)
    result = subprocess.run([tool("actionlint"), *map(str, written)], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_actionlint_accepts_the_workflows():
    result = subprocess.run([tool("actionlint"), *map(str, WORKFLOWS)], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_actionlint_rejects_a_broken_workflow(tmp_path):
    broken = tmp_path / "broken.yml"
    broken.write_text(BROKEN)
    result = subprocess.run([tool("actionlint"), str(broken)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 1
    assert "nowhere" in result.stdout  # needs: a job that does not exist


def test_the_github_workflow_schema_accepts_the_workflows_offline():
    result = offline([tool("check-jsonschema"), "--builtin-schema", "vendor.github-workflows",
                      *map(str, WORKFLOWS)])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok -- validation done" in result.stdout


def test_the_github_workflow_schema_rejects_a_broken_workflow_offline(tmp_path):
    broken = tmp_path / "broken.yml"
    broken.write_text(BROKEN)
    result = offline([tool("check-jsonschema"), "--builtin-schema", "vendor.github-workflows",
                      str(broken)])
    assert result.returncode == 1
    assert "timeout-minutes" in result.stdout or "jobs.a" in result.stdout


# zizmor: the workflows' security audit, offline (its online audits ask GitHub's API)
INJECTED = """name: injected
on: pull_request
permissions:
  contents: read
jobs:
  a:
    runs-on: ubuntu-24.04
    timeout-minutes: 5
    steps:
      - run: echo "${{ github.event.pull_request.title }}"
"""


def zizmor(*paths: Path) -> subprocess.CompletedProcess:
    return offline([tool("zizmor"), "--offline", "--no-progress", "--format", "plain",
                    *map(str, paths)])


def test_zizmor_finds_nothing_in_the_workflows_offline():
    result = zizmor(*WORKFLOWS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "No findings to report" in result.stdout + result.stderr


def test_zizmor_finds_nothing_in_the_callers_opforge_init_writes(tmp_path):
    result = zizmor(*init_callers(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr


def test_zizmor_catches_an_expression_expanded_into_a_run_script(tmp_path):
    injected = tmp_path / "injected.yml"
    injected.write_text(INJECTED)
    result = zizmor(injected)
    assert result.returncode != 0
    assert "template-injection" in result.stdout
