"""The nox sessions any repository registers from its matrix, in one call.

A user's whole ``noxfile.py``::

    import opforge.nox

    opforge.nox.sessions("matrix.yaml")

registers ``build_<variant>`` for every variant, ``smoke``, ``bench``, ``matrix`` and
``bisect``. Every session installs opforge itself (the version running nox: the same release,
or the same source tree) and runs ``opforge`` commands in the session's environment; none
installs the user's repository (no ``pip install -e .``: that would build the extension against
whatever torch the resolver picks and leave compiled files in the tree). ``nox -s build_cpu --
ARGS`` passes ARGS to ``opforge build``, ``nox -s smoke -- ARGS`` to ``opforge smoke``, ``nox
-s bench -- ARGS`` to ``opforge bench``. Sessions use
nox's uv backend when uv is installed (``install`` passes pip's configuration to it).
"""

from __future__ import annotations

import json
import os
from importlib import metadata
from pathlib import Path

import nox

from opforge import __version__, platforms
from opforge.errors import OpforgeError
from opforge.matrix import Matrix, Variant, load_matrix
from opforge.pipconfig import read_pip_config
from opforge.venv import uv_install_args

INSTALL_ENV = "OPFORGE_NOX_INSTALL"  # overrides what the sessions install as opforge
# nox's uv backend (environments from uv's cache in seconds) when uv is there, else virtualenv
VENV_BACKEND = "uv|virtualenv"


def opforge_requirement() -> str:
    """How to install the opforge that is running: its source tree, its direct URL, or the
    release (``$OPFORGE_NOX_INSTALL`` overrides)."""
    if os.environ.get(INSTALL_ENV):
        return os.environ[INSTALL_ENV]
    tree = Path(__file__).resolve().parents[2]
    pyproject = tree / "pyproject.toml"
    if pyproject.is_file() and 'name = "opforge"' in pyproject.read_text(encoding="utf-8"):
        return str(tree)  # running from a checkout of opforge itself
    try:
        direct = metadata.distribution("opforge").read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        direct = None
    if direct:
        url = json.loads(direct).get("url")
        if url:
            return f"opforge @ {url}"
    return f"opforge=={__version__}"


def install(session: nox.Session, *args: str) -> None:
    """``session.install(ARGS)`` that installs what pip would: under nox's uv backend, pip's
    configuration (indexes, find-links, constraints, certificates) is said to uv."""
    if getattr(session.virtualenv, "venv_backend", None) == "uv":
        config = read_pip_config()
        session.install("--no-config", *uv_install_args(args, config), env=config.uv_env())
    else:
        session.install(*args)


def install_opforge(session: nox.Session) -> None:
    install(session, opforge_requirement())


def session_python(session: nox.Session) -> str:
    return str(Path(session.bin) / ("python.exe" if os.name == "nt" else "python"))


def build(session: nox.Session, matrix: Matrix, variant: str, *args: str) -> Path | None:
    """Build ``variant``'s wheel in this session's environment; the wheel's path (None for a
    dry run). ``args`` go to ``opforge build`` (``--out``, ``--work-dir``, ``--dry-run``...)."""
    install_opforge(session)
    out = Path(_option(args, "--out") or matrix.dist_dir(variant))
    session.run("opforge", "build", "--file", str(matrix.path), "--variant", variant,
                "--python", session_python(session), *args)
    if "--dry-run" in args:
        return None
    wheels = sorted(out.glob("*.whl"))
    if len(wheels) != 1:
        session.error(f"expected one wheel in {out}, found {len(wheels)}")
    return wheels[0]


def _option(args: tuple[str, ...] | list[str], name: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def lint_commands(root: Path) -> list[list[str]]:
    """The workflow checks a lint session runs, once ``root``/.github/workflows exists."""
    workflows = sorted((root / ".github" / "workflows").glob("*.yml"))
    if not workflows:
        return []
    files = [str(p) for p in workflows]
    return [
        ["opforge", "workflows", "check", "--root", str(root)],
        ["actionlint", *files],
        ["check-jsonschema", "--builtin-schema", "vendor.github-workflows", *files],
    ]


def build_doc(matrix: Matrix, variant: Variant) -> str:
    what = platforms.get(variant.backend).kernels(variant)
    return (f"Build the {variant.name} wheel: {what} kernels, torch "
            f"{variant.torch_version or matrix.torch.version}, for "
            f"{', '.join(variant.platforms)} (-- --dry-run shows the plan).")


def _with_target(matrix: Matrix, posargs) -> list[str]:
    """The arguments, with ``--variant`` of the default variant when they name no target."""
    args = list(posargs)
    if not any(_option(args, a) or a in args for a in
               ("--wheel", "--requirement", "--python", "--variant")):
        args = ["--variant", default_variant(matrix), *args]
    return args


def default_variant(matrix: Matrix) -> str:
    """The variant `nox -s smoke` tests without arguments: cpu when there is one."""
    names = [v.name for v in matrix.variants]
    return "cpu" if "cpu" in names else names[0]


def sessions(matrix_path: str | os.PathLike = "matrix.yaml", *,
             bench_with: tuple[str, ...] = ()) -> Matrix:
    """Register the matrix's sessions in the calling noxfile; returns the parsed matrix.

    A relative path is taken from the noxfile's directory (nox runs from there).
    ``bench_with``: requirements `nox -s bench` installs beside the wheel for the recipes'
    references (``("torchvision",)``).
    """
    try:
        matrix = load_matrix(Path(matrix_path).resolve())
    except OpforgeError as exc:
        raise SystemExit(f"opforge: error: {exc}") from None
    file = str(matrix.path)

    for variant in matrix.variants:
        def build_session(session: nox.Session, _name: str = variant.name) -> None:
            build(session, matrix, _name, *session.posargs)

        build_session.__doc__ = build_doc(matrix, variant)
        nox.session(name=variant.build_session, venv_backend=VENV_BACKEND)(build_session)

    def smoke(session: nox.Session) -> None:
        install_opforge(session)
        session.run("opforge", "smoke", "--file", file, *_with_target(matrix, session.posargs))

    smoke.__doc__ = (f"Smoke-test a wheel in a fresh env (default: dist/{default_variant(matrix)}'s; "
                     "-- --variant V, --wheel PATH, ...: opforge smoke's arguments).")
    nox.session(name="smoke", venv_backend=VENV_BACKEND)(smoke)

    def bench(session: nox.Session) -> None:
        install_opforge(session)
        extras = [arg for req in bench_with for arg in ("--with", req)]
        session.run("opforge", "bench", "--file", file, *extras,
                    *_with_target(matrix, session.posargs))

    bench.__doc__ = (f"Time a wheel's workloads against the recipes' references (default: "
                     f"dist/{default_variant(matrix)}'s; -- opforge bench's arguments).")
    nox.session(name="bench", venv_backend=VENV_BACKEND)(bench)

    def matrix_session(session: nox.Session) -> None:
        """Show the jobs matrix.yaml expands to (-- --json, --github, --variant V, ...)."""
        install_opforge(session)
        session.run("opforge", "matrix", "--file", file, *session.posargs)

    nox.session(name="matrix", venv_backend=VENV_BACKEND)(matrix_session)

    def bisect(session: nox.Session) -> None:
        """Find the first bad torch nightly (-- --good DATE --bad DATE [opforge bisect args])."""
        install_opforge(session)
        session.run("opforge", "bisect", *session.posargs,
                    env={"OPFORGE_MATRIX": file})

    nox.session(name="bisect", venv_backend=VENV_BACKEND)(bisect)
    return matrix
