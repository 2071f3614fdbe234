"""`opforge index` publishes wheel variants (PEP 825 draft) beside the per-variant pages."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from publish_wheelkit import pip_resolve, serve, uv_install
from variants_kit import CPU, CU126, CU130, NAME, variant_wheels, write_matrix

from opforge.cli import main

pytest.importorskip("variantlib", reason="wheel variants need variantlib (opforge[variants])")

SITE_DIR = "wheel-variants"


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _dist(tmp: Path, version: str = "1.0", matrix: Path | None = None) -> Path:
    """dist/cpu and dist/cu130 with their wheels and wheel variants, as build --variants
    leaves them."""
    matrix = matrix or write_matrix(tmp / "repo")
    for variant in ("cpu", "cu130"):
        variant_wheels(tmp, matrix, variant, version)
    return tmp / "dist"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("variants")
    dist = _dist(root)
    site = root / "site"
    assert main(["index", str(dist), "--out", str(site)]) == 0
    return root, dist, site


def test_the_per_variant_pages_stay_byte_for_byte_what_they_were(built, tmp_path):
    root, dist, site = built
    plain = tmp_path / "dist"
    shutil.copytree(dist, plain, ignore=shutil.ignore_patterns("variants"))
    assert main(["index", str(plain), "--out", str(tmp_path / "site")]) == 0
    without = _tree(tmp_path / "site")
    tree = _tree(site)
    assert {k: v for k, v in tree.items() if not k.startswith(f"{SITE_DIR}/")} == without
    assert sorted(k for k in tree if k.startswith(f"{SITE_DIR}/")) == [
        f"{SITE_DIR}/{NAME}/{NAME}-1.0-py3-none-any-cu130.whl",
        f"{SITE_DIR}/{NAME}/{NAME}-1.0-py3-none-any-cu130.whl.metadata",
        f"{SITE_DIR}/{NAME}/{NAME}-1.0-py3-none-any-null.whl",
        f"{SITE_DIR}/{NAME}/{NAME}-1.0-py3-none-any-null.whl.metadata",
        f"{SITE_DIR}/{NAME}/{NAME}-1.0-py3-none-any.whl",
        f"{SITE_DIR}/{NAME}/{NAME}-1.0-py3-none-any.whl.metadata",
        f"{SITE_DIR}/{NAME}/{NAME}-1.0-variants.json",
        f"{SITE_DIR}/{NAME}/index.html",
        f"{SITE_DIR}/index.html"]


def test_the_variants_json_is_what_variantlibs_own_generator_writes(built, tmp_path):
    root, _dist_dir, site = built
    project = site / SITE_DIR / NAME
    for wheel in project.glob("*.whl"):
        shutil.copy(wheel, tmp_path / wheel.name)
    run = subprocess.run([sys.executable, "-c", "import sys; from variantlib.commands.main "
                          "import main; sys.argv[0] = 'variantlib'; main()",
                          "generate-index-json", "-d", str(tmp_path)],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    name = f"{NAME}-1.0-variants.json"
    assert (project / name).read_bytes() == (tmp_path / name).read_bytes()


def test_the_project_page_links_every_file_with_its_hash(built):
    import hashlib

    _root, _dist_dir, site = built
    project = site / SITE_DIR / NAME
    page = (project / "index.html").read_text()
    anchors = re.findall(r'<a href="([^"#]+)#sha256=([0-9a-f]{64})"', page)
    assert sorted(a for a, _ in anchors) == sorted(
        p.name for p in project.iterdir() if p.suffix in (".whl", ".json"))
    for name, digest in anchors:
        assert hashlib.sha256((project / name).read_bytes()).hexdigest() == digest
    assert 'data-core-metadata="sha256=' in page
    assert (site / SITE_DIR / "index.html").read_text().count(f'href="{NAME}/"') == 1


def test_pip_and_uv_without_variant_support_take_the_plain_cpu_copy_from_the_one_url(
        built, tmp_path):
    root, _dist_dir, site = built
    torch = tmp_path / "torch"
    from publish_wheelkit import fake_torch_index

    fake_torch_index(torch, "cpu", ["2.13.0"])
    with serve(root) as base:
        args = (NAME, "--index-url", f"{base}/site/{SITE_DIR}/",
                "--extra-index-url", torch.joinpath("cpu").as_uri())
        got = pip_resolve(tmp_path, *args)
        assert got == {NAME: "1.0", "torch": "2.13.0+cpu"}
        target = tmp_path / "target"
        assert uv_install(tmp_path, target, *args, "--index-strategy", "unsafe-best-match") == \
            {NAME: "1.0", "torch": "2.13.0+cpu"}
    assert "BUILD = 'cpu'" in (target / NAME / "__init__.py").read_text()


def test_a_second_release_keeps_the_first_and_a_rerun_changes_nothing(tmp_path, capsys):
    site = tmp_path / "site"
    first = _dist(tmp_path / "a", "1.0")
    assert main(["index", str(first), "--out", str(site)]) == 0
    assert "drafts" in capsys.readouterr().out
    before = _tree(site)
    assert main(["index", str(first), "--out", str(site)]) == 0
    assert _tree(site) == before
    second = _dist(tmp_path / "b", "1.1")
    assert main(["index", str(second), "--out", str(site)]) == 0
    after = _tree(site)
    project = f"{SITE_DIR}/{NAME}"
    for name, data in before.items():
        if name.endswith((".whl", ".metadata", ".json")):
            assert after[name] == data, name
    assert f"{project}/{NAME}-1.1-variants.json" in after
    assert f"{project}/{NAME}-1.1-py3-none-any-cu130.whl" in after
    assert after[f"{project}/index.html"].count(b"<a ") == 8


def test_a_published_name_with_other_bytes_is_refused_and_nothing_written(tmp_path, capsys):
    site = tmp_path / "site"
    assert main(["index", str(_dist(tmp_path / "a")), "--out", str(site)]) == 0
    before = _tree(site)
    capsys.readouterr()
    other = tmp_path / "b"
    matrix = write_matrix(other / "repo")
    variant_wheels(other, matrix, "cu130", payload="BUILD = 'rebuilt'\n")
    assert main(["index", str(other / "dist"), "--out", str(site)]) == 1
    err = capsys.readouterr().err
    assert f"{SITE_DIR}/{NAME}/{NAME}-1.0-py3-none-any-cu130.whl is published with sha256" in err
    assert _tree(site) == before


def test_one_label_with_other_properties_in_one_version_is_refused(tmp_path, capsys):
    site = tmp_path / "site"
    assert main(["index", str(_dist(tmp_path / "a")), "--out", str(site)]) == 0
    before = _tree(site)
    capsys.readouterr()
    # the same release's cu130 for another platform, built for other architectures
    other = tmp_path / "b"
    matrix = write_matrix(other / "repo", CPU, {**CU130, "arch_list": "8.0"})
    variant_wheels(other, matrix, "cu130", tag="py3-none-manylinux_2_28_x86_64")
    assert main(["index", str(other / "dist"), "--out", str(site)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cannot join the variants of boxops-1.0" in err
    assert _tree(site) == before


def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, capsys):
    dist = _dist(tmp_path)
    # a plain (non-variant) wheel dropped into a variants folder
    stray = dist / "cu130" / "variants" / f"{NAME}-1.0-py3-none-manylinux_2_28_x86_64.whl"
    shutil.copy(next((dist / "cu130").glob("*.whl")), stray)
    site = tmp_path / "site"
    assert main(["index", str(dist), "--out", str(site)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not a wheel variant" in err
    assert "Traceback" not in err and not site.exists()
    stray.unlink()
    # a wheel variant under the folder of another variant
    moved = dist / "cpu" / "variants" / f"{NAME}-1.0-py3-none-any-cu130.whl"
    (dist / "cu130" / "variants" / moved.name).rename(moved)
    assert main(["index", str(dist), "--out", str(site)]) == 2
    assert "its build record says variant 'cu130', but it is under cpu/variants/" in \
        capsys.readouterr().err
    assert not site.exists()


def test_merge_from_a_published_url_keeps_its_wheel_variants(tmp_path, capsys):
    served = tmp_path / "served"
    assert main(["index", str(_dist(tmp_path / "a")), "--out", str(served / "site")]) == 0
    capsys.readouterr()
    fresh = tmp_path / "fresh"
    with serve(served) as base:
        assert main(["index", str(_dist(tmp_path / "b", "1.1")), "--out", str(fresh),
                     "--merge-from", f"{base}/site/"]) == 0
    out = capsys.readouterr().out
    assert "5 published wheel(s) fetched" in out  # cpu, cu130, and the 3 wheel variants
    names = {p.name for p in (fresh / SITE_DIR / NAME).iterdir()}
    assert {f"{NAME}-1.0-py3-none-any-cu130.whl", f"{NAME}-1.0-variants.json",
            f"{NAME}-1.1-py3-none-any-cu130.whl", f"{NAME}-1.1-variants.json"} <= names


def test_a_matrix_of_several_cuda_variants_publishes_one_json(tmp_path):
    matrix = write_matrix(tmp_path / "repo", CPU, CU126, CU130)
    for variant in ("cpu", "cu126", "cu130"):
        variant_wheels(tmp_path, matrix, variant)
    site = tmp_path / "site"
    assert main(["index", str(tmp_path / "dist"), "--out", str(site)]) == 0
    import json

    data = json.loads((site / SITE_DIR / NAME / f"{NAME}-1.0-variants.json").read_text())
    assert sorted(data["variants"]) == ["cu126", "cu130", "null"]
    assert data["variants"]["cu126"]["nvidia"]["cuda_version_lower_bound"] == ["12.6"]


def test_the_release_layout_gives_the_same_tree(built, tmp_path):
    """The release downloads every cell's wheels into dist/ and their wheel variants into
    dist/wheel-variants/ (build records name the variants): the same tree as dist/<variant>/."""
    _root, dist, site = built
    flat = tmp_path / "dist"
    (flat / SITE_DIR).mkdir(parents=True)
    for wheel in dist.glob("*/*.whl"):
        shutil.copy(wheel, flat / wheel.name)
    for wheel in dist.glob("*/variants/*.whl"):
        shutil.copy(wheel, flat / SITE_DIR / wheel.name)
    assert main(["index", str(flat), "--out", str(tmp_path / "site")]) == 0
    assert _tree(tmp_path / "site") == _tree(site)


def test_two_labels_with_the_same_properties_are_refused(tmp_path, capsys):
    """cu130 and cu130_stable map to the same properties: an installer could not choose."""
    twin = {**CU130, "name": "cu130_twin"}
    matrix = write_matrix(tmp_path / "repo", CPU, CU130, twin)
    variant_wheels(tmp_path, matrix, "cu130")
    from variants_kit import FACTS

    FACTS["cu130_twin"] = FACTS["cu130"]
    try:
        variant_wheels(tmp_path, matrix, "cu130_twin", tag="py3-none-manylinux_2_28_x86_64")
    finally:
        del FACTS["cu130_twin"]
    site = tmp_path / "site"
    assert main(["index", str(tmp_path / "dist"), "--out", str(site)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "labels cu130 and cu130_twin declare the same" in err
    assert not site.exists()
