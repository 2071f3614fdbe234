"""One build at a time across pytest-xdist workers: an exclusive lock on a file beside the
build (the emulations' host libraries are built once and shared, not once per worker)."""

from __future__ import annotations

import contextlib
from pathlib import Path


@contextlib.contextmanager
def build_lock(path: Path):
    """Hold an exclusive lock on ``path`` (created with its folder) for the block. Where fcntl
    does not exist (Windows) the block runs unlocked: one process at a time there."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as handle:
        try:
            import fcntl
        except ImportError:
            yield
            return
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
