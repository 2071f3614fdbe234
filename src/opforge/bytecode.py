"""Python bytecode kept between fresh environments, so a warm smoke does not recompile torch.

uv fills a fresh environment from its cache by hard links, but compiles no bytecode, and the
environment is thrown away after the probe: every smoke spent about half of its probe's time
(4.4 of 8.3 s for the CPU smoke) compiling torch's, sympy's and dynamo's sources again. Here
the ``.pyc`` files the probe's interpreter wrote are kept per distribution, under
``<cache>/bytecode/<key>/``, and linked into the next fresh environment that holds the same
distribution, before its interpreter starts.

The key is the distribution's name and a hash of the ``.py`` lines of its installed RECORD
(each line carries the file's sha256), so a stored ``.pyc`` only ever lands beside the very
source it was compiled from. Python then checks it as it checks any ``.pyc`` (magic number,
the source's mtime and size) and recompiles one that does not match: nothing stale runs, and
the environment is still fresh, made for this run, outside the tree, with a new interpreter.
The wheel under test is left out (its key changes with every build).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from pathlib import Path

from opforge.paths import cache_dir

STORE = "bytecode"
UNUSED_DAYS = 30  # a key not linked into any environment for this long is removed on save
_RECORD_LIMIT = 64 << 20


def store_dir() -> Path:
    return cache_dir() / STORE


def site_packages(env_dir: Path) -> Path | None:
    """The environment's site-packages (the first, where a venv has one per Python)."""
    found = sorted(Path(env_dir).glob("lib/python*/site-packages")) or \
        [p for p in (Path(env_dir) / "Lib" / "site-packages",) if p.is_dir()]
    return found[0] if found else None


def _normal(name: str) -> str:
    return name.replace("-", "_").replace(".", "_").lower()


def distributions(site: Path, exclude: str | None = None) -> dict[str, list[str]]:
    """key -> the ``.py`` files (relative to ``site``) of each distribution installed there;
    a distribution whose RECORD gives a ``.py`` file without its hash has no key."""
    keys: dict[str, list[str]] = {}
    for info in sorted(site.glob("*.dist-info")):
        name = info.name[: -len(".dist-info")]
        if exclude and _normal(name.split("-")[0]) == _normal(exclude):
            continue
        record = info / "RECORD"
        try:
            if record.is_symlink() or record.stat().st_size > _RECORD_LIMIT:
                continue
            lines = record.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        sources = []
        for line in lines:
            path, _, rest = line.partition(",")
            if not path.endswith(".py") or path.startswith(("/", "..")) or "/../" in path:
                continue  # scripts outside site-packages carry the environment's own path
            if not rest.startswith("sha256="):
                sources = []
                break
            sources.append(line)
        if sources:
            digest = hashlib.sha256("\n".join(sorted(sources)).encode()).hexdigest()[:20]
            keys[f"{_normal(name)}-{digest}"] = [s.partition(",")[0] for s in sources]
    return keys


def _pycs(site: Path, sources: list[str]) -> dict[str, list[str]]:
    """The bytecode beside ``sources``: each folder's ``__pycache__`` (relative to ``site``)
    -> the ``.pyc`` names in it compiled from one of them (each folder listed once)."""
    stems: dict[str, set[str]] = {}
    for source in sources:
        folder, _, name = source.rpartition("/")
        stems.setdefault(folder, set()).add(name[:-3])
    found: dict[str, list[str]] = {}
    for folder, names in stems.items():
        cache = f"{folder}/__pycache__" if folder else "__pycache__"
        try:
            listed = os.listdir(site / cache)
        except OSError:
            continue
        pycs = [n for n in listed if n.endswith(".pyc") and n.split(".", 1)[0] in names]
        if pycs:
            found[cache] = pycs
    return found


def _link_or_copy(src: str | Path, dst: str | Path) -> None:
    """``dst`` becomes ``src``'s content, never half-written: a hard link, else a copy renamed
    into place; an existing ``dst`` stays."""
    try:
        os.link(src, dst, follow_symlinks=False)
        return
    except FileExistsError:
        return
    except OSError:
        pass  # another file system: copy
    dst = Path(dst)
    partial = dst.with_name(f".{dst.name}.{os.getpid()}.partial")
    try:
        shutil.copyfile(src, partial, follow_symlinks=False)
        os.replace(partial, dst)
    finally:
        partial.unlink(missing_ok=True)


def restore(env_dir: Path, exclude: str | None = None) -> int:
    """Link the stored bytecode of the environment's distributions into it; the number of
    ``.pyc`` files linked (0 when nothing was stored: the first run compiles as ever)."""
    site = site_packages(env_dir)
    root = store_dir()
    if site is None or not root.is_dir():
        return 0
    linked = 0
    for key in distributions(site, exclude):
        stored = root / key
        if stored.is_symlink() or not stored.is_dir():
            continue
        os.utime(stored)  # last used: what save's clean-up goes by
        linked += _link_tree(str(stored), str(site))
    return linked


def _link_tree(stored: str, site: str) -> int:
    """Link every ``.pyc`` under ``stored`` (laid out like ``site``) into ``site``'s
    ``__pycache__`` folders whose source folder exists; plain os calls: 2,000 files."""
    linked = 0
    for folder, dirs, files in os.walk(stored):
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(folder, d))]
        if os.path.basename(folder) != "__pycache__":
            continue
        rel = os.path.relpath(folder, stored)
        target = os.path.join(site, rel)
        source_dir = os.path.dirname(target)
        if not os.path.isdir(source_dir) or os.path.islink(source_dir):
            continue  # the source folder is not in this environment
        os.makedirs(target, exist_ok=True)
        for name in files:
            src = os.path.join(folder, name)
            if name.endswith(".pyc") and not os.path.islink(src):
                try:
                    _link_or_copy(src, os.path.join(target, name))
                    linked += 1
                except OSError:
                    continue
    return linked


def save(env_dir: Path, exclude: str | None = None) -> int:
    """Keep the bytecode the environment's interpreter wrote (the probe's imports) for the
    next fresh environment; the number of ``.pyc`` files added to the store."""
    site = site_packages(env_dir)
    if site is None:
        return 0
    root = store_dir()
    added = 0
    try:
        root.mkdir(parents=True, exist_ok=True)
        for key, sources in distributions(site, exclude).items():
            stored = root / key
            if stored.is_symlink():
                continue
            for cache, names in _pycs(site, sources).items():
                try:
                    have = set(os.listdir(stored / cache))
                except OSError:
                    have = set()
                missing = [n for n in names if n not in have]
                if not missing:
                    continue
                (stored / cache).mkdir(parents=True, exist_ok=True)
                for name in missing:
                    _link_or_copy(site / cache / name, stored / cache / name)
                    added += 1
        _forget_unused(root)
    except OSError:
        return added  # a cache that cannot be written makes the next run slower, not wrong
    return added


def _forget_unused(root: Path) -> None:
    cutoff = time.time() - UNUSED_DAYS * 86400
    for stored in root.iterdir():
        try:
            if stored.is_dir() and not stored.is_symlink() and stored.stat().st_mtime < cutoff:
                shutil.rmtree(stored, ignore_errors=True)
        except OSError:
            continue
