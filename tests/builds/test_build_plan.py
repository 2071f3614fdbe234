"""Build plans: explicit variants, clear refusals, dry runs; the README and .ci/run agree."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from projectkit import matrix_yaml, variant_entry, write_tree

from opforge import build
from opforge.cli import main
from opforge.errors import OpforgeError
from opforge.matrix import load_matrix
from opforge.platforms import backend_of, toolchain

ROOT = Path(__file__).resolve().parents[2]
MATRIX = load_matrix(ROOT / "matrix.yaml")


@pytest.fixture(autouse=True)
def _matrix_index(monkeypatch):
    """Plans here use the matrix's own torch index unless a test overrides it."""
    monkeypatch.delenv("OPFORGE_TORCH_INDEX", raising=False)


def test_stable_plan_passes_the_abi_and_floor_and_stamps_a_floor(tmp_path):
    plan = build.plan_build(MATRIX, "cpu_stable", out_dir=tmp_path / "dist",
                            work_dir=tmp_path / "w", host="linux-x86_64", env={})
    floor = MATRIX.variant("cpu_stable").torch_floor
    assert plan.build.env["OPFORGE_ABI"] == "stable"
    assert plan.build.env["OPFORGE_TORCH_FLOOR"] == floor
    # built against the matrix's torch (the newest it targets), from the CPU index
    assert "torch==2.13.0" in plan.install and plan.install[-1].endswith("/whl/cpu")
    assert f"torch>={floor}" in plan.describe()
    legacy = build.plan_build(MATRIX, "cpu", out_dir=tmp_path / "d2", work_dir=tmp_path / "w2",
                              host="linux-x86_64", env={})
    assert legacy.build.env["OPFORGE_ABI"] == "legacy"
    assert "OPFORGE_TORCH_FLOOR" not in legacy.build.env


def test_cpu_plan_is_explicit_and_never_forces_accelerators(tmp_path):
    plan = build.plan_build(MATRIX, "cpu", out_dir=tmp_path / "dist", work_dir=tmp_path / "w",
                            host="linux-x86_64", env={})
    env = plan.build.env
    # the variant is passed; the local version is opforge's to stamp, not the project's to write
    assert env["OPFORGE_VARIANT"] == "cpu" and "OPFORGE_LOCAL_VERSION" not in env
    # no accelerator switch at all (a setup.py reading "FORCE_CUDA" as truthy text would
    # take "0" for yes), and the caller's CUDA variables are taken away
    assert "FORCE_CUDA" not in env and "FORCE_MPS" not in env
    assert {"FORCE_CUDA", "CUDA_HOME", "CUDA_PATH", "CUDACXX"} <= set(plan.build.unset)
    assert "torch==2.13.0" in plan.install
    assert plan.install[plan.install.index("--index-url") + 1] == \
        "https://download.pytorch.org/whl/cpu"
    # build tools come from the default index, not torch's
    assert "--index-url" not in plan.tools and "auditwheel>=6" in plan.tools
    assert plan.repair is not None and "auditwheel" in plan.repair.argv
    # torch's own libraries are excluded from grafting
    assert "libtorch*.so*" in plan.repair.argv and "libc10*.so*" in plan.repair.argv


def test_cuda_plan_takes_arch_list_from_the_matrix(tmp_path):
    plan = build.plan_build(MATRIX, "cu130", work_dir=tmp_path, host="linux-x86_64", env={})
    assert plan.build.env["FORCE_CUDA"] == "1"
    assert plan.build.env["TORCH_CUDA_ARCH_LIST"] == MATRIX.variant("cu130").option("arch_list")
    assert "torch==2.14.1" in plan.install


def test_mps_plan_sets_deployment_target_and_delocates(tmp_path):
    plan = build.plan_build(MATRIX, "mps", work_dir=tmp_path, host="macos-arm64", env={})
    assert plan.build.env["FORCE_MPS"] == "1"
    assert plan.build.env["MACOSX_DEPLOYMENT_TARGET"] == "13.0"
    assert "delocate.cmd.delocate_wheel" in plan.repair.argv
    assert "libtorch" in plan.repair.argv


