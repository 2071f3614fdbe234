"""Child processes opforge talks to over a pipe (derive's trial worker, bisect's workload
server): ``stop_child`` ends one politely, then by force."""

from __future__ import annotations

import os
import signal
import subprocess


def stop_child(proc: subprocess.Popen | None) -> None:
    """Close the child's stdin (its end of the protocol) and give it 5 s to leave; else kill
    its process group (it was started in a session of its own), or the child alone."""
    if proc is None or proc.poll() is not None:
        return
    try:
        proc.stdin.close()
        proc.wait(timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            proc.kill()
        proc.wait()
