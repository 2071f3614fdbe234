"""Fresh virtual environments and installs into them: uv when it is there, else venv + pip.

Every environment opforge makes (the smoke test's, bisect's per nightly, ``opforge build``'s)
is made here. uv makes one and installs torch into it from its global cache by hard-linking,
in about a second once torch was downloaded; without uv, virtualenv (or ``python -m venv``) and
pip do the same work in tens of seconds, and opforge says so once.

uv gets pip's effective configuration (``opforge.pipconfig``) and the index rules pip would
apply, so both paths install the same builds. ``OPFORGE_INSTALLER=pip`` keeps the pip path,
``OPFORGE_INSTALLER=uv`` requires uv.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

from opforge.errors import OpforgeError, UsageError
from opforge.pipconfig import PipConfig, read_pip_config
from opforge.progress import show_tail, step

INSTALLER_ENV = "OPFORGE_INSTALLER"
INSTALLERS = ("uv", "pip")


def venv_python(env_dir: Path) -> Path:
    bindir = "Scripts" if os.name == "nt" else "bin"
    exe = "python.exe" if os.name == "nt" else "python"
    return Path(env_dir) / bindir / exe


def find_uv() -> str | None:
    """The uv binary: the ``uv`` package's (opforge depends on it), else the one on PATH."""
    # the uv package may be missing (then uv on PATH); venv is on the CLI's startup path
    try:
        from uv import find_uv_bin

        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        return shutil.which("uv")


@cache
def _notice_once(text: str) -> None:
    print(f"opforge: {text}", file=sys.stderr, flush=True)


@dataclasses.dataclass(frozen=True)
class Installer:
    """Makes environments and installs into them; ``uv`` is None on the pip path."""

    uv: str | None

    @property
    def name(self) -> str:
        return "uv" if self.uv else "pip"

    def create(self, env_dir: Path, python: str | None = None, *, with_pip: bool = False) -> Path:
        """A new environment at ``env_dir`` for ``python`` (default: this interpreter); its
        interpreter. ``with_pip``: the environment gets its own pip (``python -m pip``)."""
        env_dir = Path(env_dir)
        base = python or sys.executable
        if self.uv:
            cmd = [self.uv, "venv", "--quiet", "--no-config", "--no-python-downloads",
                   "--python", base, str(env_dir)]
        else:
            cmd = _legacy_create_command(base, env_dir)
        with step(f"created an environment in {env_dir} with {self.name}"):
            result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            tail = (result.stderr or result.stdout).strip().splitlines()[-1:]
            raise OpforgeError(f"could not create a virtual environment at {env_dir}: "
                               f"{' '.join(tail)}")
        interpreter = venv_python(env_dir)
        if with_pip and self.uv:
            self.install(interpreter, "pip")
        return interpreter

    def command(self, python: Path | str, *pip_args: str) -> tuple[list[str], dict[str, str]]:
        """The command (and the variables it adds) for ``pip install PIP_ARGS`` into
        ``python``'s environment."""
        if not self.uv:
            return ([str(python), "-m", "pip", "--disable-pip-version-check", "--no-input",
                     "install", *pip_args], {})
        config = read_pip_config()
        args = uv_install_args(pip_args, config)
        return ([self.uv, "pip", "install", "--python", str(python), "--no-config", *args],
                config.uv_env())

    def install(self, python: Path | str, *pip_args: str, env: dict | None = None,
                what: str | None = None) -> subprocess.CompletedProcess:
        """``pip install PIP_ARGS`` into ``python``'s environment; OpforgeError with the
        installer's own error lines on failure."""
        cmd, extra = self.command(python, *pip_args)
        # COLUMNS: uv wraps its reasons at the terminal width (COLUMNS=80 cut "no wheels | with
        # a matching Python version tag" in two), and _error_lines keeps whole lines only
        full_env = {**(os.environ if env is None else env), **extra, "COLUMNS": "100000"}
        shown = what or " ".join(a for a in pip_args if not a.startswith("-"))[:120]
        with step(f"installed {shown} with {self.name}"):  # not said when it failed
            result = subprocess.run(cmd, capture_output=True, text=True, env=full_env)
            if result.returncode != 0:
                show_tail(f"pip install {shown}",
                          ((result.stderr or "") + (result.stdout or "")).splitlines())
                errors = _error_lines(result)
                hint = torch_index_hint(pip_args, errors)
                raise OpforgeError(f"pip install failed: {errors}" + (f"; {hint}" if hint else ""))
        return result


# what pip and uv say when an index cannot be reached (not: when it lacks the version)
_UNREACHABLE = re.compile(r"\bdns\b|name or service not known|lookup address|connect|"
                          r"timed? ?out|unreachable|network|proxy|ssl|certificate|"
                          r"failed to fetch|could not fetch|max retries", re.I)
_INDEX_OPTIONS = ("--index-url", "-i", "--default-index")


