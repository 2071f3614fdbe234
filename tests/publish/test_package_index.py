"""`opforge index`: a per-variant package index that pip and uv install from, over loopback HTTP."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from publish_wheelkit import fake_torch_index, make_wheel, pip_resolve, serve, uv_install

from opforge.cli import main

NAME = "boxops"


def _variant_wheel(dist: Path, variant: str, version: str, torch: str, **kw) -> Path:
    local = f"{version}+{variant.replace('_', '.')}" if kw.pop("local", True) else version
    record = {"variant": variant, "torch_version": torch}
    return make_wheel(dist / variant, NAME, local, requires=(f"torch=={torch}",),
                      requires_python=">=3.9", record=record, **kw)


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """A site with cpu and cu130 wheels, and torch's own (fake) indexes, served on loopback."""
    root = tmp_path_factory.mktemp("served")
    dist = root / "dist"
    _variant_wheel(dist, "cpu", "1.0", "2.13.0")
    # a newer release for macOS only: pip on Linux must skip it
    _variant_wheel(dist, "cpu", "1.1", "2.13.0", tag="py3-none-macosx_11_0_arm64")
    _variant_wheel(dist, "cu130", "1.0", "2.14.1")
    site = root / "site"
    assert main(["index", str(dist), "--out", str(site)]) == 0
    for variant in ("cpu", "cu130"):
        fake_torch_index(root / "torch", variant, ["2.13.0", "2.14.1"])
    with serve(root) as base:
        yield root, base


@pytest.mark.parametrize("variant, torch", [("cpu", "2.13.0+cpu"), ("cu130", "2.14.1+cu130")])
def test_pip_installs_each_variant_beside_its_torch(published, tmp_path, variant, torch):
    root, base = published
    got = pip_resolve(tmp_path, NAME, "--index-url", f"{base}/site/{variant}/",
                      "--extra-index-url", f"{base}/torch/{variant}/")
    assert got == {NAME: f"1.0+{variant}", "torch": torch}


@pytest.mark.parametrize("variant, torch", [("cpu", "2.13.0+cpu"), ("cu130", "2.14.1+cu130")])
def test_uv_installs_each_variant_beside_its_torch(published, tmp_path, variant, torch):
    root, base = published
    target = tmp_path / "target"
    got = uv_install(tmp_path, target, NAME, "--index-url", f"{base}/site/{variant}/",
                     "--extra-index-url", f"{base}/torch/{variant}/",
                     "--index-strategy", "unsafe-best-match")
    assert got == {NAME: f"1.0+{variant}", "torch": torch}
    assert f"VERSION = '1.0+{variant}'" in (target / NAME / "__init__.py").read_text()


def test_find_links_page_per_torch_and_variant(published, tmp_path):
    root, base = published
    pages = sorted(p.name for p in (root / "site").glob("torch-*.html"))
    assert pages == ["torch-2.13.0+cpu.html", "torch-2.14.1+cu130.html"]
    got = pip_resolve(tmp_path, NAME, "--no-index", "-f", f"{base}/site/torch-2.14.1+cu130.html",
                      "-f", f"{base}/torch/cu130/torch/")
    assert got == {NAME: "1.0+cu130", "torch": "2.14.1+cu130"}


def test_pages_carry_hashes_requires_python_and_core_metadata(published):
    root, _ = published
    project = root / "site" / "cpu" / NAME
    page = (project / "index.html").read_text()
    anchors = re.findall(r"<a ([^>]*)>([^<]+)</a>", page)
    assert [name for _, name in anchors] == sorted(p.name for p in project.glob("*.whl"))
    for attrs, name in anchors:
        wheel = project / name
        assert f'#sha256={hashlib.sha256(wheel.read_bytes()).hexdigest()}"' in attrs
        assert 'data-requires-python="&gt;=3.9"' in attrs
        with zipfile.ZipFile(wheel) as zf:
            metadata = zf.read(next(n for n in zf.namelist() if n.endswith("/METADATA")))
        assert (project / f"{name}.metadata").read_bytes() == metadata
        meta_hash = hashlib.sha256(metadata).hexdigest()
        assert f'data-dist-info-metadata="sha256={meta_hash}"' in attrs
        assert f'data-core-metadata="sha256={meta_hash}"' in attrs


