"""The bisect cache on disk: one environment per torch build, sized, listed, pruned LRU-first.

Each environment records when it was last used (``.last-used``, written by ``EnvCache``);
pruning removes the least recently used first until the cache fits its limit. Sizes count
each file once per environment; files hard-linked from uv's cache are counted here too,
though uv's cache keeps its own copy (``uv cache prune`` frees that).
``OPFORGE_CACHE_MAX_SIZE`` (e.g. ``40G``) bounds the cache during a bisect: after each new
environment, older ones are evicted until the cache fits, never one the bisect is using.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

from opforge.errors import UsageError
from opforge.locks import FileLock, LockHeld

MAX_SIZE_ENV = "OPFORGE_CACHE_MAX_SIZE"
MAX_SIZE = 1 << 60  # 1 EiB: any larger number is a typo, not a disk
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str, what: str) -> int:
    """``40G``, ``500M``, ``1.5T``, ``1048576`` -> bytes; anything else is bad input."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if found is None:
        raise UsageError(f"{what} {text!r}: expected a size like 40G, 500M or 1048576 (bytes)")
    size = Decimal(found.group(1)) * _UNITS[found.group(2).upper()]
    if size > MAX_SIZE:
        raise UsageError(f"{what} {text[:40]!r}{'...' if len(text) > 40 else ''}: more than "
                         f"{human(MAX_SIZE)}; give a size like 40G")
    return int(size)


def human(size: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size} B"


def tree_size(path: Path) -> int:
    """Bytes of the regular files under ``path``, each inode once."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                info = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            key = (info.st_dev, info.st_ino)
            if key in seen:
                continue
            seen.add(key)
            total += info.st_blocks * 512 if hasattr(info, "st_blocks") else info.st_size
    return total


@dataclass(frozen=True)
class CachedEnv:
    path: Path
    torch: str | None    # the torch version it holds; None: incomplete (no marker)
    size: int
    last_used: float

    def to_json(self) -> dict:
        return {"path": str(self.path), "torch": self.torch, "bytes": self.size,
                "last_used": round(self.last_used)}


def _last_used(env: Path) -> float:
    for name in (".last-used", "opforge-env.json"):
        try:
            return (env / name).stat().st_mtime
        except OSError:
            continue
    try:
        return env.stat().st_mtime
    except OSError:
        return 0.0


def _torch_of(env: Path) -> str | None:
    try:
        return json.loads((env / "opforge-env.json").read_text())["torch"]["version"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def list_envs(root: Path) -> list[CachedEnv]:
    """The cache's environments, least recently used first."""
    folder = root / "envs"
    if not folder.is_dir():
        return []
    envs = [CachedEnv(p, _torch_of(p), tree_size(p), _last_used(p))
            for p in sorted(folder.iterdir()) if p.is_dir() and not p.is_symlink()]
    return sorted(envs, key=lambda e: (e.last_used, e.path.name))


def choose_evictions(envs: Iterable[CachedEnv], max_size: int,
                     keep: Iterable[Path] = ()) -> list[CachedEnv]:
    """Least recently used first, until what is left fits ``max_size`` (``keep`` stays)."""
    keep = {Path(p) for p in keep}
    envs = list(envs)
    total = sum(e.size for e in envs)
    out = []
    for env in sorted(envs, key=lambda e: (e.torch is not None, e.last_used)):
        if total <= max_size:
            break
        if env.path in keep:
            continue
        out.append(env)
        total -= env.size
    return out


def use_lock(env_dir: Path) -> FileLock:
    """Held shared by every bisect that made or uses the environment (until it exits), taken
    exclusively to remove it: an environment in use is never evicted from under a probe."""
    return FileLock(_locks(env_dir) / f"{env_dir.name}.use", what=f"environment {env_dir.name}")


def build_lock(env_dir: Path) -> FileLock:
    """Held while the environment is made or repaired: a second bisect that needs the same
    torch waits, then reuses what the first made."""
    return FileLock(_locks(env_dir) / f"{env_dir.name}.build",
                    what=f"environment {env_dir.name}")


def _locks(env_dir: Path) -> Path:
    """``<cache>/locks``, beside ``<cache>/envs``: lock files outlive what they guard (removing
    one another process has open would split the lock), so they stay out of ``envs``."""
    return env_dir.parent.parent / "locks"


def remove(env: CachedEnv) -> bool:
    """Remove an environment no running bisect uses; False (kept) when one does."""
    lock = use_lock(env.path)
    try:
        lock.acquire(wait=0)
    except LockHeld:
        return False
    try:
        shutil.rmtree(env.path, ignore_errors=True)
    finally:
        lock.release()
    return True


def max_size_from_env() -> int | None:
    text = os.environ.get(MAX_SIZE_ENV)
    return parse_size(text, MAX_SIZE_ENV) if text else None


def check_size_variable(name: str, value: str) -> None:
    """OPFORGE_CACHE_MAX_SIZE's value: a size parse_size reads."""
    parse_size(value, name)
