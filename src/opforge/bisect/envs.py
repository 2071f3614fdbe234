"""One cached virtual environment per nightly, reused by every later bisect.

An environment is ``<cache>/envs/<wheel name>-<sha256 prefix>/``; it is valid once its
marker file (written last) records the torch wheel that was installed. A second bisect over
the same nightlies therefore downloads and installs nothing. An environment without a marker
(an interrupted install) is removed and made again.

With uv (``opforge.venv``) an environment is made and filled from uv's cache in about a
second, pip's configuration translated. Without it, creation uses ``python -m venv
--without-pip`` and the running interpreter's pip with ``--python`` (0.05 s + 0.7 s for a small
wheel; ``python -m venv`` with ensurepip takes 4-12 s). An environment that needs its own pip
(the default mode builds the extension in it) is made with virtualenv (about 1.3 s), or venv
when virtualenv is missing.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from opforge.errors import OpforgeError
from opforge.venv import installer

from .index import Nightly, download, sha256_of

MARKER = "opforge-env.json"
SCHEMA = 1


def cache_dir() -> Path:
    """OPFORGE_CACHE_DIR, else XDG_CACHE_HOME/opforge, else the platform's user cache dir."""
    override = os.environ.get("OPFORGE_CACHE_DIR")
    if override:
        return Path(override).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg).expanduser() / "opforge"
    import platformdirs

    return Path(platformdirs.user_cache_dir("opforge", appauthor=False))


def env_python(env_dir: Path) -> Path:
    if os.name == "nt":
        return env_dir / "Scripts" / "python.exe"
    return env_dir / "bin" / "python"


@dataclass
class NightlyEnv:
    """A ready environment: its interpreter, what it holds, and what this run had to do."""

    path: Path
    python: Path
    torch_version: str
    git_version: str | None
    sha256: str
    extras: dict[str, str] = field(default_factory=dict)  # wheel filename -> sha256
    actions: list[str] = field(default_factory=list)      # what this run downloaded/installed

    @property
    def reused(self) -> bool:
        return not self.actions

    def run_env(self) -> dict[str, str]:
        """os.environ with this environment activated, and nothing leaking in from outside."""
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)
        env.pop("PYTHONHOME", None)
        env["VIRTUAL_ENV"] = str(self.path)
        env["PATH"] = str(self.python.parent) + os.pathsep + env.get("PATH", "")
        env["PYTHONNOUSERSITE"] = "1"
        return env


def _host_pip_works() -> bool:
    # pip >= 22.3 can install into another interpreter with --python
    # Read the version from metadata: importing pip in-process (Python < 3.12) makes
    # setuptools' distutils shim stand down for the rest of the process, which breaks any
    # later torch.utils.cpp_extension / inductor build in it.
    from importlib import metadata

    try:
        version = metadata.version("pip")
        major, minor = (int(x) for x in version.split(".")[:2])
    except (metadata.PackageNotFoundError, ValueError):
        return False
    return (major, minor) >= (22, 3)