def _snapshot(site: Path) -> dict[str, bytes]:
    return {str(p.relative_to(site)): p.read_bytes() for p in sorted(site.rglob("*"))
            if p.is_file()}


def test_output_is_deterministic_and_a_rerun_changes_nothing(tmp_path):
    dist = tmp_path / "dist"
    _variant_wheel(dist, "cpu", "1.0", "2.13.0")
    _variant_wheel(dist, "cu130", "1.0", "2.14.1")
    assert main(["index", str(dist), "--out", str(tmp_path / "a")]) == 0
    assert main(["index", str(dist), "--out", str(tmp_path / "b")]) == 0
    first = _snapshot(tmp_path / "a")
    assert first == _snapshot(tmp_path / "b")
    mtimes = {p: p.stat().st_mtime_ns for p in (tmp_path / "a").rglob("*") if p.is_file()}
    assert main(["index", str(dist), "--out", str(tmp_path / "a")]) == 0
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "a").rglob("*") if p.is_file()} == mtimes
    assert not [p for p in (tmp_path / "a").rglob("*") if p.name.endswith(".partial")]


def test_second_publish_adds_without_losing(published, tmp_path):
    root, _ = published
    site = tmp_path / "site"
    shutil.copytree(root / "site", site)  # the published tree, as a checkout of the pages
    before = _snapshot(site)
    dist = tmp_path / "dist2"
    _variant_wheel(dist, "cpu", "1.2", "2.13.0")
    _variant_wheel(dist, "cpu_stable", "1.2", "2.13.0")
    assert main(["index", str(dist), "--out", str(site)]) == 0
    after = _snapshot(site)
    for name, data in before.items():
        if name.endswith(".whl") or name.endswith(".metadata"):
            assert after[name] == data, name
    cpu_page = (site / "cpu" / NAME / "index.html").read_text()
    for version in ("1.0+cpu", "1.1+cpu", "1.2+cpu"):
        assert f"{NAME}-{version}-" in cpu_page
    assert (site / "cpu_stable" / NAME / f"{NAME}-1.2+cpu.stable-py3-none-any.whl").is_file()
    assert 'href="cpu_stable/"' in (site / "index.html").read_text()
    fake_torch_index(tmp_path / "torch", "cpu", ["2.13.0"])
    with serve(tmp_path) as base:
        latest = pip_resolve(tmp_path, NAME, "--index-url", f"{base}/site/cpu/",
                             "--extra-index-url", f"{base}/torch/cpu/")
        old = pip_resolve(tmp_path, f"{NAME}==1.0", "--no-deps", "--index-url",
                          f"{base}/site/cpu/")
    assert latest[NAME] == "1.2+cpu" and old == {NAME: "1.0+cpu"}


