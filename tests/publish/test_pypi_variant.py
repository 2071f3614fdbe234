"""The PyPI-clean variant (`pypi: true`), and Linux cells built in a manylinux image."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from publish_wheelkit import make_wheel, repo_copy

from opforge.cli import main
from opforge.matrix import load_matrix
from opforge.stamp import BuildFacts, stamp_wheel
from opforge.wheel_checks import check_against_variant
from opforge.wheels import inspect_wheel

ROOT = Path(__file__).resolve().parents[2]

# hand-written (not tests/projectkit.py): test_bad_pypi_or_container_is_one_line_exit_2 edits
# this text and checks the matrix parser's file:line message on it
MATRIX = """\
extension: {path: ., package: boxops, distribution: boxops, namespace: boxops, ops: [nms]}
torch: {channel: stable, version: "2.13.0"}
pythons: ["3.11"]
pr_python: "3.11"
platforms:
  linux-x86_64: {runner: ubuntu-24.04, container: quay.io/pypa/manylinux_2_28_x86_64}
  macos-arm64: {runner: macos-14}
variants:
  - name: cpu
    platforms: [linux-x86_64, macos-arm64]
    pypi: true
    expected_keys: [CPU, Meta]
  - name: cu130
    platforms: [linux-x86_64]
    cuda: "13.0"
    arch_list: "9.0"
    container: pytorch/manylinux2_28-builder:cuda13.0
    expected_keys: [CPU, CUDA, Meta]
