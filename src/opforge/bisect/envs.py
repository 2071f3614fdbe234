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
import threading
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from opforge.errors import OpforgeError
from opforge.files import write_file
from opforge.locks import FileLock
from opforge.venv import installer

from .cache import build_lock, choose_evictions, list_envs, max_size_from_env, remove, use_lock
from .index import download, local_path, sha256_of
from .overlay import Commit, changed_python, make_overlay, overlay_ready
from .releases import Candidate, Release

MARKER = "opforge-env.json"
SCHEMA = 1


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
    build: dict = field(default_factory=dict)     # torch/version.py: version, git, cuda, ...
    packages: list[str] = field(default_factory=list)  # pip freeze, when it was made

    @property
    def reused(self) -> bool:
        return not self.actions

    def run_env(self, matrix: str | None = None) -> dict[str, str]:
        """os.environ with this environment activated, and nothing leaking in from outside;
        ``matrix`` (--file's) is the command's $OPFORGE_MATRIX."""
        env = dict(os.environ)
        if matrix:
            env["OPFORGE_MATRIX"] = matrix
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
    try:
        version = metadata.version("pip")
        major, minor = (int(x) for x in version.split(".")[:2])
    except (metadata.PackageNotFoundError, ValueError):
        return False
    return (major, minor) >= (22, 3)


