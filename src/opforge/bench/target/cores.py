"""The machine a CPU row is timed on: its processor's name, torch's thread count for a block,
and busy processes on every core the process may use (``--contended``: a busy CI runner). Standard library only
(torch is passed in)."""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
import sys
import time


@contextlib.contextmanager
def thread_count(t, count):
    """torch's intra-op threads set to ``count`` for the block (None: left as they are)."""
    if count is None:
        yield
        return
    before = t.get_num_threads()
    t.set_num_threads(count)
    try:
        yield
    finally:
        t.set_num_threads(before)


# A busy process: plain Python spinning, which leaves once its parent is gone (a probe killed
# for its timeout must not leave processes spinning on the machine).
SPIN = ("import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n"
        "    for _ in range(200000):\n        pass\n")


@contextlib.contextmanager
def busy_cores(on: bool):
    """While the block runs, as many busy processes as this process may use CPUs."""
    if not on:
        yield
        return
    try:
        count = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        count = os.cpu_count() or 1
    procs = []
    try:
        for _ in range(count):
            procs.append(subprocess.Popen([sys.executable, "-S", "-c", SPIN],
                                          stdin=subprocess.DEVNULL))
        time.sleep(0.2)  # running before the first timing, not still starting
        yield
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()


def cpu_model() -> str:
    """The processor's name (what a reader compares when two runs' absolute times differ)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.lower().startswith(("model name", "hardware")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
