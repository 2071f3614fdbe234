"""Usage errors: one line, exit 2, no traceback, nothing installed."""

from __future__ import annotations

import pytest

from opforge.cli import main


@pytest.mark.parametrize("argv, message", [
    (["smoke"], "give --variant V (its wheel from dist/V), --wheel PATH, --requirement REQ or "
                "--python PATH"),
    (["smoke", "--wheel", "nope.whl"], "--wheel nope.whl: no such file"),
    (["smoke", "--wheel", "setup.py"], "not a .whl file"),
    (["smoke", "--python", "/usr/bin/python3", "--expect-keys", "cpu-x"], "is not a dispatch key"),
    (["smoke", "--python", "/usr/bin/python3", "--ops", "nms;rm"], "is not an operator name"),
    (["smoke", "--python", "/usr/bin/python3", "--variant", "cu999"], "unknown variant 'cu999'"),
    (["smoke", "--python", "/usr/bin/python3", "--torch", "torch==2.14.1"],
     "--torch, --keep-env and --env-dir apply to a fresh environment"),
    (["smoke", "--wheel", "a.whl", "--python", "b"], "not allowed with argument"),
])
def test_bad_arguments_exit_2_with_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("opforge smoke: error: ")
    assert message in err[0]
    assert "Traceback" not in err[0]


def test_missing_interpreter_is_a_usage_error(capsys):
    assert main(["smoke", "--python", "/nonexistent/bin/python", "--package", "p",
                 "--namespace", "n"]) == 2
    assert "no such interpreter" in capsys.readouterr().err


def test_env_dir_that_is_not_empty_is_refused(tmp_path, capsys):
    wheel = tmp_path / "pkg-1.0-py3-none-any.whl"
    wheel.write_bytes(b"")
    (tmp_path / "env").mkdir()
    (tmp_path / "env" / "keep.txt").write_text("mine")
    assert main(["smoke", "--wheel", str(wheel), "--env-dir", str(tmp_path / "env"),
                 "--package", "pkg", "--namespace", "pkg"]) == 2
    assert "exists and is not empty" in capsys.readouterr().err
    assert (tmp_path / "env" / "keep.txt").read_text() == "mine"