def test_a_published_name_with_other_bytes_is_refused_and_nothing_written(tmp_path, capsys):
    dist = tmp_path / "dist"
    _variant_wheel(dist, "cpu", "1.0", "2.13.0")
    site = tmp_path / "site"
    assert main(["index", str(dist), "--out", str(site)]) == 0
    before = _snapshot(site)
    capsys.readouterr()
    rebuilt = tmp_path / "rebuilt"
    _variant_wheel(rebuilt, "cpu", "1.0", "2.13.0", payload="# rebuilt\n")
    _variant_wheel(rebuilt, "cpu", "1.3", "2.13.0")  # a new wheel beside it is not written either
    assert main(["index", str(rebuilt), "--out", str(site)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("opforge index: error: 1 published file name")
    assert "cpu/boxops/boxops-1.0+cpu-py3-none-any.whl" in err[0]
    assert _snapshot(site) == before


@pytest.mark.parametrize("case", ["no-dist", "empty", "loose-unstamped", "bad-variant",
                                  "record-disagrees", "site-link", "not-a-wheel"])
def test_bad_input_is_one_line_exit_2_nothing_written(tmp_path, capsys, case):
    dist = tmp_path / "dist"
    site = tmp_path / "site"
    dist.mkdir()
    if case == "no-dist":
        shutil.rmtree(dist)
    elif case == "loose-unstamped":
        make_wheel(dist, NAME, "1.0")
    elif case == "bad-variant":
        make_wheel(dist / "CPU!", NAME, "1.0")
    elif case == "record-disagrees":
        wheel = _variant_wheel(dist, "cpu", "1.0", "2.13.0")
        (dist / "cu130").mkdir()
        wheel.rename(dist / "cu130" / wheel.name)
    elif case == "site-link":
        _variant_wheel(dist, "cpu", "1.0", "2.13.0")
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        site.mkdir()
        (site / "cpu").symlink_to(elsewhere, target_is_directory=True)
    elif case == "not-a-wheel":
        (dist / "cpu").mkdir()
        (dist / "cpu" / f"{NAME}-1.0-py3-none-any.whl").write_bytes(b"not a zip")
    before = _snapshot(tmp_path)
    assert main(["index", str(dist), "--out", str(site)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("opforge index: error: "), err
    assert _snapshot(tmp_path) == before
    if case == "site-link":
        assert not list((tmp_path / "elsewhere").iterdir())


def test_the_real_entry_point(tmp_path):
    dist = tmp_path / "dist"
    _variant_wheel(dist, "cpu", "1.0", "2.13.0", local=False)  # a PyPI-clean variant's wheel
    run = subprocess.run([sys.executable, "-m", "opforge", "index", str(dist), "--out",
                          str(tmp_path / "site")], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": ""})
    assert run.returncode == 0, run.stderr
    assert "1 wheel(s) added" in run.stdout
    assert (tmp_path / "site" / "cpu" / NAME / f"{NAME}-1.0-py3-none-any.whl").is_file()
    assert (tmp_path / "site" / "torch-2.13.0+cpu.html").is_file()


def test_merge_from_a_published_url_keeps_what_it_serves(published, tmp_path, capsys):
    """GitHub Pages deploys a tree anew: --merge-from starts it from what is published."""
    root, base = published
    dist = tmp_path / "dist"
    _variant_wheel(dist, "cu130", "1.2", "2.14.1")
    site = tmp_path / "fresh"
    assert main(["index", str(dist), "--out", str(site), "--merge-from", f"{base}/site/"]) == 0
    assert "3 published wheel(s) fetched" in capsys.readouterr().out
    for wheel in (root / "site").rglob("*.whl"):
        rel = wheel.relative_to(root / "site")
        assert (site / rel).read_bytes() == wheel.read_bytes()
    assert (site / "cu130" / NAME / f"{NAME}-1.2+cu130-py3-none-any.whl").is_file()
    page = (site / "cu130" / NAME / "index.html").read_text()
    assert f"{NAME}-1.0+cu130" in page and f"{NAME}-1.2+cu130" in page


def test_merge_from_nothing_published_yet_is_an_empty_index(published, tmp_path, capsys):
    _, base = published
    dist = tmp_path / "dist"
    _variant_wheel(dist, "cpu", "1.0", "2.13.0")
    assert main(["index", str(dist), "--out", str(tmp_path / "s"), "--merge-from",
                 f"{base}/not-published-yet/"]) == 0
    assert "0 published wheel(s) fetched" in capsys.readouterr().out


def test_merge_from_refuses_bytes_that_do_not_match_their_page(published, tmp_path, capsys):
    root, base = published
    copy = root / "tampered"
    if not copy.exists():
        shutil.copytree(root / "site", copy)
        wheel = next((copy / "cpu" / NAME).glob("*.whl"))
        wheel.write_bytes(wheel.read_bytes() + b"x")
    dist = tmp_path / "dist"
    _variant_wheel(dist, "cpu", "1.3", "2.13.0")
    assert main(["index", str(dist), "--out", str(tmp_path / "s"), "--merge-from",
                 f"{base}/tampered/"]) == 1
    err = capsys.readouterr().err
    assert "do not match the sha256" in err and not (tmp_path / "s" / "index.html").exists()


def test_pypi_out_copies_only_the_wheels_pypi_accepts(tmp_path, capsys):
    dist = tmp_path / "dist"
    clean = _variant_wheel(dist, "cpu", "1.0", "2.13.0", local=False)
    _variant_wheel(dist, "cu130", "1.0", "2.14.1")
    assert main(["index", str(dist), "--out", str(tmp_path / "site"), "--pypi-out",
                 str(tmp_path / "pypi")]) == 0
    assert "1 PyPI-clean wheel(s) copied" in capsys.readouterr().out
    assert [p.name for p in (tmp_path / "pypi").iterdir()] == [clean.name]
    assert (tmp_path / "site" / "cpu" / NAME / clean.name).is_file()  # on its index too
