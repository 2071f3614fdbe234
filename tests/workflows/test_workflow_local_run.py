"""ci.yml's jobs for the cpu-linux-x86_64-py3.11 cell, run here step by step.

ci.yml's `wheels` job calls reusable-build-smoke.yml (the workflow other repositories call)
with `opforge: .`; the emulator follows the call with those inputs. Its matrix job, build job
and smoke job run every step in order, exactly as written (see workflow_emulator.py for what
stands in for the runner and the four actions). The
test checks what a maintainer would look at on GitHub: the wheel is built and uploaded under
the cell's artifact name, the smoke job downloads it into a fresh workspace and passes, and
JUnit XML and a step summary come out.

Two local values differ from GitHub: OPFORGE_TORCH_INDEX=pypi (download.pytorch.org is not
reachable from the development machines; the workflow itself uses the matrix's index; an
OPFORGE_TORCH_INDEX already set keeps that) and MAX_JOBS=1 (shared cores); on GitHub neither
is changed. The build job's workspace persists between runs (like a self-hosted
runner), so a second run reuses the compiled objects; set OPFORGE_EMULATOR_CACHE to move it.
"""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CELL = "cpu-linux-x86_64-py3.11"

pytestmark = pytest.mark.slow

workflow_emulator = pytest.importorskip("workflow_emulator")


def _cache_dir() -> Path:
    configured = os.environ.get("OPFORGE_EMULATOR_CACHE")
    if configured:
        return Path(configured)
    import platformdirs

    return platformdirs.user_cache_path("opforge") / "workflow-emulator"


def _explain(job) -> str:
    lines = [f"job {job.job}: {job.status}"]
    for step in job.steps:
        lines.append(f"  [{step.outcome}] {step.name} ({step.seconds:.1f}s) {step.command}")
        if step.outcome == "failure":
            lines.extend("      " + line for line in step.output.splitlines()[-40:])
    return "\n".join(lines)


def test_a_linux_cpu_cell_of_ci_runs_here_build_upload_download_smoke(tmp_path, capsys):
    if not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout: actions/checkout is emulated from git ls-files")
    wf = workflow_emulator.load_workflow(ROOT / ".github" / "workflows" / "ci.yml")
    local = {}
    if os.environ.get("GITHUB_ACTIONS") != "true":
        local = {"OPFORGE_TORCH_INDEX": os.environ.get("OPFORGE_TORCH_INDEX", "pypi"),
                 "MAX_JOBS": os.environ.get("MAX_JOBS", "1")}
    caller = workflow_emulator.Runner(wf, ROOT, tmp_path, extra_env=local)
    runner = caller.call("wheels")
    assert runner.wf.path.name == "reusable-build-smoke.yml"
    assert runner.inputs["opforge"] == "."  # this repository is opforge: from the checkout

    matrix = runner.run_job("matrix")
    assert matrix.status == "success", _explain(matrix)
    cell = workflow_emulator.select_cell(matrix.outputs["matrix"], CELL)
    assert (cell["runner"], cell["container"], cell["variant"]) == \
        ("ubuntu-24.04", "quay.io/pypa/manylinux_2_28_x86_64", "cpu")

    # the build job's cells: every legacy cell, a stable-ABI variant once per platform
    assert workflow_emulator.select_cell(matrix.outputs["builds"], CELL) == cell
    # no Docker here: the emulator runs the cell's steps on this host instead of in its
    # manylinux_2_28 image (the wheel's glibc floor is then this host's; inspect checks it)
    cell = {**cell, "container": "", "container_python": ""}
    builds = json.loads(matrix.outputs["builds"])["include"]
    assert len([c for c in builds if c["abi"] == "stable"]) < \
        len([c for c in json.loads(matrix.outputs["matrix"])["include"] if c["abi"] == "stable"])
    assert matrix.outputs["has_compat"] in ("true", "false")
    build_workspace = _cache_dir() / CELL / "build" / "workspace"
    build = runner.run_job("build", cell, workspace=build_workspace)
    assert build.status == "success", _explain(build)
    uploaded = sorted((tmp_path / "artifacts" / cell["artifact"]).glob("*.whl"))
    assert len(uploaded) == 1, uploaded
    wheel = uploaded[0].name
    assert wheel.startswith("opforge_ops-0.1.0+cpu-cp311-cp311-") and "manylinux" in wheel

    smoke = runner.run_job("smoke", cell)
    assert smoke.status == "success", _explain(smoke)
    workspace = tmp_path / "job-smoke" / "workspace"
    assert workspace != build_workspace
    downloaded = workspace / "wheelhouse" / wheel
    assert downloaded.read_bytes() == uploaded[0].read_bytes()
    assert not (workspace / "dist").exists()  # nothing from the build job's workspace

    junit = ET.parse(workspace / "reports" / f"smoke-{CELL}.xml").getroot()
    suites = [junit] if junit.tag == "testsuite" else list(junit)
    assert sum(int(s.get("tests", 0)) for s in suites) > 0
    assert sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites) == 0
    assert (workspace / "reports" / f"smoke-{CELL}.json").exists()
    summary = smoke.step("smoke").summary
    assert "nms" in summary and "roi_align" in summary, summary

    # every step of the three jobs ran (none skipped) and passed, in ci.yml's order
    for job in (matrix, build, smoke):
        assert [s.outcome for s in job.steps] == ["success"] * len(job.steps), _explain(job)
    ran = [s.command.split("\n")[0] for job in (matrix, build, smoke) for s in job.steps]
    assert any(c.startswith("opforge matrix --github") for c in ran), ran
    assert '"$CELL_PYTHON" -m pip install "$OPFORGE_REQUIREMENT"' in ran
    assert '"$CELL_PYTHON" -m opforge build --variant "$VARIANT" --out "dist/$VARIANT"' in ran
    with capsys.disabled():
        print("\n" + "\n".join(_explain(job) for job in (matrix, build, smoke)))