"""


def _matrix(tmp_path: Path, text: str = MATRIX) -> Path:
    path = tmp_path / "matrix.yaml"
    path.write_text(text)
    return path


def test_linux_cells_build_in_the_platform_image_unless_the_variant_names_one(tmp_path):
    matrix = load_matrix(_matrix(tmp_path))
    cells = {job.name: job.as_dict() for job in matrix.jobs()}
    linux_cpu = cells["cpu-linux-x86_64-py3.11"]
    assert linux_cpu["container"] == "quay.io/pypa/manylinux_2_28_x86_64"
    assert linux_cpu["container_python"] == "/opt/python/cp311-cp311/bin/python"
    assert cells["cu130-linux-x86_64-py3.11"]["container"] == "pytorch/manylinux2_28-builder:cuda13.0"
    assert cells["cpu-macos-arm64-py3.11"]["container"] == ""
    assert linux_cpu["pypi"] is True and cells["cu130-linux-x86_64-py3.11"]["pypi"] is False


def test_the_repositorys_linux_cells_all_build_in_a_manylinux_2_28_image():
    for job in load_matrix(ROOT / "matrix.yaml").jobs():
        if job.platform.os == "linux":
            assert "manylinux_2_28" in job.container or "manylinux2_28" in job.container, job.name


@pytest.mark.parametrize("old, new, words", [
    ("    expected_keys: [CPU, CUDA, Meta]\n",
     "    expected_keys: [CPU, CUDA, Meta]\n    pypi: true\n",
     ["variants[1].pypi", "'cpu' and 'cu130' both go to PyPI for linux-x86_64"]),
    ("    pypi: true\n", "    pypi: maybe\n", ["variants[0].pypi"]),
    ("  macos-arm64: {runner: macos-14}", "  macos-arm64: {runner: macos-14, container: x/y:1}",
     ["platforms.macos-arm64.container", "only Linux platforms"]),
    ("container: quay.io/pypa/manylinux_2_28_x86_64", "container: 'not an image!'",
     ["platforms.linux-x86_64.container", "not a container image reference"]),
])
def test_bad_pypi_or_container_is_one_line_exit_2(tmp_path, capsys, old, new, words):
    assert old in MATRIX
    path = _matrix(tmp_path, MATRIX.replace(old, new, 1))
    assert main(["matrix", "--file", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("opforge matrix: error: matrix.yaml:"), err
    for word in words:
        assert word in err[0]


def _raw_wheel(tmp_path: Path) -> Path:
    return make_wheel(tmp_path / "raw", "boxops", "1.0", tag="py3-none-any",
                      requires=("torch",), requires_python=">=3.10",
                      description="# boxops\n\nDetection ops.\n")


def test_the_pypi_variant_is_stamped_without_a_local_label(tmp_path):
    variant = load_matrix(_matrix(tmp_path)).variant("cpu")
    facts = BuildFacts(variant="cpu", torch_version="2.13.0+cpu",
                       local_version=variant.wheel_local_version or "")
    result = stamp_wheel(_raw_wheel(tmp_path), tmp_path / "out", facts)
    assert result.wheel.name == "boxops-1.0-py3-none-any.whl"
    assert result.record["variant"] == "cpu" and result.record["version"] == "1.0"
    report = inspect_wheel(result.wheel)
    assert report.pypi_clean and report.local_version is None
    assert report.torch_requirement == "torch==2.13.0"
    assert not [p for p in check_against_variant(report, variant) if "local version" in p]


def test_a_labelled_wheel_contradicts_the_pypi_variant_and_vice_versa(tmp_path):
    matrix = load_matrix(_matrix(tmp_path))
    labelled = stamp_wheel(_raw_wheel(tmp_path), tmp_path / "a",
                           BuildFacts(variant="cpu", torch_version="2.13.0")).wheel
    assert "+cpu" in labelled.name
    problems = check_against_variant(inspect_wheel(labelled), matrix.variant("cpu"))
    assert any("local version is cpu, expected none (variant cpu goes to PyPI" in p
               for p in problems)
    clean = stamp_wheel(_raw_wheel(tmp_path), tmp_path / "b",
                        BuildFacts(variant="cu130", torch_version="2.14.1",
                                   local_version="")).wheel
    problems = check_against_variant(inspect_wheel(clean), matrix.variant("cu130"))
    assert any("local version is missing, expected +cu130" in p for p in problems)


def test_inspect_says_a_wheel_is_pypi_clean(tmp_path, capsys):
    facts = BuildFacts(variant="cpu", torch_version="2.13.0", local_version="")
    wheel = stamp_wheel(_raw_wheel(tmp_path), tmp_path / "out", facts).wheel
    assert main(["inspect", str(wheel), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["pypi_clean"] is True
    assert main(["inspect", str(wheel)]) == 0
    assert "PyPI accepts it" in capsys.readouterr().out




def test_the_pypi_variants_wheel_passes_twine_check(tmp_path):
    pytest.importorskip("twine", reason="twine check needs twine (pip install opforge[test])")
    facts = BuildFacts(variant="cpu", torch_version="2.13.0", local_version="")
    wheel = stamp_wheel(_raw_wheel(tmp_path), tmp_path / "out", facts).wheel
    run = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", str(wheel)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "PASSED" in run.stdout
    with zipfile.ZipFile(wheel) as zf:
        record = json.loads(zf.read("boxops-1.0.dist-info/opforge-build.json"))
    assert record["variant"] == "cpu"


# --- workflows check: a build cell runs in the image ----------------------------------------


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return repo_copy(tmp_path / "repo")


def _problems(root: Path) -> list[str]:
    from opforge.cli.commands import check_workflows

    return check_workflows(root)


def test_a_build_cell_straight_on_the_runner_is_flagged(repo):
    wf = repo / ".github/workflows/reusable-build-smoke.yml"
    text = wf.read_text()
    # the build job's one container line (the image comment is on the line above it)
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("container: ${{ matrix.container }}"))
    wf.write_text(text.replace(line + "\n", "", 1))
    found = [p for p in _problems(repo) if "builds wheels straight on the runner" in p]
    assert len(found) == 1 and found[0].startswith(".github/workflows/reusable-build-smoke.yml:")
    assert "jobs.build" in found[0]


def test_a_typed_platform_image_is_flagged(repo):
    wf = repo / ".github/workflows/reusable-build-smoke.yml"
    text = wf.read_text()
    wf.write_text(text.replace("container: ${{ matrix.container }}  # zizmor",
                               "container: quay.io/pypa/manylinux_2_28_x86_64  # zizmor", 1))
    found = _problems(repo)
    assert any("'quay.io/pypa/manylinux_2_28_x86_64' typed in the workflow" in p for p in found)


def test_unbroken_copy_has_no_container_problem(repo):
    assert not [p for p in _problems(repo) if "straight on the runner" in p or "typed" in p]


