"""The default mode's glue: build the checkout against each nightly, then run the smoke test.

Real nightlies (and a compile per nightly) are not available here, so the compile and the
smoke command are replaced by a tiny wheel and a one-line import; what is pinned is the
plumbing: one build per nightly, made with that nightly's environment and torch version,
installed beside it, smoke-tested there, and reused on the next run.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from fake_nightlies import write_wheel

import opforge
from opforge.bisect import extension
from opforge.cli import main

REPO_ROOT = Path(opforge.__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


@pytest.fixture
def fake_build(monkeypatch):
    builds, smokes = [], []

    def build_against(variant, env_python, torch_version, out_dir, work_dir, log,
                      matrix=None):
        # the real build runs `python -m pip wheel` in the nightly's environment
        has_pip = subprocess.run([str(env_python), "-m", "pip", "--version"],
                                 capture_output=True).returncode == 0
        builds.append((variant, Path(env_python), torch_version, has_pip))
        out_dir.mkdir(parents=True, exist_ok=True)
        return write_wheel(out_dir, "fakeops", "0.1.0", "py3-none-any",
                           {"fakeops/__init__.py": "import torch\ntorch.nms_check()\n"})

    real_smoke = extension.smoke_command

    def smoke_command(env_python, variant, package=None, matrix=None):
        smokes.append(real_smoke(env_python, variant, package, matrix=matrix))
        return [str(env_python), "-c", "import fakeops"]

    monkeypatch.setattr(extension, "build_against", build_against)
    monkeypatch.setattr(extension, "smoke_command", smoke_command)
    monkeypatch.setattr(extension, "checkout_revision", lambda root: "0123456789ab")
    monkeypatch.chdir(REPO_ROOT)  # the checkout, with its matrix.yaml
    return builds, smokes


def test_default_mode_builds_each_nightly_once_and_smoke_tests_it(fake_build, fake_index,
                                                                   tmp_path, monkeypatch, capsys):
    builds, smokes = fake_build
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path / "cache"))
    argv = ["bisect", "--index", str(fake_index.root), "--good", "2024-06-05", "--bad",
            "2024-06-08", "--match", "does not exist", "--state", str(tmp_path / "state.json"),
            "--json"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["first_bad"]["date"] == "2024-06-07"
    assert len(builds) == data["probes"]
    envs = {p.name for p in (tmp_path / "cache" / "envs").iterdir()}
    for variant, env_python, torch_version, has_pip in builds:
        assert variant == "cpu" and has_pip
        assert env_python.parent.parent.name in envs
        assert env_python.parent.parent.name.startswith(f"torch-{torch_version.replace('+', '_')}")
    # the real smoke command: opforge smoke on the nightly's environment, the variant's keys
    cmd = smokes[0]
    assert cmd[1:5] == ["-m", "opforge", "smoke", "--python"]
    assert cmd[cmd.index("--variant") + 1] == "cpu"

    assert main(argv) == 0  # a second run reuses every build and environment
    capsys.readouterr()
    assert len(builds) == data["probes"]


def test_default_mode_checks_the_variant_against_the_matrix(fake_build, fake_index, tmp_path,
                                                           capsys):
    assert main(["bisect", "--index", str(fake_index.root), "--variant", "cu999",
                 "--state", str(tmp_path / "s.json")]) == 2
    assert "unknown variant 'cu999'" in capsys.readouterr().err


def test_a_nightly_the_extension_does_not_build_against_is_bad(fake_build, fake_index, tmp_path,
                                                              monkeypatch, capsys):
    from opforge.errors import OpforgeError

    def build_against(variant, env_python, torch_version, out_dir, work_dir, log,
                      matrix=None):
        if torch_version >= "2.5.0.dev20240607":
            raise OpforgeError(f"the extension does not build against torch {torch_version}: "
                               "compile the extension into a wheel failed with exit 1\n"
                               "nms.cpp:12: error: 'at::irrelevant' has not been declared")
        out_dir.mkdir(parents=True, exist_ok=True)
        return write_wheel(out_dir, "fakeops", "0.1.0", "py3-none-any",
                           {"fakeops/__init__.py": "\n"})

    monkeypatch.setattr(extension, "build_against", build_against)
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["bisect", "--index", str(fake_index.root), "--good", "2024-06-05", "--bad",
                 "2024-06-08", "--match", "has not been declared", "--state",
                 str(tmp_path / "state.json"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["first_bad"]["date"] == "2024-06-07"
    assert data["first_bad"]["reason"].startswith(
        "the extension does not build against torch 2.5.0.dev20240607+cpu")


def test_output_to_sends_children_output_to_the_log(tmp_path):
    import sys

    log = tmp_path / "out.log"
    with extension.output_to(log):
        # what the build runs (pip, the compiler) writes to the inherited descriptors
        subprocess.run([sys.executable, "-c", "import sys; print('to out', flush=True); "
                        "print('to err', file=sys.stderr)"])
    assert log.read_text().split() == ["to", "out", "to", "err"]


def test_file_is_the_matrix_the_build_and_the_smoke_run_get(fake_build, fake_index, tmp_path,
                                                           monkeypatch, capsys):
    import os

    builds, _ = fake_build
    fake_builder, given = extension.build_against, []

    def build_against(*args, **kwargs):
        given.append(kwargs.get("matrix"))
        return fake_builder(*args, **kwargs)

    seen = tmp_path / "seen.txt"

    def smoke_command(env_python, variant, package=None, matrix=None):
        # the smoke run's environment: which matrix would `opforge smoke` read there
        return [str(env_python), "-c", "import os; open(os.environ['SEEN_LOG'], 'a').write("
                "os.environ.get('OPFORGE_MATRIX', '-') + '\\n'); import fakeops"]

    monkeypatch.setattr(extension, "build_against", build_against)
    monkeypatch.setattr(extension, "smoke_command", smoke_command)
    work = tmp_path / "work"  # no matrix.yaml here or above: only --file names one
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.delenv("OPFORGE_MATRIX", raising=False)
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("SEEN_LOG", str(seen))
    before = dict(os.environ)
    matrix = str(REPO_ROOT / "matrix.yaml")
    assert main(["bisect", "--file", matrix, "--index", str(fake_index.root), "--good",
                 "2024-06-05", "--bad", "2024-06-08", "--match", "does not exist", "--state",
                 str(tmp_path / "state.json"), "--json"]) == 0
    assert dict(os.environ) == before
    data = json.loads(capsys.readouterr().out)
    assert data["first_bad"]["date"] == "2024-06-07"
    assert given == [matrix] * data["probes"] and len(builds) == data["probes"]
    assert seen.read_text().split() == [matrix] * data["probes"]