@pytest.mark.parametrize("target", ["12.3", None])
def test_a_mac_only_cpu_variant_builds_at_its_deployment_target(tmp_path, target):
    """The target is the platform's, not MPS's: a CPU wheel for macOS alone (which cannot set
    MACOSX_DEPLOYMENT_TARGET in build_env, opforge owns it) is compiled for the macOS it
    records, and without one nothing is set (the SDK's default, as the record says)."""
    fields = {"macos_deployment_target": target} if target else {}
    mac = ("macos-arm64",)
    write_tree(tmp_path, {"setup.py": "from setuptools import setup\nsetup()\n",
                          "matrix.yaml": matrix_yaml("pkg", ["nms"], platforms=mac, variants=[
                              variant_entry("cpu_mac", platforms=mac, **fields)])})
    matrix = load_matrix(tmp_path / "matrix.yaml")
    plan = build.plan_build(matrix, "cpu_mac", work_dir=tmp_path / "w", host="macos-arm64",
                            env={})
    assert plan.build.env.get("MACOSX_DEPLOYMENT_TARGET") == target
    assert "FORCE_MPS" not in plan.build.env
    variant = matrix.variant("cpu_mac")
    assert backend_of(variant).record_fields(variant)["macos_deployment_target"] == target


def test_torch_index_override(tmp_path, monkeypatch):
    monkeypatch.setenv("OPFORGE_TORCH_INDEX", "pypi")
    plan = build.plan_build(MATRIX, "cpu", work_dir=tmp_path, host="linux-x86_64")
    assert "--index-url" not in plan.install
    plan = build.plan_build(MATRIX, "cpu", work_dir=tmp_path, host="linux-x86_64",
                            torch_index="https://example.invalid/whl/cpu")
    assert plan.install[plan.install.index("--index-url") + 1] == "https://example.invalid/whl/cpu"


def test_mps_refused_on_linux_with_where_it_runs():
    with pytest.raises(OpforgeError) as info:
        build.check_host(MATRIX, MATRIX.variant("mps"), host="linux-x86_64")
    message = str(info.value)
    assert "build_mps needs macOS on Apple silicon with Xcode command-line tools" in message
    assert "macos-14" in message


def test_cuda_refused_without_nvcc(tmp_path, monkeypatch):
    monkeypatch.setattr(toolchain, "find_toolkits", lambda env, cuda=None: [])
    with pytest.raises(OpforgeError) as info:
        build.check_host(MATRIX, MATRIX.variant("cu128"), host="linux-x86_64", env={})
    assert "build_cu128 needs nvcc 12.8" in str(info.value)
    assert "pytorch/manylinux2_28-builder:cuda12.8" in str(info.value)


def test_cuda_refused_with_the_wrong_nvcc(tmp_path, monkeypatch):
    fake = tmp_path / "bin" / "nvcc"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 12.6, V12.6.77'\n")
    fake.chmod(0o755)
    # cu128: no CUDA 12.8 toolkit anywhere on this host (a 13.0 one may be)
    with pytest.raises(OpforgeError) as info:
        build.check_host(MATRIX, MATRIX.variant("cu128"), host="linux-x86_64",
                         env={"CUDA_HOME": str(tmp_path), "PATH": ""})
    message = str(info.value)
    assert "needs nvcc 12.8" in message and f"{fake} is CUDA 12.6 (CUDA_HOME)" in message
    assert "set CUDA_HOME to a CUDA 12.8 toolkit" in message


def test_cpu_refused_on_an_unlisted_platform():
    with pytest.raises(OpforgeError) as info:
        build.check_host(MATRIX, MATRIX.variant("cu130"), host="macos-arm64")
    assert "build_cu130 builds for linux-x86_64; this host is macos-arm64" in str(info.value)


def test_dry_run_prints_environment_and_commands(capsys):
    assert main(["build", "--variant", "cu130", "--dry-run", "--file",
                 str(ROOT / "matrix.yaml")]) == 0
    out = capsys.readouterr().out
    assert "FORCE_CUDA=1" in out and "TORCH_CUDA_ARCH_LIST=7.5;8.0;8.6;9.0;10.0;12.0+PTX" in out
    assert "pip wheel --no-build-isolation" in out and "auditwheel repair" in out


def test_finish_replaces_older_wheels_atomically(tmp_path):
    plan = build.plan_build(MATRIX, "cpu", out_dir=tmp_path / "dist", work_dir=tmp_path / "w",
                            host="linux-x86_64", env={})
    build.prepare(plan)
    (plan.out_dir).mkdir(parents=True)
    (plan.out_dir / "opforge_ops-0.0.9+cpu-cp311-cp311-manylinux_2_34_x86_64.whl").write_text("old")
    new = plan.repaired_dir / "opforge_ops-0.1.0+cpu-cp311-cp311-manylinux_2_34_x86_64.whl"
    new.write_text("new")
    final = build.finish(plan)
    assert [p.name for p in plan.out_dir.iterdir()] == [new.name]
    assert final.read_text() == "new"


