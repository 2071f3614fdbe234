"""Wheel variants (PEP 825 draft) of a matrix variant's wheel: `build --variants`, `inspect`."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from variants_kit import CPU, CU130, NAME, ROCM, rewrite_member, variant_wheels, write_matrix

from opforge import variants
from opforge.cli import main
from opforge.matrix import load_matrix

pytest.importorskip("variantlib", reason="wheel variants need variantlib (opforge[variants])")


def _members(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as archive:
        return {n: archive.read(n) for n in archive.namelist()}


def test_the_names_opforge_uses_are_variantlibs():
    from variantlib import constants

    assert variants.DIST_INFO_FILE == constants.VARIANT_DIST_INFO_FILENAME
    assert variants.NULL_LABEL == constants.NULL_VARIANT_LABEL
    for name in ("x-1.0-py3-none-any-cu130.whl", "x-1.0-1-py3-none-any-cu130.whl",
                 "x-1.0-py3-none-any.whl", "x-1.0-1-py3-none-any.whl"):
        match = constants.VALIDATION_WHEEL_NAME_REGEX.fullmatch(name)
        assert variants.split_label(name)[1] == match.group("variant_label"), name
        assert variants.split_label(name)[0] == match.group("base_wheel_name") + ".whl"


def test_each_backend_maps_its_variant_in_one_place(tmp_path):
    matrix = load_matrix(write_matrix(tmp_path, CPU, CU130, ROCM))
    cuda = variants.spec_of(matrix.variant("cu130"))
    assert cuda.label == "cu130"
    assert cuda.properties == ("nvidia :: cuda_version_lower_bound :: 13.0",
                               "nvidia :: sm_arch :: 120_real", "nvidia :: sm_arch :: 120_virtual",
                               "nvidia :: sm_arch :: 90_real")
    assert cuda.provider[0] == "nvidia"
    cpu = variants.spec_of(matrix.variant("cpu"))
    assert cpu.null and cpu.label == "null"
    rocm = variants.spec_of(matrix.variant("rocm64"))
    assert rocm.properties == ("amd :: gfx_arch :: gfx942", "amd :: rocm_version_lower_bound :: 6.4")
    assert rocm.provider is None


def test_the_cuda_variant_wheel_is_written_by_variantlib_and_installs(tmp_path):
    from variantlib.variant_dist_info import VariantDistInfo

    [wheel] = variant_wheels(tmp_path, write_matrix(tmp_path), "cu130")
    assert wheel.name == f"{NAME}-1.0-py3-none-any-cu130.whl"
    assert wheel.parent == tmp_path / "dist" / "cu130" / "variants"
    files = _members(wheel)
    info = f"{NAME}-1.0.dist-info"
    assert not [n for n in files if "+cu130" in n]  # the public version everywhere
    assert "Version: 1.0\n" in files[f"{info}/METADATA"].decode()
    read = VariantDistInfo(files[f"{info}/variant.json"], "cu130")
    assert sorted(p.to_str() for p in read.variant_desc.properties) == \
        list(variants.spec_of(load_matrix(tmp_path / "matrix.yaml").variant("cu130")).properties)
    assert read.namespace_priorities == ["nvidia"]
    record = json.loads(files[f"{info}/opforge-build.json"])
    assert record["variant"] == "cu130" and record["version"] == "1.0"
    assert record["wheel_variant"]["label"] == "cu130"
    # RECORD lists every member with its real hash
    rows = list(csv.reader(io.StringIO(files[f"{info}/RECORD"].decode())))
    assert {r[0] for r in rows} == set(files)
    for name, digest, size in rows:
        if digest:
            want = base64.urlsafe_b64encode(hashlib.sha256(files[name]).digest()).rstrip(b"=")
            assert digest == f"sha256={want.decode()}" and int(size) == len(files[name])
    # an installer takes it as the wheel it is (pip refuses a label it does not know, so the
    # installer's view is the base name: the same bytes under the name without its label)
    plain = tmp_path / variants.split_label(wheel.name)[0]
    plain.write_bytes(wheel.read_bytes())
    target = tmp_path / "target"
    run = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index",
                          "--target", str(target), str(plain)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "BUILD = 'cu130'" in (target / NAME / "__init__.py").read_text()


def test_the_null_variant_gets_a_labelled_wheel_and_a_plain_copy(tmp_path):
    labelled, plain = variant_wheels(tmp_path, write_matrix(tmp_path), "cpu")
    assert labelled.name == f"{NAME}-1.0-py3-none-any-null.whl"
    assert plain.name == f"{NAME}-1.0-py3-none-any.whl"
    with_json, without = _members(labelled), _members(plain)
    dist_info = f"{NAME}-1.0.dist-info/variant.json"
    assert dist_info in with_json and dist_info not in without
    # the null variant's variant.json lists the package's providers (the format asks it)
    assert json.loads(with_json[dist_info])["providers"].keys() == {"nvidia"}
    assert {n: d for n, d in with_json.items() if not n.endswith(("RECORD", "variant.json"))} \
        == {n: d for n, d in without.items() if not n.endswith("RECORD")}
    # a second build replaces the first's variant wheels, none left over
    variant_wheels(tmp_path, tmp_path / "matrix.yaml", "cpu", "1.1")
    assert sorted(p.name for p in labelled.parent.iterdir()) == [
        f"{NAME}-1.1-py3-none-any-null.whl", f"{NAME}-1.1-py3-none-any.whl"]


def test_a_variant_no_provider_answers_for_is_refused_before_the_build(tmp_path, capsys):
    matrix = write_matrix(tmp_path, CPU, CU130, ROCM)
    assert main(["build", "--variant", "rocm64", "--variants", "--file", str(matrix)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no variant provider plugin is published" in err
    assert not (tmp_path / "dist").exists() and not (tmp_path / "build").exists()
    # a matrix of CPU builds alone has nothing to select between
    alone = write_matrix(tmp_path / "cpu-only", CPU)
    assert main(["build", "--variant", "cpu", "--variants", "--dry-run", "--file",
                 str(alone)]) == 2
    assert "no variant of the matrix has properties" in capsys.readouterr().err


def test_dry_run_says_what_the_wheel_variant_will_be_and_that_it_follows_drafts(tmp_path,
                                                                                 capsys):
    matrix = write_matrix(tmp_path)
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "boxops"\nversion = "1.0"\n')
    assert main(["build", "--variant", "cu130", "--variants", "--dry-run", "--file",
                 str(matrix)]) == 0
    out, err = capsys.readouterr()
    assert "wheel variant of cu130: label cu130, nvidia :: cuda_version_lower_bound :: 13.0" in out
    drafts = [line for line in err.splitlines() if "drafts" in line]
    assert len(drafts) == 1 and "PEP 825" in drafts[0] and "variantlib 0.2.2" in drafts[0]


def test_build_variants_writes_the_variant_wheels_beside_the_normal_one(tmp_path, capsys):
    """A real `opforge build` of a pure-Python project (no compile) in this interpreter."""
    project = tmp_path / "project"
    (project / NAME).mkdir(parents=True)
    (project / NAME / "__init__.py").write_text("X = 1\n")
    (project / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=64"]\nbuild-backend = "setuptools.build_meta"'
        f'\n[project]\nname = "{NAME}"\nversion = "2.0"\ndependencies = ["torch"]\n'
        f'[tool.setuptools]\npackages = ["{NAME}"]\n')
    matrix = write_matrix(project)
    code = main(["build", "--variant", "cpu", "--variants", "--file", str(matrix), "--python",
                 sys.executable, "--no-install", "--no-compiler-cache"])
    out = capsys.readouterr().out.split()
    assert code == 0
    dist = project / "dist" / "cpu"
    assert out[-3:] == [str(dist / f"{NAME}-2.0+cpu-py3-none-any.whl"),
                        str(dist / "variants" / f"{NAME}-2.0-py3-none-any-null.whl"),
                        str(dist / "variants" / f"{NAME}-2.0-py3-none-any.whl")]
    assert main(["inspect", out[-2], "--expect-variant", "cpu", "--file", str(matrix),
                 "--allow-host-floor"]) == 0
    shown = capsys.readouterr().out
    assert "wheel variant" in shown and "agrees with its build record" in shown
    # --variants-only: the same wheel variants from the wheel already built, nothing rebuilt
    before = {p.name: p.read_bytes() for p in (dist / "variants").iterdir()}
    shutil.rmtree(dist / "variants")
    assert main(["build", "--variant", "cpu", "--variants-only", "--file", str(matrix)]) == 0
    assert {p.name: p.read_bytes() for p in (dist / "variants").iterdir()} == before
    capsys.readouterr()
    (dist / f"{NAME}-2.0+cpu-py3-none-any.whl").unlink()
    assert main(["build", "--variant", "cpu", "--variants-only", "--file", str(matrix)]) == 2
    err = capsys.readouterr().err.strip()
    assert "holds 0 wheels, expected the one `opforge build --variant cpu` left there" in err
    assert len(err.splitlines()) == 1
    assert main(["build", "--variant", "cpu", "--variants-only", "--dry-run", "--file",
                 str(matrix)]) == 2
    assert "goes without --dry-run" in capsys.readouterr().err


def test_inspect_shows_the_properties_and_checks_them_against_the_build_record(tmp_path,
                                                                              capsys):
    matrix = write_matrix(tmp_path)
    [wheel] = variant_wheels(tmp_path, matrix, "cu130")
    # (a pure wheel stamped cu130 holds no CUDA code: --expect-variant would say so)
    assert variants.check_variant_wheel(wheel, load_matrix(matrix).variant("cu130")) == []
    assert main(["inspect", str(wheel), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["wheel_variant"]["label"] == "cu130" and data["problems"] == []
    assert "nvidia :: sm_arch :: 90_real" in data["wheel_variant"]["properties"]
    assert main(["inspect", str(wheel)]) == 0
    shown = capsys.readouterr().out
    assert "nvidia :: cuda_version_lower_bound :: 13.0" in shown
    assert sum("drafts, the format may still change" in line for line in shown.splitlines()) == 1

    # variant.json rewritten to claim CUDA 12.0: the record still says 13.0
    rewrite_member(wheel, "variant.json",
                   lambda b: b.replace(b'"13.0"', b'"12.0"'))
    assert main(["inspect", str(wheel)]) == 1
    fails = [line for line in capsys.readouterr().out.splitlines() if line.startswith("FAIL")]
    assert fails == ["FAIL wheel variant: variant.json declares nvidia :: "
                     "cuda_version_lower_bound :: 12.0, the build record "
                     "nvidia :: cuda_version_lower_bound :: 13.0"]


def test_inspect_fails_a_renamed_label_and_a_wheel_of_another_variant(tmp_path, capsys):
    matrix = write_matrix(tmp_path)
    [wheel] = variant_wheels(tmp_path, matrix, "cu130")
    renamed = wheel.with_name(wheel.name.replace("-cu130", "-cu999"))
    wheel.rename(renamed)
    assert main(["inspect", str(renamed)]) == 1
    out = capsys.readouterr().out
    assert "FAIL wheel variant: variant.json is not valid" in out and "cu999" in out
    labelled, _plain = variant_wheels(tmp_path, matrix, "cpu")
    assert main(["inspect", str(labelled), "--expect-variant", "cu130", "--file",
                 str(matrix)]) == 1
    assert "FAIL wheel variant: variant cu130 maps to label cu130" in capsys.readouterr().out


def test_inspect_of_an_unreadable_variant_wheel_is_one_line_exit_2(tmp_path, capsys):
    bad = tmp_path / f"{NAME}-1.0-py3-none-any-cu130.whl"
    bad.write_bytes(b"not a zip")
    assert main(["inspect", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err


def test_an_oversized_variant_json_is_refused_unread(tmp_path, capsys):
    [wheel] = variant_wheels(tmp_path, write_matrix(tmp_path), "cu130")
    rewrite_member(wheel, "variant.json", lambda b: b + b" " * (2 << 20))
    assert main(["inspect", str(wheel)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "variant.json is 2" in err and "more than 1048576" in err