def torch_index_hint(pip_args, errors: str) -> str:
    """For a failed install that asked for torch: its likely cause and the two ways to take
    torch from elsewhere ('' for an install without torch)."""
    args = list(pip_args)
    spec = next((a for a in args if re.match(r"torch(?![\w.-])", a)), None)
    if spec is None:
        return ""
    index = next((args[i + 1] for i, a in enumerate(args[:-1]) if a in _INDEX_OPTIONS), None)
    index = index or next((a.split("=", 1)[1] for a in args
                           if a.split("=", 1)[0] in _INDEX_OPTIONS and "=" in a), None)
    where = f"the torch index {index}" if index else "pip's configured index"
    cause = ("cannot be reached from here" if not errors or _UNREACHABLE.search(errors)
             else f"has no {spec} for this platform and Python")
    return (f"likely cause: {where} {cause}; take torch from elsewhere with --torch-index or "
            "OPFORGE_TORCH_INDEX (pypi: pip's configured index, a URL, or a folder of wheels)")


def _legacy_create_command(base: str, env_dir: Path) -> list[str]:
    # virtualenv (~30 ms) only for the fallback without uv, and it may be missing
    try:
        import virtualenv  # noqa: F401
    except ImportError:
        return [base, "-m", "venv", str(env_dir)]
    # seeds pip from its wheel cache: ~1 s, where venv's ensurepip takes 4-12 s
    return [sys.executable, "-m", "virtualenv", "-q", "--python", base,
            "--no-setuptools", "--no-wheel", "--no-periodic-update", str(env_dir)]


def _error_lines(result: subprocess.CompletedProcess) -> str:
    out = ((result.stderr or "") + (result.stdout or "")).strip().splitlines()
    # pip says "ERROR: ..."; uv says "error: ..." and explains on "cause:"/"hint:" lines
    keep = [line.strip() for line in out
            if line.lstrip().lower().startswith(("error", "cause:", "×", "╰─▶"))]
    return " | ".join(re.sub(r"^(?:error|ERROR):\s*", "", line) for line in (keep or out)[-3:])


# pip options opforge passes, in uv's words; options uv has no use for are dropped
_RENAMED = {"--force-reinstall": ["--reinstall"], "--ignore-installed": ["--reinstall"],
            "--pre": ["--prerelease", "allow"], "--upgrade": ["--upgrade"], "-U": ["--upgrade"]}
_DROPPED = {"--disable-pip-version-check", "--no-input"}
_WITH_VALUE = {"--index-url": "--default-index", "-i": "--default-index",
               "--extra-index-url": "--index", "--find-links": "--find-links",
               "-f": "--find-links", "--constraint": "--constraint", "-c": "--constraint"}


def uv_install_args(pip_args: tuple[str, ...] | list[str], config: PipConfig) -> list[str]:
    """``uv pip install`` arguments equivalent to pip's ``install PIP_ARGS`` under
    ``config``: the command line wins over the configuration, as in pip."""
    translated: list[str] = []
    args = list(pip_args)
    i = 0
    while i < len(args):
        arg = args[i]
        name, eq, value = arg.partition("=")
        if name in _WITH_VALUE and arg.startswith("--") and eq:
            translated += [_WITH_VALUE[name], value]
        elif arg in _WITH_VALUE and i + 1 < len(args):
            translated += [_WITH_VALUE[arg], args[i + 1]]
            i += 1
        elif arg in _RENAMED:
            translated += _RENAMED[arg]
        elif arg not in _DROPPED:
            translated.append(arg)
        i += 1
    if "--default-index" in translated:  # --index-url on the command line replaces pip.conf's
        config = dataclasses.replace(config, index_url=None)
    if "--no-index" in translated:
        config = dataclasses.replace(config, no_index=False)
    if "--prerelease" in translated:
        config = dataclasses.replace(config, pre=False)
    return [*config.uv_args(), *translated]


def installer(choice: str | None = None) -> Installer:
    """uv when found (or required by ``OPFORGE_INSTALLER=uv``), else the pip path with a
    one-line notice; ``OPFORGE_INSTALLER=pip`` chooses the pip path."""
    choice = choice or os.environ.get(INSTALLER_ENV) or None
    if choice not in (None, *INSTALLERS):
        raise UsageError(f"{INSTALLER_ENV}={choice!r}: expected one of {', '.join(INSTALLERS)}")
    if choice == "pip":
        return Installer(uv=None)
    uv = find_uv()
    if uv is None:
        if choice == "uv":
            raise UsageError(f"{INSTALLER_ENV}=uv but no uv was found: pip install uv")
        _notice_once("uv not found: making environments with virtualenv and pip "
                     "(slower; pip install uv for the fast path)")
    return Installer(uv=uv)


def create_venv(env_dir: Path, python: str | None = None, *, with_pip: bool = False) -> Path:
    """A fresh environment at ``env_dir``; return its interpreter (see ``Installer.create``)."""
    return installer().create(env_dir, python, with_pip=with_pip)


def install(python: Path | str, *pip_args: str, env: dict | None = None,
            what: str | None = None) -> subprocess.CompletedProcess:
    """``pip install PIP_ARGS`` into ``python``'s environment, with uv when there is one."""
    return installer().install(python, *pip_args, env=env, what=what)


def check_installer_variable(name: str, value: str) -> None:
    """OPFORGE_INSTALLER's value (opforge.envvars checks it before any command acts)."""
    if value not in INSTALLERS:
        raise UsageError(f"{name}={value!r}: expected one of {', '.join(INSTALLERS)}")
