# /// script
# dependencies = ["nox>=2025.2.9", "pyyaml>=6", "rich>=13", "packaging>=23", "platformdirs>=3", "virtualenv>=20.24", "uv>=0.5"]
# ///
"""opforge's sessions: the matrix's, from opforge.nox exactly as any repository registers
them, plus this repository's own `tests` and `lint`.

nox reads the PEP 723 block above and runs itself in an environment that has opforge's
dependencies, so `pip install nox` is all a fresh machine needs. (A user's noxfile lists
`opforge` there instead of putting src/ on the path.)
"""

from __future__ import annotations

import sys
from pathlib import Path

import nox

ROOT = Path(__file__).parent
sys.path.insert(0, str(ROOT / "src"))  # this checkout's opforge; its sessions install it too

import opforge.nox  # noqa: E402
from opforge.nox import lint_commands  # noqa: E402

# nox -s bench: the recipes' references are torchvision.ops (not part of .ci/run)
MATRIX = opforge.nox.sessions(ROOT / "matrix.yaml", bench_with=("torchvision",))
CXX_SUFFIXES = {".h", ".cpp", ".cu", ".cuh", ".mm"}  # what clang-format checks in extension/csrc

nox.options.sessions = ["lint", "tests"]
nox.options.reuse_venv = "yes"  # a second build reuses the env, so ninja reuses the objects


@nox.session(venv_backend=opforge.nox.VENV_BACKEND)
def tests(session: nox.Session) -> None:
    """Build the CPU extension from source, then run the kernel and harness test suites."""
    # its own build cache: this env's torch paths differ from build_cpu's, so sharing would
    # make each rebuild everything
    work_dir = ROOT / "build" / "tests"
    wheel = opforge.nox.build(session, MATRIX, "cpu", "--work-dir", str(work_dir),
                              "--out", str(work_dir / "dist"))
    opforge.nox.install(session, "-e", ".[test,build,lint]")
    opforge.nox.install(session, "--no-deps", "--force-reinstall", str(wheel))
    # the harness and the kernel tests (against the installed wheel) on a worker per core;
    # tests/conftest.py keeps what shares a build on one worker (`-- -n 0`: one process)
    session.run("pytest", "-n", "auto", "--maxprocesses", "4", "--dist", "loadgroup",
                "--durations=15", "tests", "extension/tests", *session.posargs,
                env={"OPFORGE_TEST_WHEEL": str(wheel), "OPFORGE_TEST_BUILD_DIR": str(work_dir)})


# the emulations compile csrc themselves, legacy and stable alike (test_cuda.py's test_emulated_*
# too): the tests session runs them
NOT_EMULATED = "not (cuda_emu or cuda_stable_emu or metal_emu or metal_shim_emu or test_emulated)"


@nox.session(venv_backend=opforge.nox.VENV_BACKEND)
def tests_stable(session: nox.Session) -> None:
    """Run the kernel tests on dist/cpu_stable's stable-ABI wheel beside the matrix's torch."""
    wheels = sorted(MATRIX.dist_dir("cpu_stable").glob("*.whl"))
    if len(wheels) != 1:
        session.error("tests_stable needs the one wheel `nox -s build_cpu_stable` leaves in "
                      f"dist/cpu_stable, found {len(wheels)}")
    # the wheel asks for torch>=floor: the torch it is tested with is the matrix's
    torch_spec = MATRIX.torch_spec(MATRIX.variant("cpu_stable"))
    opforge.nox.install(session, str(wheels[0]), torch_spec, "pytest", "pytest-xdist", "hypothesis",
                        "expecttest", "numpy")
    session.run("pytest", "-n", "auto", "--maxprocesses", "4", "-q", "-k", NOT_EMULATED,
                "extension/tests", *session.posargs)


@nox.session(venv_backend=opforge.nox.VENV_BACKEND)
def compat(session: nox.Session) -> None:
    """Run the torchvision compatibility suite on dist/cu130's wheel beside torchvision."""
    wheels = sorted(MATRIX.dist_dir("cu130").glob("*.whl"))
    if len(wheels) != 1:
        session.error(f"compat needs the one wheel `nox -s build_cu130` leaves in dist/cu130, found {len(wheels)}")
    # the wheel pins its torch; pip picks the torchvision release built for that torch
    opforge.nox.install(session, str(wheels[0]), "torchvision", "pytest")
    session.run("pytest", "-q", "--durations=10", "extension/tests/torchvision_compat", *session.posargs,
                env={"OPFORGE_REQUIRE_TORCHVISION": "1"})