class EnvCache:
    def __init__(self, root: Path, base_python: str, pip_index_args: list[str],
                 with_pip: bool = False):
        self.root = root
        self.base_python = base_python
        self.pip_index_args = pip_index_args
        self.with_pip = with_pip  # building the extension in the env needs its own pip
        self._host_pip = _host_pip_works()
        self.installer = installer()

    def env_dir(self, nightly: Nightly) -> Path:
        stem = nightly.filename[:-4] if nightly.filename.endswith(".whl") else nightly.filename
        return self.root / "envs" / stem.replace("+", "_")

    def _read_marker(self, path: Path, nightly: Nightly) -> dict | None:
        try:
            data = json.loads((path / MARKER).read_text())
        except (OSError, ValueError):
            return None
        if data.get("schema") != SCHEMA or data.get("torch", {}).get("url") != nightly.url:
            return None
        if not env_python(path).exists():
            return None
        return data

    def _write_marker(self, env: NightlyEnv, url: str) -> None:
        data = {"schema": SCHEMA,
                "torch": {"url": url, "version": env.torch_version, "sha256": env.sha256,
                          "git_version": env.git_version},
                "extras": env.extras}
        tmp = env.path / (MARKER + ".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, env.path / MARKER)

    def pip_install(self, python: Path, *args: str) -> None:
        if self.installer.uv:
            self.installer.install(python, *args, *self.pip_index_args)
            return
        if self._host_pip:
            cmd = [sys.executable, "-m", "pip", "--python", str(python)]
        else:
            cmd = [str(python), "-m", "pip"]
        cmd += ["install", "--disable-pip-version-check", "--no-input", "-q", *args,
                *self.pip_index_args]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            lines = (result.stderr + result.stdout).strip().splitlines()
            errors = [line for line in lines if "ERROR" in line] or lines[-3:]
            raise OpforgeError(f"pip install failed: {' | '.join(errors[-3:])}")

    def ensure(self, nightly: Nightly) -> NightlyEnv:
        """The nightly's environment, made (download, venv, pip install) only if missing."""
        path = self.env_dir(nightly)
        marker = self._read_marker(path, nightly)
        if marker is not None:
            torch = marker["torch"]
            env = NightlyEnv(path, env_python(path), torch["version"], torch.get("git_version"),
                             torch["sha256"], dict(marker.get("extras", {})))
            if self.with_pip and not _has_pip(env.python):
                _ensurepip(env.python)
                env.actions.append("installed pip")
            return env
        actions = []
        t0 = time.monotonic()
        wheel, sha = download(nightly, self.root / "wheels")
        actions.append(f"downloaded {nightly.filename}")
        if path.exists():
            shutil.rmtree(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        python = self._create(path)
        self.pip_install(python, str(wheel))
        actions.append(f"installed torch {nightly.version} ({time.monotonic() - t0:.1f} s)")
        wheel.unlink(missing_ok=True)  # the environment is the cache; nightly wheels are large
        version, git_version = read_torch_version(path)
        env = NightlyEnv(path, python, version or nightly.version, git_version, sha, {}, actions)
        self._write_marker(env, nightly.url)
        return env

    def _create(self, path: Path) -> Path:
        if self.installer.uv:
            return self.installer.create(path, self.base_python, with_pip=self.with_pip)
        result = subprocess.run([*self._create_command(), str(path)], capture_output=True,
                                text=True)
        if result.returncode != 0:
            raise OpforgeError(f"cannot create an environment with {self.base_python}: "
                               f"{(result.stderr or result.stdout).strip()[-300:]}")
        return env_python(path)

    def _create_command(self) -> list[str]:
        if not self.with_pip and self._host_pip:
            return [self.base_python, "-m", "venv", "--without-pip"]
        if importlib.util.find_spec("virtualenv") is not None:
            # seeds pip from its wheel cache: ~1 s, where venv's ensurepip takes 4-12 s
            return [sys.executable, "-m", "virtualenv", "-q", "--python", self.base_python,
                    "--no-setuptools", "--no-wheel", "--no-periodic-update"]
        return [self.base_python, "-m", "venv"]

    def add_wheel(self, env: NightlyEnv, wheel: Path, nightly: Nightly) -> None:
        """Install ``wheel`` beside the nightly's torch (without its torch pin), once per sha."""
        sha = sha256_of(wheel)
        if env.extras.get(wheel.name) == sha:
            return
        self.pip_install(env.python, "--no-deps", "--force-reinstall", str(wheel))
        env.extras[wheel.name] = sha
        env.actions.append(f"installed {wheel.name}")
        self._write_marker(env, nightly.url)


def _has_pip(python: Path) -> bool:
    return subprocess.run([str(python), "-c", "import pip"], capture_output=True).returncode == 0


def _ensurepip(python: Path) -> None:
    # ensurepip carries its own pip wheel: no index needed
    result = subprocess.run([str(python), "-m", "ensurepip", "--default-pip"],
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise OpforgeError(f"cannot add pip to {python.parent.parent}: "
                           f"{(result.stderr or result.stdout).strip()[-300:]}")


def _site_packages(env_dir: Path) -> list[Path]:
    if os.name == "nt":
        return [env_dir / "Lib" / "site-packages"]
    return sorted(env_dir.glob("lib/python*/site-packages"))


def read_torch_version(env_dir: Path) -> tuple[str | None, str | None]:
    """``torch.version.__version__`` and ``git_version``, read from the file, not imported."""
    for site in _site_packages(env_dir):
        version_file = site / "torch" / "version.py"
        if version_file.is_file():
            return _version_fields(version_file.read_text(encoding="utf-8", errors="replace"))
    return None, None


def _version_fields(source: str) -> tuple[str | None, str | None]:
    values: dict[str, str] = {}
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None, None
    for node in tree.body:
        targets = []
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        for target in targets:
            if (isinstance(target, ast.Name) and isinstance(value, ast.Constant)
                    and isinstance(value.value, str)):
                values[target.id] = value.value
    return values.get("__version__"), values.get("git_version")
