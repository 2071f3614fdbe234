"""ci.yml's jobs for the cpu-linux-x86_64-py3.11 cell, replayed by act (a real Actions engine).

ci.yml's `wheels` job calls reusable-build-smoke.yml (the workflow other repositories call)
with `opforge: .`; act follows the call, runs its matrix job, expands the build and smoke jobs
from the matrix job's outputs (keeping this cell: --matrix name:<cell>) and runs every step
as written, on this host (see act_replay.py for what stands in for GitHub's actions). The test
checks what a maintainer would look at on GitHub: the wheel is built and uploaded under the
cell's artifact name, the smoke job downloads it into a fresh workspace and passes, and JUnit
XML and a step summary come out.

Local differences from GitHub, each said where it is made:
* no Docker here: the replayed copy of the repository gives linux-x86_64 no image, so the
  cell's jobs run on the host instead of in quay.io/pypa/manylinux_2_28_x86_64 (the wheel's
  glibc floor is then this host's; `opforge inspect` checks it). Everything else in the cell is
  the real matrix's, and the test checks that;
* OPFORGE_TORCH_INDEX=pypi (download.pytorch.org is not reachable from the development
  machines; an OPFORGE_TORCH_INDEX already set keeps that) and MAX_JOBS=1 (shared cores).
The compiler cache is this host's (~/.cache/opforge/sccache, what actions/cache restores on
GitHub), so a second replay compiles little. Minutes: marker `replay`, run by `nox -s replay`;
test_workflow_act.py keeps a cheap act run in the default suite.
"""

from __future__ import annotations

import json
import os
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from act_replay import act_executable, replay, source_copy

from opforge.matrix import load_matrix

ROOT = Path(__file__).resolve().parents[2]
CELL = "cpu-linux-x86_64-py3.11"

pytestmark = [pytest.mark.slow, pytest.mark.replay]


def select_cell(matrix_output: str, name: str) -> dict:
    cells = json.loads(matrix_output)["include"]
    for cell in cells:
        if cell["name"] == name:
            return cell
    raise AssertionError(f"no cell {name!r} in the matrix job's output: "
                         f"{[c['name'] for c in cells]}")


def _sha256s(output: str) -> dict[str, str]:
    return dict(re.findall(r"(\S+\.whl) (?:to|into) \S+ sha256=([0-9a-f]{64})", output))


def test_a_linux_cpu_cell_of_ci_runs_on_act_build_upload_download_smoke(tmp_path, capsys):
    if sys.platform != "linux":
        pytest.skip("the replay runs a Linux cell's jobs on the host: Linux only")
    if not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout: the replayed tree is what git lists")
    assert act_executable(), "act is not installed: it comes with opforge's [test] extra"
    # the real cell, as `opforge matrix --github` makes it from this repository's matrix.yaml
    real = select_cell(json.dumps(load_matrix(ROOT / "matrix.yaml").github_matrix()), CELL)
    assert (real["runner"], real["container"], real["variant"]) == \
        ("ubuntu-24.04", "quay.io/pypa/manylinux_2_28_x86_64", "cpu")
    # no Docker here: the replayed tree's linux-x86_64 has no image (the one local edit)
    source = source_copy(ROOT, tmp_path / "source", {
        "matrix.yaml": (f"    container: {real['container']}\n", "")})
    local = {}
    if os.environ.get("GITHUB_ACTIONS") != "true":
        local = {"OPFORGE_TORCH_INDEX": os.environ.get("OPFORGE_TORCH_INDEX", "pypi"),
                 "MAX_JOBS": os.environ.get("MAX_JOBS", "1")}
    artifacts = tmp_path / "artifacts"
    run = replay(source, "ci.yml", "wheels", runners=[real["runner"]], artifacts=artifacts,
                 env=local, matrix={"name": CELL}, timeout=1800)

    matrix = run.job("matrix")
    # ci.yml's wheels job ran reusable-build-smoke.yml ("opforge build and smoke")
    assert matrix.name == "wheels/opforge build and smoke/matrix"
    assert matrix.status == "success", matrix.explain()
    # the `opforge: .` input: opforge is built from the checkout, not fetched from an index
    assert "Building wheel for opforge" in \
        matrix.step('python -m pip install "$OPFORGE_REQUIREMENT"').output

    outputs = next(s.outputs for s in matrix.steps if "matrix" in s.outputs)
    cell = select_cell(outputs["matrix"], CELL)
    assert cell == {**real, "container": "", "container_python": ""}
    # the build job's cells: every legacy cell, a stable-ABI variant once per platform
    assert select_cell(outputs["builds"], CELL) == cell
    builds = json.loads(outputs["builds"])["include"]
    assert len([c for c in builds if c["abi"] == "stable"]) < \
        len([c for c in json.loads(outputs["matrix"])["include"] if c["abi"] == "stable"])
    assert outputs["has_compat"] in ("true", "false")

    build = run.job("build")
    assert build.name == f"wheels/opforge build and smoke/build {CELL}"
    assert build.status == "success", build.explain()
    uploaded = sorted((artifacts / cell["artifact"]).glob("*.whl"))
    assert len(uploaded) == 1, uploaded
    wheel = uploaded[0].name
    assert wheel.startswith("opforge_ops-0.1.0+cpu-cp311-cp311-") and "manylinux" in wheel
    assert build.step("build").summary.startswith("### opforge build cpu")

    smoke = run.job("smoke")
    assert smoke.status == "success", smoke.explain()
    # a fresh workspace: nothing from the build job's (no dist/), the wheel downloaded
    assert "workspace before checkout: empty" in smoke.step("actions/checkout").output
    up = _sha256s(build.step("actions/upload-artifact").output)
    down = _sha256s(smoke.step("actions/download-artifact").output)
    assert down == up and set(down) == {wheel}, (up, down)

    reports = artifacts / f"smoke-{CELL}"
    junit = ET.parse(reports / f"smoke-{CELL}.xml").getroot()
    suites = [junit] if junit.tag == "testsuite" else list(junit)
    assert sum(int(s.get("tests", 0)) for s in suites) > 0
    assert sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites) == 0
    assert (reports / f"smoke-{CELL}.json").exists()
    summary = smoke.step("smoke").summary
    assert "nms" in summary and "roi_align" in summary, summary

    # every step of the three jobs ran (none skipped) and passed, in ci.yml's order
    for job in (matrix, build, smoke):
        assert [s.outcome for s in job.steps] == ["success"] * len(job.steps), job.explain()
    ran = [s.name for job in (matrix, build, smoke) for s in job.steps]
    assert any(name.startswith("opforge matrix --github") for name in ran), ran
    assert '"$CELL_PYTHON" -m pip install "$OPFORGE_REQUIREMENT"' in ran
    assert "build" in ran and "smoke" in ran
    with capsys.disabled():
        print("\n" + "\n".join(job.explain() for job in (matrix, build, smoke)))
