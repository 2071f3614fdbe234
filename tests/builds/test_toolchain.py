"""Each variant builds in its own toolchain world (opforge.platforms), proved on a setup.py
that guesses CUDA from the host in every usual way (tests/adopt/styles/host_guessing), with
the real compiler: on this machine nvcc is on PATH (/usr/local/bin) and torch is CPU-only,
so left to itself that setup.py fails inside CUDAExtension when built for cpu.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
import yaml
from projectkit import matrix_yaml, variant_entry

import opforge
from opforge import build
from opforge.cli import main
from opforge.errors import OpforgeError, UsageError
from opforge.matrix import load_matrix
from opforge.platforms import toolchain

ROOT = Path(__file__).resolve().parents[2]
PROJECT = ROOT / "tests" / "adopt" / "styles" / "host_guessing"
SRC = str(Path(opforge.__file__).resolve().parent.parent)
WORK = ROOT / "build" / "toolchain-tests"  # build environments and objects, kept between runs
HOST_TOOLKIT = Path("/usr/local/cuda-13.0")
PYTHON = "{}.{}".format(*sys.version_info[:2])

MODULES = {"host_guessing._C": {"backend": "cpu"},
           "host_guessing._cuda": {"backend": "cuda", "functions": ["scale"]}}


def matrix_text(python: str, cpu: dict | None = None, cu130: dict | None = None) -> str:
    """host_guessing's matrix (variants cpu and cu130); ``cpu``/``cu130``: fields added there."""
    return matrix_yaml(
        "host_guessing", ["scale"], distribution="host-guessing", recipes=None, modules=MODULES,
        python=python,
        variants=[variant_entry("cpu", **(cpu or {})),
                  variant_entry("cu130", ("CPU", "CUDA"), cuda="13.0", arch_list="8.0",
                          torch_version="2.14.1", **(cu130 or {}))])


def _fake_nvcc(folder: Path, release: str, *, toolkit: bool = True) -> Path:
    """A folder with an nvcc that says ``release``; ``toolkit``: laid out as a toolkit's bin."""
    folder.mkdir(parents=True)
    nvcc = folder / "nvcc"
    nvcc.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {release}, V{release}.1'\n")
    nvcc.chmod(0o755)
    if toolkit:
        (folder.parent / "include").mkdir()
        (folder.parent / "include" / "cuda_runtime.h").write_text("")
    return nvcc