def test_finish_refuses_when_the_build_made_no_wheel(tmp_path):
    plan = build.plan_build(MATRIX, "cpu", out_dir=tmp_path / "dist", work_dir=tmp_path / "w",
                            host="linux-x86_64", env={})
    build.prepare(plan)
    with pytest.raises(OpforgeError, match="produced 0 wheels"):
        build.finish(plan)
    assert not (tmp_path / "dist").exists() or not list((tmp_path / "dist").iterdir())


def _readme_test_command() -> str:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"# the whole test suite[^\n]*\n((?:#[^\n]*\n)*)([^\n]+)\n", text)
    assert block, "README must show the test command under '# the whole test suite'"
    return block.group(2).strip()


def test_ci_run_runs_exactly_the_readme_test_command():
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.startswith("#") and not line.startswith(("set ", "cd "))]
    assert ci == [_readme_test_command()]


@pytest.mark.skipif(shutil.which("nox") is None and not (Path(sys.executable).parent / "nox").exists(),
                    reason="nox is not installed in this environment")
def test_nox_build_mps_fails_clearly_and_dry_run_prints_the_plan(tmp_path):
    nox = [shutil.which("nox") or str(Path(sys.executable).parent / "nox"),
           "--envdir", str(tmp_path)]
    env = {**os.environ, "NOX_SCRIPT_MODE": "none"}
    listing = subprocess.run([*nox, "-l"], cwd=ROOT, capture_output=True, text=True, env=env)
    assert listing.returncode == 0, listing.stderr
    for variant in MATRIX.variants:
        assert f"{variant.build_session} -> Build the {variant.name} wheel" in listing.stdout
    if build.host_platform() == "macos-arm64":
        return
    failed = subprocess.run([*nox, "-s", "build_mps"], cwd=ROOT, capture_output=True, text=True,
                            env=env)
    assert failed.returncode != 0
    assert "build_mps needs macOS on Apple silicon" in failed.stdout + failed.stderr
    dry = subprocess.run([*nox, "-s", "build_mps", "--", "--dry-run"], cwd=ROOT,
                         capture_output=True, text=True, env=env)
    output = dry.stdout + dry.stderr
    assert dry.returncode == 0, output
    assert "FORCE_MPS=1" in output and "MACOSX_DEPLOYMENT_TARGET=13.0" in output
    assert "delocate" in output


def test_smoke_variant_takes_the_newest_wheel_of_dist_variant(tmp_path, monkeypatch):
    from opforge.cli.smoke import options_of
    from opforge.smoke.plan import make_plan

    def resolve(args):
        plan = make_plan(options_of(args))
        return plan.target, plan.request, plan.variant

    (tmp_path / "matrix.yaml").write_text((ROOT / "matrix.yaml").read_text())
    (tmp_path / "extension").mkdir()
    (tmp_path / "extension" / "recipes.py").write_text("RECIPES = {}\n")
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")  # found from the working directory upwards
    monkeypatch.delenv("OPFORGE_MATRIX", raising=False)
    parser = build_parser_for_smoke()
    with pytest.raises(Exception, match="run `opforge build --variant cu130`"):
        resolve(parser.parse_args(["smoke", "--variant", "cu130"]))
    wheel_dir = tmp_path / "dist" / "cu130"
    wheel_dir.mkdir(parents=True)
    wheel = wheel_dir / "opforge_ops-0.1.0+cu130-cp311-cp311-manylinux_2_34_x86_64.whl"
    wheel.write_text("")
    target, request, variant = resolve(parser.parse_args(["smoke", "--variant", "cu130"]))
    assert target.wheel == wheel and variant == "cu130"
    # the variant's torch goes in first, from the variant's index
    assert target.variant_torch == "torch==2.14.1"
    assert request.op_keys["_roi_align_backward"] == ("CPU", "CUDA", "Meta")
    assert request.recipes == tmp_path / "extension" / "recipes.py"


def build_parser_for_smoke():
    from opforge.cli import build_parser

    return build_parser()
