"""Stable-ABI variants in matrix.yaml: abi, torch_floor, compat_torch; build and compat cells."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from opforge.cli import main
from opforge.matrix import MatrixError, build_jobs, compat_jobs, load_matrix

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).parent / "fixtures" / "matrix.yaml"  # see test_matrix.py
DEFAULT = FIXTURE.read_text()
STABLE = """  - name: cpu_stable
    platforms: [linux-x86_64, linux-aarch64, macos-arm64]
    abi: stable
    torch_floor: "2.10"
    compat_torch: ["floor", "matrix", "2.14.1", "latest"]
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "matrix.yaml"
    path.write_text(text)
    return path


def test_shipped_stable_variant_is_typed():
    matrix = load_matrix(FIXTURE)
    v = matrix.variant("cpu_stable")
    assert v.stable and v.abi == "stable" and v.torch_floor
    assert v.local_version == "cpu.stable"           # a PEP 440 local label, as pip spells it
    assert v.torch_requirement_floor == f"torch>={v.torch_floor}"
    assert matrix.variant("cpu").abi == "legacy" and matrix.variant("cpu").torch_floor is None
    # words resolved: floor -> the floor as a release, matrix -> the variant's build torch
    assert matrix.compat_torches(v)[:2] == [f"{v.torch_floor}.0", matrix.torch.version]
    assert matrix.compat_torches(v)[-1] == "latest"
    # a stable variant's torch index is its accelerator's, not its name's
    assert matrix.torch_index(v).endswith("/whl/cpu")


def test_stable_variant_builds_once_per_platform_and_smokes_every_python():
    matrix = load_matrix(FIXTURE)
    cells = matrix.jobs(variant="cpu_stable")
    assert len(cells) == 3 * len(matrix.pythons)
    builds = build_jobs(cells, matrix.pr_python)
    assert [(j.platform.name, j.python) for j in builds] == [
        ("linux-x86_64", matrix.pr_python), ("linux-aarch64", matrix.pr_python),
        ("macos-arm64", matrix.pr_python)]
    # every cell of a platform smokes the one wheel its build cell uploads
    for cell in cells:
        assert cell.artifact == f"wheel-cpu_stable-{cell.platform.name}-abi3"
    assert compat_jobs(cells, matrix.pr_python) == builds
    legacy = matrix.jobs(variant="cpu")
    assert build_jobs(legacy, matrix.pr_python) == legacy and not compat_jobs(legacy)
    # filtered to one Python that is not pr_python, the build cell is that Python's
    only = matrix.jobs(variant="cpu_stable", python="3.13")
    assert [j.python for j in build_jobs(only, matrix.pr_python)] == ["3.13"] * 3


def test_extension_block_sets_the_default_abi(tmp_path):
    text = DEFAULT.replace("  namespace: opforge ", "  namespace: opforge\n  abi: stable\n"
                                                    "  torch_floor: \"2.11\"\n  ", 1)
    matrix = load_matrix(_write(tmp_path, text))
    assert matrix.variant("cpu").stable and matrix.variant("cpu").torch_floor == "2.11"
    assert matrix.variant("cpu").compat_torch == ("floor", "matrix", "latest")
    # a variant keeps its own floor
    assert matrix.variant("cpu_stable").torch_floor == "2.10"


def test_cli_stage_builds_and_compat():
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    run = [sys.executable, "-m", "opforge", "matrix", "--file", str(FIXTURE),
           "--json", "--variant", "cpu_stable", "--stage"]
    builds = json.loads(subprocess.run(run + ["builds"], capture_output=True, text=True,
                                       env=env).stdout)
    assert [c["platform"] for c in builds] == ["linux-x86_64", "linux-aarch64", "macos-arm64"]
    assert builds[0]["abi"] == "stable" and builds[0]["torch_floor"] == "2.10"
    assert builds[0]["compat_torch"] == "floor,matrix,2.14.1,latest"


def _swap(old: str, new: str) -> str:
    assert old in DEFAULT
    return DEFAULT.replace(old, new, 1)


BAD = [
    ("abi-unknown", 'abi: stable', 'abi: stabel', "variants[5].abi", "not one of legacy, stable"),
    ("floor-missing", '    torch_floor: "2.10"\n', '', "variants[5].torch_floor",
     "abi: stable needs torch_floor"),
    ("floor-not-version", 'torch_floor: "2.10"', 'torch_floor: "two"', "variants[5].torch_floor",
     "not a torch release"),
    ("floor-prerelease", 'torch_floor: "2.10"', 'torch_floor: "2.10.0rc1"',
     "variants[5].torch_floor", "no pre-release"),
    ("floor-below-stable-abi", 'torch_floor: "2.10"', 'torch_floor: "2.8"',
     "variants[5].torch_floor", "starts with torch 2.9"),
    ("floor-above-build-torch", 'torch_floor: "2.10"\n    compat_torch: ["floor", "matrix", "2.14.1", "latest"]',
     'torch_floor: "2.15"\n    compat_torch: ["floor"]',
     "variants[5].torch_floor", "above torch.version 2.13.0"),
    ("floor-unquoted", 'torch_floor: "2.10"', 'torch_floor: 2.10', "variants[5].torch_floor",
     "expected a string"),
    ("compat-bad-word", '"latest"]', '"newest"]', "variants[5].compat_torch[3]",
     "nor one of floor, matrix, latest, nightly"),
    ("compat-below-floor", '"2.14.1", "latest"]', '"2.9.1", "latest"]', "variants[5].compat_torch",
     "below torch_floor 2.10"),
    ("compat-local", '"2.14.1", "latest"]', '"2.14.1+cpu", "latest"]', "variants[5].compat_torch[2]", "no local part"),
    ("compat-duplicate", '"2.14.1", "latest"]', '"2.14.1", "2.14.1"]',
     "variants[5].compat_torch[3]", "listed twice"),
    ("floor-on-legacy", "    abi: stable\n", "", "variants[5].torch_floor",
     "applies to abi: stable"),
    ("name-not-local-label", "name: cpu_stable", "name: cpu_stable_", "variants[5].name",
     "PEP 440 local version label"),
]


@pytest.mark.parametrize("case_id,old,new,key,words", BAD, ids=[b[0] for b in BAD])
def test_bad_stable_fields_are_one_line_exit_2(tmp_path, capsys, case_id, old, new, key, words):
    path = _write(tmp_path, _swap(old, new))
    with pytest.raises(MatrixError) as info:
        load_matrix(path)
    message = str(info.value)
    assert "\n" not in message and f": {key}:" in message and words in message, message
    assert main(["matrix", "--file", str(path)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and key in err