@nox.session(venv_backend=opforge.nox.VENV_BACKEND)
def compat_stable(session: nox.Session) -> None:
    """The torchvision compatibility suite on dist/cpu_stable's wheel (not in .ci/run, which runs
    it on the cu130 wheel): the stable build's own kernels and its Python quantized ops."""
    wheels = sorted(MATRIX.dist_dir("cpu_stable").glob("*.whl"))
    if len(wheels) != 1:
        session.error("compat_stable needs the one wheel `nox -s build_cpu_stable` leaves in "
                      f"dist/cpu_stable, found {len(wheels)}")
    # the stable wheel runs on any torch from its floor: pip picks torchvision's newest release
    # and the torch that release is built for
    opforge.nox.install(session, str(wheels[0]), "torchvision", "pytest")
    session.run("pytest", "-q", "--durations=10", "extension/tests/torchvision_compat", *session.posargs,
                env={"OPFORGE_REQUIRE_TORCHVISION": "1"})


@nox.session(venv_backend=opforge.nox.VENV_BACKEND)
def realtorch(session: nox.Session) -> None:
    """The tests that download real torch releases (several GB each; not part of .ci/run)."""
    # the matrix's torch too: test modules that import torch at collection run, not skip
    opforge.nox.install(session, "-e", ".[test,build]", MATRIX.torch_spec(MATRIX.variant("cpu")))
    # -m here replaces the "not realtorch" that pyproject's addopts adds
    session.run("pytest", "-m", "realtorch", "--durations=0", "tests", *session.posargs)


@nox.session(venv_backend=opforge.nox.VENV_BACKEND)
def release(session: nox.Session) -> None:
    """opforge's release: -- --tag vX.Y.Z --commit SHA: stamp, build, twine check, try (release.yml)."""
    opforge.nox.install(session, "-e", ".", "build", "twine")
    session.run("python", "-c", "import sys; from opforge.release import main; "
                "sys.exit(main(sys.argv[1:]))", *session.posargs)


@nox.session(venv_backend=opforge.nox.VENV_BACKEND)
def styles(session: nox.Session) -> None:
    """init -> build -> smoke -> bench of every extension style under tests/adopt/styles (not in .ci/run)."""
    opforge.nox.install(session, "-e", ".[test,build]")
    session.run("pytest", "-m", "styles or not styles", "--durations=0", "tests/adopt/test_styles.py",
                *session.posargs)


@nox.session(venv_backend=opforge.nox.VENV_BACKEND)
def trust(session: nox.Session) -> None:
    """Real registry packages' sdists, unedited: init -> build cpu -> smoke green, then planted
    breaks red and named (tests/trust; downloads; not in .ci/run)."""
    opforge.nox.install(session, "-e", ".[test,build]")
    # -m here replaces the "not trust" that pyproject's addopts adds
    session.run("pytest", "-m", "trust", "--durations=0", "tests/trust", *session.posargs)


@nox.session(venv_backend=opforge.nox.VENV_BACKEND)
def replay(session: nox.Session) -> None:
    """ci.yml's cpu cell replayed by act on this host: build, upload, download, smoke (not in .ci/run)."""
    opforge.nox.install(session, "-e", ".[test]")
    # -m here replaces the "not replay" that pyproject's addopts adds
    session.run("pytest", "-m", "replay", "--durations=0", "tests/workflows/test_workflow_replay.py",
                *session.posargs)


@nox.session(venv_backend=opforge.nox.VENV_BACKEND)
def lint(session: nox.Session) -> None:
    """ruff, clang-format on extension/csrc, matrix.yaml validation, the workflow checks, zizmor."""
    opforge.nox.install(session, "-e", ".[lint]")
    session.run("ruff", "check", "src", "tests", "noxfile.py", "benchmarks", "extension")
    csrc = sorted(str(p) for p in (ROOT / "extension" / "csrc").rglob("*") if p.suffix in CXX_SUFFIXES)
    session.run("clang-format", "--dry-run", "--Werror", *csrc)
    session.run("opforge", "matrix", "--check", "--file", str(MATRIX.path))
    for command in lint_commands(ROOT):
        session.run(*command)
    # the workflows' security (template injection, unpinned actions and images, credentials);
    # offline: no GitHub API, so lint runs the same without a network. Any finding fails lint
    session.run("zizmor", "--offline", "--no-progress", str(ROOT / ".github" / "workflows"))
