"""A variant as one object: what it promises, where its wheels go, which variant a wheel is."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

from opforge.matrix import load_matrix, promises
from opforge.matrix.dist import identify_wheel, wheel_label, wheel_record

FIXTURE = Path(__file__).parent / "fixtures" / "matrix.yaml"
MODULES = """  modules:
    fix_ops._C: {load: library, functions: [nms]}
    fix_ops._cuda: {backend: cuda, load: library, functions: [nms]}
"""


def _matrix(tmp_path: Path, extra: str = ""):
    text = FIXTURE.read_text()
    if extra:
        text = text.replace("\ntorch:\n", f"\n{extra}\ntorch:\n", 1)
    path = tmp_path / "matrix.yaml"
    path.write_text(text)
    return load_matrix(path)


def test_a_variant_promises_each_ops_keys_and_its_backends_modules(tmp_path):
    matrix = _matrix(tmp_path, MODULES)
    cu = matrix.promises("cu130")
    assert cu.op_keys["nms"] == ("CPU", "CUDA", "Meta", "Autograd", "AutocastCPU", "AutocastCUDA")
    assert cu.op_keys["_roi_align_backward"] == ("CPU", "CUDA", "Meta")
    assert "_roi_align_backward" in cu.backward_ops and "nms" not in cu.backward_ops
    assert [m.name for m in cu.modules] == ["fix_ops._C", "fix_ops._cuda"]
    cpu = matrix.promises(matrix.variant("cpu"))
    assert cpu.op_keys["_roi_align_backward"] == ("CPU", "Meta")
    assert [m.name for m in cpu.modules] == ["fix_ops._C"]   # no CUDA module on cpu
    assert matrix.extension.promises(matrix.variant("cpu")) == cpu


def test_command_line_keys_replace_the_variants_for_every_op():
    matrix = load_matrix(FIXTURE)
    p = promises(matrix.extension, matrix.variant("cu130"), keys=("CPU", "Meta", "Autograd"))
    assert p.op_keys["nms"] == ("CPU", "Meta", "Autograd")
    assert p.op_keys["_roi_align_backward"] == ("CPU", "Meta")
    # no matrix: only the ops and keys given
    bare = promises(None, None, keys=("CPU",), ops=("a",), backward_ops=("_a_backward",))
    assert bare.op_keys == {"a": ("CPU",), "_a_backward": ("CPU",)}
    assert promises(None, None).empty


def test_dist_dir_is_dist_slash_variant_beside_the_matrix(tmp_path):
    matrix = _matrix(tmp_path)
    assert matrix.dist_dir("cu130") == tmp_path / "dist" / "cu130"
    assert matrix.dist_dir(matrix.variant("cpu_stable")) == tmp_path / "dist" / "cpu_stable"


def test_identify_takes_the_build_record_before_the_local_label():
    matrix = load_matrix(FIXTURE)
    assert matrix.identify("cu130", "cpu")[0].name == "cu130"
    assert matrix.identify("cu130", "cpu")[1] == "build record"
    assert matrix.identify(None, "cpu.stable") == (matrix.variant("cpu_stable"), "local version")
    assert matrix.identify(None, "cpu_stable")[0].name == "cpu_stable"
    assert matrix.identify("gone", "gone") is None


def _wheel(folder: Path, filename: str, record: dict | None) -> Path:
    path = folder / filename
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("fix_ops/__init__.py", "")
        if record is not None:
            archive.writestr("fix_ops-1.0.dist-info/opforge-build.json", json.dumps(record))
    return path


def test_a_wheel_is_identified_by_its_record_then_its_file_name(tmp_path):
    matrix = load_matrix(FIXTURE)
    # the PyPI variant's wheel has no local label: its build record says which it is
    pypi = _wheel(tmp_path, "fix_ops-1.0-cp311-cp311-linux_x86_64.whl", {"variant": "cpu"})
    assert wheel_label(pypi) is None and wheel_record(pypi) == {"variant": "cpu"}
    variant, source = identify_wheel(matrix, pypi)
    assert variant.name == "cpu" and source == "fix-ops build record"
    labelled = _wheel(tmp_path, "fix_ops-1.0+cpu.stable-cp310-abi3-linux_x86_64.whl", None)
    assert identify_wheel(matrix, labelled) == (matrix.variant("cpu_stable"),
                                                "local version +cpu.stable")
    # an unreadable wheel is not guessed at: its label still counts, the install says the rest
    broken = tmp_path / "fix_ops-1.0+cu130-cp311-cp311-linux_x86_64.whl"
    broken.write_bytes(b"not a zip")
    assert identify_wheel(matrix, broken)[0].name == "cu130"
    assert identify_wheel(matrix, _wheel(tmp_path, "fix_ops-1.0-py3-none-any.whl", None)) is None
