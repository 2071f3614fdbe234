# /// script
# dependencies = ["nox>=2025.2.9", "pyyaml>=6", "rich>=13", "packaging>=23", "platformdirs>=3", "virtualenv>=20.24"]
# ///
"""opforge's sessions, generated from matrix.yaml; every step's logic lives in src/opforge.

nox reads the PEP 723 block above and runs itself in an environment that has opforge's
dependencies, so `pip install nox` is all a fresh machine needs.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nox

ROOT = Path(__file__).parent
sys.path.insert(0, str(ROOT / "src"))

from opforge import build, sessions  # noqa: E402
from opforge.matrix import MatrixError, load_matrix  # noqa: E402

try:
    MATRIX = load_matrix(ROOT / "matrix.yaml")
except MatrixError as _exc:
    print(f"opforge: error: {_exc}", file=sys.stderr)
    raise SystemExit(2) from None
HOST_VARIANT = "cpu"  # the variant every host can build; tests and smoke use it

nox.options.sessions = ["lint", "tests"]
nox.options.reuse_venv = "yes"  # a second build reuses the env, so ninja reuses the objects


def _build(session: nox.Session, variant: str, posargs: list[str],
           work_dir: Path | None = None) -> Path:
    args = sessions.parse_build_args(posargs)
    plan = build.plan_build(MATRIX, variant, out_dir=args.out, torch_index=args.torch_index,
                            omit_kernels=args.omit_kernels, work_dir=work_dir)
    if args.dry_run:
        session.log("\n" + plan.describe())
        session.skip("dry run: nothing was built")
    try:
        build.check_host(MATRIX, plan.variant)
    except build.OpforgeError as exc:
        session.error(str(exc))
    build.prepare(plan)
    session.install(*plan.install)  # torch, from the variant's index
    session.install(*plan.tools)
    for step in (plan.build, plan.repair):
        if step is not None:
            session.run(*build.expand(step, "python"), env=step.env)
    wheel = build.finish(plan)
    problems = [] if args.omit_kernels else build.verify(wheel, plan.variant)
    if problems:
        session.error(f"{wheel.name} contradicts variant {variant}: " + "; ".join(problems))
    session.log(f"wheel: {wheel}")
    return wheel


for _variant in MATRIX.variants:
    def _session(session: nox.Session, _name: str = _variant.name) -> None:
        _build(session, _name, session.posargs)

    _session.__doc__ = sessions.build_doc(MATRIX, _variant)
    nox.session(name=_variant.build_session)(_session)


@nox.session
def tests(session: nox.Session) -> None:
    """Build the CPU extension from source, then run the kernel and harness test suites."""
    # its own build cache: this env's torch paths differ from build_cpu's, so sharing would
    # make each rebuild everything
    work_dir = ROOT / "build" / "tests"
    wheel = _build(session, HOST_VARIANT, [], work_dir=work_dir)
    session.install("-e", ".[test,build,lint]")
    session.install("--no-deps", "--force-reinstall", str(wheel))
    # harness tests first (fast), then the kernel tests against the installed wheel
    session.run("pytest", "--durations=15", "tests", "extension/tests", *session.posargs,
                env={"OPFORGE_TEST_WHEEL": str(wheel), "OPFORGE_TEST_BUILD_DIR": str(work_dir)})


@nox.session
def lint(session: nox.Session) -> None:
    """ruff, matrix.yaml validation, and the workflow checks (actionlint, schema, drift)."""
    session.install("-e", ".[lint]")
    session.run("ruff", "check", "src", "tests", "noxfile.py", "benchmarks", "extension")
    session.run("opforge", "matrix", "--check")
    for command in sessions.lint_commands(Path(__file__).parent):
        session.run(*command)


@nox.session
def matrix(session: nox.Session) -> None:
    """Show the jobs matrix.yaml expands to (-- --json, --github, --variant V, ...)."""
    session.install("-e", ".")
    session.run("opforge", "matrix", *session.posargs)


@nox.session
def smoke(session: nox.Session) -> None:
    """Smoke-test a wheel in a fresh env (default: dist/<variant>'s, cpu; -- opforge smoke args)."""
    session.install("-e", ".")
    session.run("opforge", "smoke", *sessions.smoke_args(MATRIX, session.posargs, HOST_VARIANT))


@nox.session
def bisect(session: nox.Session) -> None:
    """Find the first bad torch nightly (-- --good DATE --bad DATE [opforge bisect args])."""
    session.install("-e", ".")
    session.run("opforge", "bisect", *session.posargs)
