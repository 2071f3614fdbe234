"""Advisory file locks: ``FileLock`` (``flock`` on a small file beside what it guards, naming
its holder) and ``LockHeld`` (another process holds it: one line, exit 2). The bisect state,
the environment caches, the compiler cache's set-up and the bench baselines take them.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import sys
import time
from pathlib import Path

from opforge.errors import UsageError
from opforge.files import open_problem, read_head

try:
    import fcntl
except ImportError:  # Windows: no advisory locks
    fcntl = None  # type: ignore[assignment]

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


class LockHeld(UsageError):
    """Another process holds the lock: one line naming it (exit 2: nothing was changed)."""


class FileLock:
    """An advisory lock (``flock``) on a small file beside what it guards.

    The kernel drops it when its holder exits, however it exits, so a killed run never leaves
    a stale lock. The exclusive holder writes who it is into the file (pid, host, command,
    since when) so that a refused or waiting process can name it.
    """

    def __init__(self, path: str | os.PathLike, *, what: str):
        self.path = Path(path)
        self.what = what
        self.fd: int | None = None

    def _open(self) -> int:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        flags = os.O_RDWR | os.O_CREAT | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(self.path, flags | getattr(os, "O_NONBLOCK", 0), 0o644)
        except OSError as exc:
            raise UsageError(f"{self.what}: lock file {self.path}: {open_problem(exc)}") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise UsageError(f"{self.what}: lock file {self.path}: not a regular file")
        return fd

    def holder(self) -> str:
        """Who holds the lock, as its holder wrote it (a holder that has just taken the lock
        may not have written yet: a moment is allowed for that)."""
        for _ in range(25):
            try:
                text = read_head(self.path, 4096).decode("utf-8", "replace").strip()
            except UsageError:
                text = ""
            if text:
                return text.splitlines()[0]
            time.sleep(0.01)
        return "another process"

    def busy(self, *, shared: bool = False) -> bool:
        """Whether another process holds the lock against this kind of use; the lock file is
        not created when missing (nobody holds it then)."""
        if fcntl is None:
            return False
        flags = os.O_RDONLY | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(self.path, flags)
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise UsageError(f"{self.what}: lock file {self.path}: {open_problem(exc)}") from None
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
            return False
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # drops what was just taken

    def acquire(self, *, shared: bool = False, wait: float | None = None,
                waiting=None) -> FileLock:
        """Take the lock; ``wait`` None waits as long as it takes, 0 refuses at once
        (``LockHeld``), else seconds. ``waiting(holder)`` is called once before a wait."""
        if fcntl is None:  # no flock (Windows): nothing to take
            return self
        fd = self._open()
        kind = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
        deadline = None if wait is None else time.monotonic() + wait
        told = False
        try:
            while True:
                try:
                    fcntl.flock(fd, kind | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    pass
                if deadline is not None and time.monotonic() >= deadline:
                    raise LockHeld(f"{self.what}: in use by {self.holder()}")
                if not told and waiting is not None:
                    waiting(self.holder())
                    told = True
                time.sleep(0.02)
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        # each holder names itself (a shared one too: a refused writer then names one of them)
        record = (f"pid {os.getpid()} on {socket.gethostname()} "
                      f"({' '.join(sys.argv[:4])[:200]}), since "
                  f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n").encode()
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.pwrite(fd, record, 0)
        return self

    def release(self) -> None:
        if self.fd is not None:
            fd, self.fd = self.fd, None
            os.close(fd)  # closing drops the flock

    def __del__(self) -> None:  # a lock nobody holds a reference to is let go
        try:
            self.release()
        except Exception:  # noqa: BLE001, S110 - at interpreter exit the fd goes anyway
            pass

    def __enter__(self) -> FileLock:
        if self.fd is None:
            self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
