"""A target process whose stderr carries progress lines (a bench's rows: the prefix
``opforge.bench.target.bench.PROGRESS_PREFIX``), shown as they come while it runs."""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path

from opforge.bench.target.bench import PROGRESS_PREFIX
from opforge.progress import tally


def run_with_progress(cmd: list[str], cwd: Path, env: dict[str, str], timeout_s: float,
                      what: str) -> tuple[int | None, str]:
    """Run the target, showing the progress lines it writes on stderr (a bench's rows, see
    ``opforge.bench.target.bench.announce``); its exit status (None: past ``timeout_s``)
    and the rest of its stderr."""
    kept: list[str] = []
    with tally(what, unit="rows") as shown, subprocess.Popen(
            cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True, errors="replace") as proc:

        def read() -> None:
            for line in proc.stderr:
                if not line.startswith(PROGRESS_PREFIX):
                    kept.append(line)
                    continue
                try:
                    said = json.loads(line[len(PROGRESS_PREFIX):])
                    done, total, current = said["done"], said["total"], said["current"]
                except (ValueError, KeyError, TypeError):
                    kept.append(line)
                    continue
                if type(done) is int and type(total) is int and isinstance(current, str):
                    shown.update(done=done, total=total, current=current)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            rc: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            rc = None
            shown.failed = True
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        finally:
            reader.join(timeout=10)
        if rc == 0:
            shown.update(done=shown.total or shown.done)
        elif rc is not None and rc < 0:  # killed by a signal: not finished
            shown.failed = True
    return rc, "".join(kept)