@pytest.mark.parametrize("tool", ["uv", "pip"])
def test_wheel_pip_refuses_is_one_line_and_leaves_no_environment(tmp_path, capsys, monkeypatch,
                                                                  tool):
    import tempfile

    from smoke_wheelkit import write_wheel

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the fresh env would go
    monkeypatch.setenv("OPFORGE_INSTALLER", tool)
    monkeypatch.setenv("COLUMNS", "80")  # a terminal's width: the reason is not cut where uv wraps
    wheel = write_wheel(tmp_path / "oldpkg-1.0-cp27-cp27mu-linux_x86_64.whl",
                        {"oldpkg/__init__.py": b""}, dist="oldpkg", version="1.0")
    assert main(["smoke", "--wheel", str(wheel), "--package", "oldpkg",
                 "--namespace", "oldpkg"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("opforge smoke: error: pip install failed: ")
    # each installer's own words for "this wheel is not for this interpreter"
    assert ("is not a supported wheel on this platform" in err[-1] if tool == "pip"
            else "no wheels with a matching Python version tag" in err[-1])
    assert not list(tmp_path.glob("opforge-smoke-env-*"))


@pytest.mark.parametrize("existing", [False, True])
def test_env_dir_is_left_as_it_was_when_pip_fails(tmp_path, capsys, existing):
    from smoke_wheelkit import write_wheel

    wheel = write_wheel(tmp_path / "oldpkg-1.0-cp27-cp27mu-linux_x86_64.whl",
                        {"oldpkg/__init__.py": b""}, dist="oldpkg", version="1.0")
    env_dir = tmp_path / "env"
    if existing:
        env_dir.mkdir()
    argv = ["smoke", "--wheel", str(wheel), "--env-dir", str(env_dir), "--package", "oldpkg",
            "--namespace", "oldpkg"]
    assert main(argv) == 1
    assert "pip install failed" in capsys.readouterr().err
    assert env_dir.exists() == existing and (not existing or not any(env_dir.iterdir()))
    assert main(argv) == 1  # the same command runs again: nothing half-made is in the way
    assert "pip install failed" in capsys.readouterr().err


@pytest.mark.parametrize("option", ["--json", "--junit"])
def test_report_destination_checked_before_anything_is_installed(tmp_path, capsys, option):
    blocker = tmp_path / "file"
    blocker.write_text("mine")
    wheel = tmp_path / "pkg-1.0-py3-none-any.whl"
    wheel.write_bytes(b"")
    for target, words in ((blocker / "out.xml", "is not a directory"),
                          (tmp_path, "is a directory")):
        assert main(["smoke", "--wheel", str(wheel), option, str(target), "--package", "pkg",
                     "--namespace", "pkg"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0] and err[0].startswith("opforge smoke: error: ")
    assert blocker.read_text() == "mine"


@pytest.mark.parametrize("kind", ["directory", "missing", "not-executable"])
def test_python_that_is_not_an_interpreter_is_a_usage_error(tmp_path, capsys, kind):
    path = tmp_path / "python"
    if kind == "directory":
        path.mkdir()
    elif kind == "not-executable":
        path.write_text("#!/bin/sh\n")
        path.chmod(0o644)
    assert main(["smoke", "--python", str(path), "--package", "p", "--namespace", "n"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"opforge smoke: error: --python {path}: ")


def test_a_torch_other_than_the_variants_is_named_with_both_versions():
    from opforge.smoke.runner import torch_mismatch

    assert torch_mismatch("torch==2.13.0", "2.13.0+cpu") is None
    message = torch_mismatch("torch==2.13.0", "2.14.1+cu130")
    assert "torch 2.14.1+cu130" in message and "the variant's torch is torch==2.13.0" in message
    assert torch_mismatch(None, "2.14.1") is None and torch_mismatch("torch==2.13.0", None) is None


def test_unknown_installer_is_exit_2_with_one_line_and_no_environment(tmp_path, capsys,
                                                                      monkeypatch):
    import tempfile

    from smoke_wheelkit import write_wheel

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("OPFORGE_INSTALLER", "conda")
    wheel = write_wheel(tmp_path / "pkg-1.0-py3-none-any.whl", {"pkg/__init__.py": b""},
                        dist="pkg", version="1.0")
    assert main(["smoke", "--wheel", str(wheel), "--package", "pkg", "--namespace", "pkg"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == ("opforge smoke: error: OPFORGE_INSTALLER='conda': expected one of uv, "
                       "pip")
    assert not list(tmp_path.glob("opforge-smoke-env-*"))


def _fixture_repo(tmp_path, monkeypatch):
    """tests/matrix's fixture matrix in a repository of its own, found from the cwd."""
    from pathlib import Path

    fixture = Path(__file__).parents[1] / "matrix" / "fixtures" / "matrix.yaml"
    (tmp_path / "matrix.yaml").write_text(fixture.read_text())
    (tmp_path / "extension").mkdir()
    (tmp_path / "extension" / "recipes.py").write_text("RECIPES = {}\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("OPFORGE_MATRIX", raising=False)


def _options(*argv):
    from opforge.cli import build_parser
    from opforge.cli.smoke import options_of

    return options_of(build_parser().parse_args(["smoke", *argv]))


def _resolve(*argv):
    from opforge.smoke.plan import make_plan

    plan = make_plan(_options(*argv))
    return plan.target, plan.request, plan.choice


def test_the_probe_is_sent_the_promises_of_the_wheels_variant_only(tmp_path, monkeypatch):
    import json
    import zipfile

    _fixture_repo(tmp_path, monkeypatch)
    # the PyPI variant's wheel carries no label: its build record names cpu
    wheel = tmp_path / "opforge_ops-0.1.0-cp311-cp311-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("opforge_ops-0.1.0.dist-info/opforge-build.json",
                         json.dumps({"variant": "cpu"}))
    target, request, choice = _resolve("--wheel", str(wheel))
    assert (choice.variant, choice.source) == ("cpu", "opforge-ops build record")
    assert request.op_keys["nms"] == ("CPU", "Meta", "Autograd", "AutocastCPU")
    assert target.variant_torch == "torch==2.13.0"
    spec = request.spec()
    assert "variants" not in spec and "CUDA" not in json.dumps(spec)


def test_an_existing_environment_waits_for_its_build_record(tmp_path, monkeypatch):
    _fixture_repo(tmp_path, monkeypatch)
    import sys

    _target, request, choice = _resolve("--python", sys.executable)
    assert choice.pending and choice.variant is None
    assert not request.promises and "variants" not in request.spec()
    # --variant decides at once, --expect-keys needs no variant
    assert _resolve("--python", sys.executable, "--variant", "mps")[1].op_keys["nms"] == (
        "CPU", "MPS", "Meta", "Autograd", "AutocastCPU", "AutocastMPS")
    _t, keyed, choice = _resolve("--python", sys.executable, "--expect-keys", "CPU")
    assert not choice.pending and keyed.op_keys["_roi_align_backward"] == ("CPU",)


def test_the_installed_build_record_chooses_before_the_probe_runs(tmp_path, monkeypatch):
    import json
    import sys
    from pathlib import Path

    from opforge.smoke.plan import choose_installed
    from opforge.smoke.runner import Environment, installed_build_record

    (tmp_path / "repo").mkdir()
    _fixture_repo(tmp_path / "repo", monkeypatch)
    site = tmp_path / "site"
    (site / "opforge_ops").mkdir(parents=True)
    (site / "opforge_ops" / "__init__.py").write_text("raise SystemExit('never imported')\n")
    info = site / "opforge_ops-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: opforge-ops\nVersion: 0.1.0\n")
    (info / "top_level.txt").write_text("opforge_ops\n")
    (info / "opforge-build.json").write_text(json.dumps({"variant": "cu130"}))
    monkeypatch.setenv("PYTHONPATH", str(site))  # an existing interpreter keeps its path
    env = Environment(python=Path(sys.executable), fresh=False)
    assert installed_build_record(env, "opforge_ops") == ({"variant": "cu130"}, "opforge-ops")
    args = _options("--python", sys.executable)
    _target, request, choice = _resolve("--python", sys.executable)
    request, choice = choose_installed(args, env, request, choice)
    assert (choice.variant, choice.source) == ("cu130", "opforge-ops build record")
    assert request.op_keys["_roi_align_backward"] == ("CPU", "CUDA", "Meta")


def _env_dir(root):
    from opforge.smoke.runner import Environment

    (root / "lib" / "site-packages" / "torch").mkdir(parents=True)
    (root / "lib" / "site-packages" / "torch" / "x.py").write_text("")
    return Environment(python=root / "bin" / "python", fresh=True, env_dir=root)


def test_a_temporary_environment_is_gone_at_once_and_removed_behind_the_command(tmp_path):
    import time

    from opforge.smoke.runner import TRASH_SUFFIX, cleanup

    env = _env_dir(tmp_path / "opforge-smoke-env-abc")
    env.temporary = True
    cleanup(env, keep=False)
    assert not env.env_dir.exists()
    trash = tmp_path / f".opforge-smoke-env-abc{TRASH_SUFFIX}"
    for _ in range(600):  # the detached remover's outcome, not its speed
        if not trash.exists():
            break
        time.sleep(0.1)
    assert not trash.exists() and list(tmp_path.iterdir()) == []


def test_an_env_dir_is_removed_before_the_command_returns_and_kept_with_keep_env(tmp_path):
    from opforge.smoke.runner import cleanup

    kept = _env_dir(tmp_path / "kept")
    cleanup(kept, keep=True)
    assert kept.env_dir.is_dir()
    given = _env_dir(tmp_path / "given")
    cleanup(given, keep=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept"]