def _program(folder: Path, name: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text("#!/bin/sh\n")
    (folder / name).chmod(0o755)


def test_cpu_build_takes_every_cuda_variable_away(tmp_path):
    matrix_file = tmp_path / "matrix.yaml"
    matrix_file.write_text(matrix_text("3.11"))
    shutil.copy(PROJECT / "setup.py", tmp_path / "setup.py")
    matrix = load_matrix(matrix_file)
    leaked = {"CUDA_HOME": "/usr/local/cuda", "CUDA_PATH": "/usr/local/cuda",
              "CUDACXX": "/usr/local/cuda/bin/nvcc", "FORCE_CUDA": "1"}
    plan = build.plan_build(matrix, "cpu", work_dir=tmp_path / "w", host="linux-x86_64",
                            env=leaked)
    assert not set(leaked) & set(plan.build.env)
    assert set(leaked) <= set(plan.build.unset)
    assert plan.build.env["CUDA_VISIBLE_DEVICES"] == ""
    assert plan.build.env["OPFORGE_BUILD_TOOLCHAIN"] == "cpu"
    assert plan.toolkit is None
    assert "without: CUDA_HOME" in plan.describe() and "PATH: no nvcc" in plan.describe()
    # nor can --build-env hand them back
    with pytest.raises(UsageError, match="--build-env CUDA_HOME: opforge sets CUDA_HOME"):
        build.plan_build(matrix, "cpu", work_dir=tmp_path / "w", host="linux-x86_64", env={},
                         extra_env={"CUDA_HOME": "/usr/local/cuda"})


def test_path_without_cuda_leaves_no_nvcc_but_keeps_every_other_program(tmp_path):
    _fake_nvcc(tmp_path / "cuda-12.6" / "bin", "12.6")
    _program(tmp_path / "cuda-12.6" / "bin", "nsys")
    shared = tmp_path / "usr-local-bin"  # nvcc linked into a folder of other programs
    _fake_nvcc(shared, "12.6", toolkit=False)
    _program(shared, "cmake")
    _program(tmp_path / "bin", "gcc")
    path = os.pathsep.join(str(p) for p in (tmp_path / "cuda-12.6" / "bin", shared,
                                            tmp_path / "bin"))
    cleaned = toolchain.build_path(path, None, tmp_path / "shadow")
    assert shutil.which("nvcc", path=cleaned) is None
    assert shutil.which("cmake", path=cleaned) and shutil.which("gcc", path=cleaned)
    # a toolkit's own bin goes whole; the shared folder is replaced by a copy without nvcc
    assert str(tmp_path / "cuda-12.6" / "bin") not in cleaned.split(os.pathsep)
    assert str(shared) not in cleaned.split(os.pathsep)


def test_cuda_build_sees_exactly_the_toolkit_of_its_version(tmp_path):
    other = _fake_nvcc(tmp_path / "cuda-12.6" / "bin", "12.6")
    wanted = _fake_nvcc(tmp_path / "cuda-13.9" / "bin", "13.9")
    env = {"CUDA_HOME": str(other.parent.parent),
           "PATH": os.pathsep.join([str(other.parent), str(wanted.parent), "/usr/bin"])}
    found = toolchain.variant_toolkit("13.9", env)
    assert found is not None and found.home == wanted.parent.parent
    given, unset = toolchain.environment("cuda", found, tmp_path / "site")
    assert given["CUDA_HOME"] == given["CUDA_PATH"] == str(wanted.parent.parent)
    assert given["CUDACXX"] == str(wanted) and given["FORCE_CUDA"] == "1"
    assert "CUDA_TOOLKIT_ROOT_DIR" in unset and "CUDA_HOME" not in unset
    path = toolchain.build_path(env["PATH"], found, tmp_path / "shadow")
    assert path.split(os.pathsep)[0] == str(wanted.parent)
    assert shutil.which("nvcc", path=path) == str(wanted)
    assert str(other.parent) not in path.split(os.pathsep)
    # none of the right version: the error names each toolkit found and its version
    with pytest.raises(OpforgeError) as info:
        toolchain.require_toolkit("12.9", env, "build_cu129", "it runs on CI")
    assert f"{other} is CUDA 12.6 (CUDA_HOME)" in str(info.value)
    assert f"{wanted} is CUDA 13.9 (nvcc on PATH)" in str(info.value)


@pytest.mark.skipif(not (HOST_TOOLKIT / "bin" / "nvcc").exists(),
                    reason="needs the CUDA 13.0 toolkit in /usr/local/cuda-13.0")
def test_cu130_plan_on_this_host_takes_its_13_0_toolkit_whatever_cuda_home_says(tmp_path):
    fake = _fake_nvcc(tmp_path / "cuda-12.6" / "bin", "12.6")
    matrix_file = tmp_path / "matrix.yaml"
    matrix_file.write_text(matrix_text("3.11"))
    shutil.copy(PROJECT / "setup.py", tmp_path / "setup.py")
    plan = build.plan_build(load_matrix(matrix_file), "cu130", work_dir=tmp_path / "w",
                            host="linux-x86_64", env={"CUDA_HOME": str(fake.parent.parent)})
    assert Path(plan.build.env["CUDA_HOME"]).resolve() == HOST_TOOLKIT.resolve()
    assert plan.build.env["FORCE_CUDA"] == "1" and plan.build.env["TORCH_CUDA_ARCH_LIST"] == "8.0"


# a CUDA torch imagined on top of this CPU one: torch.utils.cpp_extension then looks for a
# toolkit itself ($CUDA_HOME, nvcc on PATH, /usr/local/cuda)
ASK_TORCH = textwrap.dedent("""
    import json, os, torch
    torch.cuda._is_compiled = lambda: True
    torch.version.cuda = "13.0"
    from torch.utils import cpp_extension
    print(json.dumps({"is_available": torch.cuda.is_available(),
                      "mps": torch.backends.mps.is_available(),
                      "CUDA_HOME": cpp_extension.CUDA_HOME,
                      "other_site": os.environ.get("OTHER_SITE_RAN")}))
""")


def _ask_torch(tmp_path: Path, kind: str, extra_path: list[str] = (), **env_extra) -> dict:
    site = tmp_path / kind / "site"
    toolchain.write_site(site)
    # an nvcc on PATH that torch would take for a toolkit (as /usr/local/bin/nvcc here)
    fake = tmp_path / "fake-cuda" / "bin"
    if not fake.exists():
        _fake_nvcc(fake, "13.0")
    env = {k: v for k, v in os.environ.items() if k not in toolchain.CUDA_VARIABLES}
    env.update({toolchain.MODE_VARIABLE: kind, "PATH": f"{fake}{os.pathsep}{env['PATH']}",
                "PYTHONPATH": os.pathsep.join([str(site), *extra_path]), **env_extra})
    result = subprocess.run([sys.executable, "-c", ASK_TORCH], env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_torch_answers_for_the_variant_and_the_environments_sitecustomize_still_runs(tmp_path):
    theirs = tmp_path / "their-site"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import os\nos.environ['OTHER_SITE_RAN'] = '1'\n")
    cpu = _ask_torch(tmp_path, "cpu", [str(theirs)])
    # torch would have taken the nvcc on PATH for a toolkit: the cpu build is told there is none
    assert cpu == {"is_available": False, "mps": False, "CUDA_HOME": None, "other_site": "1"}
    # unless its matrix entry gave one (build_env: CUDA_HOME)
    given = _ask_torch(tmp_path, "cpu", CUDA_HOME="/opt/cuda-13.0")
    assert given["CUDA_HOME"] == "/opt/cuda-13.0" and given["is_available"] is False
    cuda = _ask_torch(tmp_path, "cuda", CUDA_HOME="/opt/cuda-13.0")
    assert cuda == {"is_available": True, "mps": False, "CUDA_HOME": "/opt/cuda-13.0",
                    "other_site": None}
    mps = _ask_torch(tmp_path, "mps")
    assert mps["mps"] is True and mps["is_available"] is False and mps["CUDA_HOME"] is None


def test_matrix_may_give_a_cpu_variant_a_toolkit_but_not_a_cuda_one_another(tmp_path,
                                                                            capsys):
    shutil.copy(PROJECT / "setup.py", tmp_path / "setup.py")
    matrix_file = tmp_path / "matrix.yaml"
    given = matrix_text(PYTHON, cpu={"build_env": yaml.safe_load(
        "{CUDA_HOME: /opt/cuda, HOST_GUESSING_PROBE: nvcc}")})
    matrix_file.write_text(given)
    plan = build.plan_build(load_matrix(matrix_file), "cpu", work_dir=tmp_path / "w",
                            host="linux-x86_64", env={"CUDA_PATH": "/usr/local/cuda"})
    assert plan.build.env["CUDA_HOME"] == "/opt/cuda"
    assert plan.build.env["HOST_GUESSING_PROBE"] == "nvcc"
    assert "CUDA_HOME" not in plan.build.unset and "CUDA_PATH" in plan.build.unset
    for variant, entry, message in (
            ("cu130", "{CUDA_HOME: /opt/cuda}", "a CUDA variant builds with the toolkit of its "
                                                 "cuda version (13.0): opforge sets CUDA_HOME"),
            ("cpu", "{FORCE_CUDA: '1'}", "opforge sets FORCE_CUDA from the variant itself"),
            ("cpu", "{OPFORGE_VARIANT: cu130}", "opforge sets OPFORGE_VARIANT"),
            ("cpu", "{1X: a}", "'1X' is not a variable name"),
            ("cpu", "[CUDA_HOME]", "expected a mapping of NAME: value")):
        bad = matrix_text(PYTHON, **{variant: {"build_env": yaml.safe_load(entry)}})
        matrix_file.write_text(bad)
        assert main(["matrix", "--check", "--file", str(matrix_file)]) == 2, entry
        assert message in capsys.readouterr().err, entry


def test_a_failed_torch_install_says_what_failed_and_the_way_out(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("OPFORGE_TORCH_INDEX", raising=False)
    matrix_file = tmp_path / "matrix.yaml"
    matrix_file.write_text(matrix_text(PYTHON))
    shutil.copytree(PROJECT, tmp_path, dirs_exist_ok=True)
    # nothing listens on port 9: the index cannot be reached
    code = main(["build", "--variant", "cpu", "--file", str(matrix_file), "--work-dir",
                 str(tmp_path / "w"), "--torch-index", "http://127.0.0.1:9/whl/cpu"])
    err = capsys.readouterr().err
    assert code == 1, err
    line = err.strip().splitlines()[-1]
    assert line.startswith("opforge build: error: install torch failed with exit ")
    message = line.split("failed with exit ", 1)[1]
    assert not message.rstrip().endswith(":") and "127.0.0.1" in message
    assert "the torch index http://127.0.0.1:9/whl/cpu cannot be reached" in message
    assert "--torch-index" in message and "OPFORGE_TORCH_INDEX" in message


def test_install_hint_tells_an_unreachable_index_from_a_missing_torch():
    from opforge.venv import torch_index_hint

    down = "error: Request failed after 3 retries | cause: dns error | cause: error resolving DNS"
    hint = torch_index_hint(["torch==2.13.0", "--index-url", "https://x.invalid/whl/cpu"], down)
    assert hint.startswith("likely cause: the torch index https://x.invalid/whl/cpu cannot be "
                           "reached from here; take torch from elsewhere with --torch-index or "
                           "OPFORGE_TORCH_INDEX")
    # uv's resolver says "resolving" and "conclude": the index answered, it has no such torch
    missing = ("No solution found when resolving dependencies | cause: Because there is no "
               "version of torch==2.0.77 and you require torch==2.0.77, we can conclude that "
               "your requirements are unsatisfiable.")
    assert "pip's configured index has no torch==2.0.77 for this platform" in \
        torch_index_hint(["torch==2.0.77"], missing)
    assert torch_index_hint(["--no-deps", "torchvision-0.1-py3-none-any.whl"], down) == ""


def test_repair_info_lines_are_shown_with_verbose_only(capsys):
    script = ("print('INFO:auditwheel.main_repair:Repairing x.whl'); "
              "print('Fixed-up wheel written to x.whl')")
    argv = [sys.executable, "-c", script]
    build._run(argv, {}, lambda *a: None, "repair", show=build._not_info)
    out = capsys.readouterr().out
    assert "Fixed-up wheel written" in out and "INFO:" not in out
    build._run(argv, {}, lambda *a: None, "repair", show=None)
    assert "INFO:auditwheel.main_repair" in capsys.readouterr().out


# --- the host-guessing extension, built for real -----------------------------------------


def opforge_cli(*args: str, cwd: Path, env: dict | None = None, timeout: float = 1800):
    full = {**os.environ, "PYTHONPATH": SRC, "OPFORGE_TORCH_INDEX": "pypi",
            "MAX_JOBS": os.environ.get("MAX_JOBS", "2"), **(env or {})}
    for name in ("OPFORGE_MATRIX", "GITHUB_STEP_SUMMARY"):
        full.pop(name, None)
    return subprocess.run([sys.executable, "-m", "opforge", *args], cwd=cwd, env=full,
                          capture_output=True, text=True, timeout=timeout)


def _project(root: Path) -> Path:
    shutil.copytree(PROJECT, root)
    (root / "matrix.yaml").write_text(matrix_text(PYTHON))
    return root


def _env(name: str) -> str:
    python = WORK / name / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "virtualenv", "-q", str(python.parent.parent)],
                       check=True)
    return str(python)


def _guesses(work: Path) -> str:
    lines = [ln for ln in (work / "build.log").read_text().splitlines()
             if "host_guessing guesses:" in ln]
    assert lines, "setup.py did not run"
    return lines[-1].split("host_guessing guesses:", 1)[1].strip()


def _smoke(project: Path, variant: str, tmp_path: Path) -> dict[str, str]:
    """opforge smoke on dist/<variant>'s wheel: its checks but the recipe-less run's warnings."""
    report = tmp_path / f"smoke-{variant}.json"
    smoke = opforge_cli("smoke", "--variant", variant, "--json", str(report), cwd=project)
    assert smoke.returncode == 0, smoke.stdout[-3000:] + smoke.stderr[-2000:]
    checks = json.loads(report.read_text())["checks"]
    return {c["id"]: c["status"] for c in checks if c["status"] != "warn"}


def _modules(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as zf:
        return {Path(n).name.split(".")[0] for n in zf.namelist() if n.endswith(".so")
                and n.startswith("host_guessing/")}


@pytest.fixture(scope="module")
def host_leaks() -> dict[str, str]:
    """What a developer's shell holds on a CUDA machine: all of it must stay out of cpu."""
    if not (HOST_TOOLKIT / "bin" / "nvcc").exists():
        pytest.skip("needs the CUDA 13.0 toolkit in /usr/local/cuda-13.0 (nvcc on the host "
                    "is what the cpu build must not see)")
    return {"CUDA_HOME": str(HOST_TOOLKIT), "CUDA_PATH": str(HOST_TOOLKIT), "FORCE_CUDA": "1",
            "PATH": f"{HOST_TOOLKIT / 'bin'}{os.pathsep}{os.environ['PATH']}"}


@pytest.mark.slow
def test_host_guessing_setup_py_builds_cpu_unedited(tmp_path, host_leaks):
    project = _project(tmp_path / "host_guessing")
    python = _env("env-cpu")
    work = WORK / "cpu"
    cache = tmp_path / "opforge-cache"
    built = opforge_cli("build", "--variant", "cpu", "--python", python, "--work-dir",
                        str(work), cwd=project, env={**host_leaks, "OPFORGE_CACHE_DIR": str(cache)})
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    # the compile's progress, in a log: plain lines, the file ninja compiled, the time kept
    assert "\x1b" not in built.stderr and "\r" not in built.stderr
    assert "opforge: compile the extension into a wheel (" in built.stderr
    if "[1/1]" in (work / "build.log").read_text():  # compiled now, not reused from last run
        assert "opforge: compile the extension into a wheel: 1/1 files csrc/scale.cpp (" in \
            built.stderr
    assert json.loads((cache / "builds" / "host_guessing-cpu.json").read_text())["seconds"] > 0
    assert _guesses(work) == ("{'nvcc': False, 'CUDA_HOME': False, "
                              "'torch.cuda.is_available()': False, "
                              "'cpp_extension.CUDA_HOME': False}")
    wheel = Path(built.stdout.strip().splitlines()[-1])
    assert "+cpu-" in wheel.name and _modules(wheel) == {"_C"}
    # auditwheel's INFO lines stayed in the background
    assert "INFO:auditwheel" not in built.stdout
    # built on this host (glibc 2.34), not in a manylinux_2_28 image: that floor is accepted
    inspected = opforge_cli("inspect", str(wheel), "--expect-variant", "cpu", "--json",
                            "--allow-host-floor", cwd=project)
    report = json.loads(inspected.stdout)
    assert inspected.returncode == 0 and report["problems"] == []
    assert report["build_info"]["backends"] == ["cpu"]
    # the same build environment (torch 2.13.0 CPU, the tools), the same shell, without
    # opforge's world: the setup.py sees nvcc and fails inside CUDAExtension
    alone = subprocess.run([python, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps",
                            "-w", str(tmp_path / "alone"), str(project)],
                           env={**os.environ, **host_leaks}, capture_output=True, text=True)
    assert alone.returncode != 0
    assert "CUDA_HOME environment variable is not set" in alone.stdout + alone.stderr

    assert _smoke(project, "cpu", tmp_path) == {
        "import": "pass", "torch-match": "pass", "census:scale:CPU": "pass",
        "module:host_guessing._C": "pass"}


@pytest.mark.slow
@pytest.mark.realtorch  # torch 2.14.1's CUDA build (about 5.5 GB) and nvcc: minutes
def test_host_guessing_setup_py_builds_cu130_unedited_and_a_cpu_only_guess_fails(tmp_path):
    if not (HOST_TOOLKIT / "bin" / "nvcc").exists():
        pytest.skip("needs the CUDA 13.0 toolkit in /usr/local/cuda-13.0")
    project = _project(tmp_path / "host_guessing")
    python = _env("env-cu130")
    work = WORK / "cu130"
    # a CI runner's shell: no CUDA variable, no nvcc on PATH, no GPU
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep)
                           if not (Path(p) / "nvcc").exists())
    bare = {"PATH": path, "CUDA_HOME": "", "CUDA_PATH": ""}
    built = opforge_cli("build", "--variant", "cu130", "--python", python, "--work-dir",
                        str(work), cwd=project, env=bare)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    assert _guesses(work) == ("{'nvcc': True, 'CUDA_HOME': True, "
                              "'torch.cuda.is_available()': True, "
                              "'cpp_extension.CUDA_HOME': True}")
    wheel = Path(built.stdout.strip().splitlines()[-1])
    assert "+cu130-" in wheel.name and _modules(wheel) == {"_C", "_cuda"}
    inspected = opforge_cli("inspect", str(wheel), "--expect-variant", "cu130", "--json",
                            "--allow-host-floor", cwd=project)
    report = json.loads(inspected.stdout)
    assert inspected.returncode == 0 and report["problems"] == [], report["problems"]
    assert report["build_info"]["backends"] == ["cpu", "cuda"]
    assert report["build_info"]["cuda_version"] == "13.0"

    # beside torch 2.14.1 in a fresh environment: the CUDA kernel registered, _cuda imports
    assert _smoke(project, "cu130", tmp_path) == {
        "import": "pass", "torch-match": "pass", "census:scale:CPU": "pass",
        "census:scale:CUDA": "pass", "module:host_guessing._C": "pass",
        "module:host_guessing._cuda": "pass"}

    # planted: a guess no build environment answers (the driver), so no _cuda module;
    # the wheel's Python would import fine, the build refuses it
    planted = opforge_cli("build", "--variant", "cu130", "--python", python, "--no-install",
                          "--work-dir", str(work), "--build-env", "HOST_GUESSING_PROBE=nvidia-smi",
                          cwd=project, env=bare)
    assert planted.returncode == 1, planted.stdout[-2000:] + planted.stderr[-2000:]
    assert _guesses(work) == "{'nvidia-smi': False}"
    assert "this CUDA variant's build produced no device code" in planted.stderr
    assert "_C." in planted.stderr and "Traceback" not in planted.stderr