class EnvCache:
    def __init__(self, root: Path, base_python: str, pip_index_args: list[str],
                 with_pip: bool = False, companions: list[str] | None = None):
        self.root = root
        self.base_python = base_python
        self.pip_index_args = pip_index_args
        self.with_pip = with_pip  # building the extension in the env needs its own pip
        self.companions = list(companions or [])  # --with: installed beside torch
        self._host_pip = _host_pip_works()
        self.installer = installer()

        self.max_size = max_size_from_env()  # OPFORGE_CACHE_MAX_SIZE: evict LRU beyond it
        self.in_use: set[Path] = set()
        self._held: dict[Path, FileLock] = {}   # use locks, held until the process exits
        self._held_guard = threading.Lock()  # the prefetch thread adds while the main one closes
        self.notes: list[str] = []

    def env_dir(self, nightly: Candidate) -> Path:
        stem = nightly.filename[:-4] if nightly.filename.endswith(".whl") else nightly.filename
        if self.companions:  # another set of packages: another environment
            stem += "-with-" + "-".join(self.companions)
        return self.root / "envs" / stem.replace("+", "_")

    def _read_marker(self, path: Path, nightly: Candidate) -> dict | None:
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
                "extras": env.extras, "build": env.build, "packages": env.packages}
        write_file(env.path / MARKER, json.dumps(data, indent=1), fsync=True)

    def pip_install(self, python: Path, *args: str, index_args: list[str] | None = None) -> None:
        index_args = self.pip_index_args if index_args is None else index_args
        if self.installer.uv:
            self.installer.install(python, *args, *index_args)
            return
        if self._host_pip:
            cmd = [sys.executable, "-m", "pip", "--python", str(python)]
        else:
            cmd = [str(python), "-m", "pip"]
        cmd += ["install", "--disable-pip-version-check", "--no-input", "-q", *args,
                *index_args]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            lines = (result.stderr + result.stdout).strip().splitlines()
            errors = [line for line in lines if "ERROR" in line] or lines[-3:]
            raise OpforgeError(f"pip install failed: {' | '.join(errors[-3:])}")

    def _cached(self, nightly: Candidate) -> NightlyEnv | None:
        """The candidate's environment if it is ready, without making anything."""
        path = self.env_dir(nightly)
        marker = self._read_marker(path, nightly)
        if marker is None:
            return None
        torch = marker["torch"]
        return NightlyEnv(path, env_python(path), torch["version"], torch.get("git_version"),
                          torch["sha256"], dict(marker.get("extras", {})),
                          build=dict(marker.get("build") or {}),
                          packages=list(marker.get("packages") or []))

    def ensure(self, nightly: Candidate) -> NightlyEnv:
        """The candidate's environment, made (download, venv, pip install) only if missing."""
        if isinstance(nightly, Commit):
            return self._overlay(nightly)
        path = self.env_dir(nightly)
        self._use(path)
        env = self._cached(nightly)
        if env is None:
            # one process makes it; the others wait here, then find it made
            with build_lock(path).acquire(waiting=self._waiting(path)):
                env = self._cached(nightly)
                if env is None:
                    return self._make(nightly, path)
        touch_used(path)
        self.in_use.add(path)
        if self.with_pip and not _has_pip(env.python):
            with build_lock(path).acquire(waiting=self._waiting(path)):
                if not _has_pip(env.python):
                    _ensurepip(env.python)
                    env.actions.append("installed pip")
        return env

    def close(self) -> None:
        """Release the use locks (the process exiting does it too)."""
        with self._held_guard:
            held, self._held = list(self._held.values()), {}
        for lock in held:
            lock.release()

    def _use(self, path: Path) -> None:
        """Mark the environment in use by this process (shared, until it exits): no other
        bisect's eviction or ``cache prune`` removes it meanwhile."""
        with self._held_guard:
            if path not in self._held:
                self._held[path] = use_lock(path).acquire(shared=True)

    def _waiting(self, path: Path):
        def say(holder: str) -> None:
            self.notes.append(f"waited for {holder} to make {path.name}")
            print(f"opforge bisect: waiting for {holder}, which is making {path.name}",
                  file=sys.stderr, flush=True)
        return say

    def _make(self, nightly: Candidate, path: Path) -> NightlyEnv:
        """Make the environment (under its build lock); its marker is written last."""
        actions = []
        t0 = time.monotonic()
        if path.exists():
            shutil.rmtree(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(nightly, Release) and nightly.by_requirement:
            # from the index by requirement: pip's / uv's own cache serves a release any other
            # environment on this machine already downloaded
            python = self._create(path)
            index = [] if nightly.index is None else ["--index-url", nightly.index]
            # one resolution: each companion release that pins this torch
            self.pip_install(python, f"torch=={nightly.version}", *self.companions,
                             index_args=index)
            sha = nightly.sha256 or ""
            actions.append(f"installed torch {nightly.version} from "
                           f"{nightly.index or 'the default index'} "
                           f"({time.monotonic() - t0:.1f} s)")
        else:
            wheel, sha = download(nightly, self.root / "wheels")
            actions.append(f"downloaded {nightly.filename}")
            extra: list[str] = []
            index_args = None
            if isinstance(nightly, Release) and self.companions:
                # a local release index: the companions that pin this torch, from its folder
                extra = list(self.companions)
                index_args = ["--no-index", "--find-links", str(_local_dir(nightly.url))]
            companions = [download(c, self.root / "wheels")[0]
                          for c in getattr(nightly, "companions", ())]
            python = self._create(path)
            self.pip_install(python, str(wheel), *map(str, companions), *extra,
                             index_args=index_args)
            for companion in companions:
                companion.unlink(missing_ok=True)
            actions.append(f"installed torch {nightly.version} ({time.monotonic() - t0:.1f} s)")
            wheel.unlink(missing_ok=True)  # the environment is the cache; wheels are large
        build = read_torch_build(path)
        env = NightlyEnv(path, python, build.get("version") or nightly.version,
                         build.get("git_version"), sha, {}, actions, build=build,
                         packages=self.freeze(python))
        self._write_marker(env, nightly.url)
        touch_used(path)
        self.in_use.add(path)
        self.evict()
        return env

    def evict(self) -> list[str]:
        """Remove the least recently used environments beyond ``max_size`` (never one in use)."""
        if self.max_size is None:
            return []

        gone = choose_evictions(list_envs(self.root), self.max_size, keep=self.in_use)
        return [env.path.name for env in gone if remove(env)]  # one in use elsewhere stays

    def _overlay(self, commit) -> NightlyEnv:
        """A commit's Python over its base nightly's environment (overlay.py)."""
        base = self.ensure(commit.base)
        path = base.path.parent / f"{base.path.name}+{commit.key}"
        actions = []
        self._use(path)
        with build_lock(path).acquire(waiting=self._waiting(path)):
            if not overlay_ready(path):
                t0 = time.monotonic()
                files = changed_python(Path(commit.repo), commit.sha, commit.base_main)
                make_overlay(base.path, path, files)
                actions.append(f"overlaid {len(files)} Python files of {commit.key} on "
                               f"{base.path.name} ({time.monotonic() - t0:.1f} s)")
        touch_used(path)
        self.in_use.add(path)
        return NightlyEnv(path, env_python(path), base.torch_version, commit.sha, base.sha256,
                          {}, actions, build={**base.build, "overlay_commit": commit.sha},
                          packages=base.packages)

    def cached(self, nightly: Candidate) -> NightlyEnv | None:
        if isinstance(nightly, Commit):
            base = self._cached(nightly.base)
            path = self.env_dir(nightly.base).parent / f"{self.env_dir(nightly.base).name}+{nightly.key}"
            if base is None or not overlay_ready(path):
                return None
            return NightlyEnv(path, env_python(path), base.torch_version, nightly.sha,
                              base.sha256, build={**base.build, "overlay_commit": nightly.sha},
                              packages=base.packages)
        return self._cached(nightly)

    def freeze(self, python: Path) -> list[str]:
        """``pip freeze`` of an environment (what the report lists); empty if it cannot."""
        if self.installer.uv:
            cmd = [self.installer.uv, "pip", "freeze", "--python", str(python)]
        elif self._host_pip:
            cmd = [sys.executable, "-m", "pip", "--python", str(python), "freeze"]
        else:
            cmd = [str(python), "-m", "pip", "freeze"]
        result = subprocess.run(cmd, capture_output=True, text=True)
        return result.stdout.split() if result.returncode == 0 else []

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

    def add_wheel(self, env: NightlyEnv, wheel: Path, nightly: Candidate) -> None:
        """Install ``wheel`` beside the nightly's torch (without its torch pin), once per sha."""
        sha = sha256_of(wheel)
        if env.extras.get(wheel.name) == sha:
            return
        self.pip_install(env.python, "--no-deps", "--force-reinstall", str(wheel))
        env.extras[wheel.name] = sha
        env.actions.append(f"installed {wheel.name}")
        self._write_marker(env, nightly.url)


def _local_dir(url: str) -> Path:
    return local_path(url).parent


class Prefetcher:
    """Makes the environments the next step may need in a background thread while a probe
    runs; ``get`` waits for one that is under way. Daemonic: a bisect that ends while a
    prefetch still runs leaves an unmarked environment, which the next use makes again."""

    def __init__(self, envs: EnvCache, enabled: bool = True):
        self.envs = envs
        self.enabled = enabled
        self._jobs: dict[str, tuple[threading.Thread, list]] = {}
        self._lock = threading.Lock()  # one prefetch at a time: downloads share the link

    def want(self, candidates) -> None:
        if not self.enabled:
            return
        for candidate in candidates:
            if candidate.key in self._jobs or self.envs.cached(candidate) is not None:
                continue
            box: list = []
            thread = threading.Thread(target=self._make, args=(candidate, box), daemon=True,
                                      name=f"prefetch {candidate.key}")
            self._jobs[candidate.key] = (thread, box)
            thread.start()

    def _make(self, candidate, box: list) -> None:
        with self._lock:
            try:
                env = self.envs.ensure(candidate)
                env.actions.append("prefetched while the previous probe ran")
                box.append(env)
            except Exception as exc:  # the probe itself tries again and reports it
                box.append(exc)

    def get(self, candidate) -> NightlyEnv:
        job = self._jobs.pop(candidate.key, None)
        if job is not None:
            thread, box = job
            thread.join()
            if box and isinstance(box[0], NightlyEnv):
                return box[0]
        return self.envs.ensure(candidate)

    @property
    def pending(self) -> list[str]:
        return [key for key, (thread, _) in self._jobs.items() if thread.is_alive()]


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


USED = ".last-used"


def touch_used(env_dir: Path) -> None:
    """Mark an environment used now (the cache evicts the least recently used first)."""
    try:
        (env_dir / USED).write_text(f"{time.time():.0f}\n")
    except OSError:
        pass


def read_torch_build(env_dir: Path) -> dict:
    """torch's build record from ``torch/version.py`` (version, git_version, cuda, hip, ...),
    read from the file, not imported."""
    for site in _site_packages(env_dir):
        version_file = site / "torch" / "version.py"
        if version_file.is_file():
            fields = _version_fields(version_file.read_text(encoding="utf-8", errors="replace"))
            out = {("version" if k == "__version__" else k): v for k, v in fields.items()}
            return {k: out[k] for k in sorted(out)}
    return {}


def read_torch_version(env_dir: Path) -> tuple[str | None, str | None]:
    """``torch.version.__version__`` and ``git_version``, read from the file, not imported."""
    build = read_torch_build(env_dir)
    return build.get("version"), build.get("git_version")


def _version_fields(source: str) -> dict[str, str | None]:
    values: dict[str, str | None] = {}
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    for node in tree.body:
        targets = []
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        for target in targets:
            if (isinstance(target, ast.Name) and isinstance(value, ast.Constant)
                    and isinstance(value.value, (str, type(None)))):
                values[target.id] = value.value
    return values
