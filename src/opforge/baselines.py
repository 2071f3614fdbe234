"""Bench baselines on disk: rows checked for type and range when read, writes under a lock.

A baseline is a file anyone can edit (or a run of another opforge wrote): a row whose number
is ``1e999`` (JSON reads it as infinity), a string, a list as a key or a negative noise would
crash the comparison or make it pass on nonsense, so each is refused in one line naming the
file and the row. Two runs saving one baseline at once write one after the other, each file
whole (``files.write_file`` under ``files.FileLock``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from opforge.errors import UsageError
from opforge.files import FileLock, write_file

KEY_FIELDS = ("op", "workload", "direction", "device", "reference")
NUMBER_FIELDS = ("speedup", "ours_s", "best_s", "noise", "pace", "yardstick_s")


def _finite(value: object) -> bool:
    # compared, not converted: a 400-digit integer is not finite here, and is no OverflowError
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and -1e300 < value < 1e300


def check_rows(rows: list[dict], label: str) -> None:
    """Refuse a saved row a comparison cannot use honestly (every row, not only those used)."""
    for n, row in enumerate(rows, 1):
        for key in KEY_FIELDS:
            value = row.get(key)
            if value is not None and not isinstance(value, str):
                raise UsageError(f"{label}: row {n}: {key} is {type(value).__name__}, not text")
        for key in NUMBER_FIELDS:
            if key not in row or (key in ("best_s", "noise") and row[key] is None):
                continue
            value = row[key]
            if not _finite(value) or value < 0 or (key != "noise" and value == 0):
                shown = json.dumps(value)[:40] if _finite(value) or not isinstance(value, float) \
                    else repr(value)
                raise UsageError(f"{label}: row {n} ({row.get('op')}): {key} is {shown}, not "
                                 "a finite positive number; save the baseline again")


def lock_of(path: Path) -> FileLock:
    return FileLock(path.with_name(f".{path.name}.lock"), what=f"baseline {path}")


def save(path: Path, doc: dict) -> None:
    """Write the baseline whole, one writer at a time (a second waits up to a minute); a
    --baseline FILE the user named as a link is written where it points."""
    if path.is_symlink():
        path = Path(os.path.realpath(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    with lock_of(path).acquire(wait=60):
        write_file(path, json.dumps(doc, indent=1) + "\n", what="baseline", fsync=True)
