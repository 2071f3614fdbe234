"""Bench baselines on disk: where they live, rows checked for type and range when read, writes under a lock.

A baseline is a file anyone can edit (or a run of another opforge wrote): a row whose number
is ``1e999`` (JSON reads it as infinity), a string, a list as a key or a negative noise would
crash the comparison or make it pass on nonsense, so each is refused in one line naming the
file and the row. Two runs saving one baseline at once write one after the other, each file
whole (``files.write_file`` under ``locks.FileLock``).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from opforge.bench.compare import baseline_rows, machine
from opforge.errors import UsageError
from opforge.files import read_json, write_file
from opforge.locks import FileLock
from opforge.paths import cache_dir

# a baseline's name (``--save NAME``, ``--against NAME``): a file name under baseline_dir()
NAME = re.compile(r"[A-Za-z0-9._-]{1,64}\Z")
KEY_FIELDS = ("op", "workload", "direction", "device", "reference")
# the numbers a comparison reads; an older baseline may lack any of them: a missing time or
# noise is handled where it is compared (bench/compare.py), never read as a number
NUMBER_FIELDS = ("speedup", "ours_s", "best_s", "noise", "pace", "yardstick_s", "reference_s",
                 "reference_noise", "yardstick_noise")
NOISE_FIELDS = ("noise", "reference_noise", "yardstick_noise")  # 0 and null are allowed


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
            if key not in row or (key in ("best_s", *NOISE_FIELDS) and row[key] is None):
                continue
            value = row[key]
            if not _finite(value) or value < 0 or (key not in NOISE_FIELDS and value == 0):
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


def baseline_dir() -> Path:
    """Where ``--save NAME`` keeps baseline NAME (NAME.json): the cache directory's bench/."""
    return cache_dir() / "bench"


def read_baseline(path: Path, label: str) -> tuple[dict, str | None]:
    """(the saved run's rows by key, the machine it ran on) of the baseline at ``path``."""
    doc = read_json(path, what=label)
    if isinstance(doc, dict) and isinstance(doc.get("rows"), list):
        # 1e999, a string, a list as a key: one line, before any row is used
        check_rows([r for r in doc["rows"] if isinstance(r, dict)], label)
    return baseline_rows(doc, label), machine(doc)


def load_baseline(text: str) -> tuple[str, dict, str | None]:
    """(the name shown, the saved rows by key, the machine it ran on) of ``--against
    NAME|FILE`` (UsageError if there is none)."""
    saved = baseline_dir() / f"{text}.json"
    if NAME.match(text) and saved.is_file():
        return (text, *read_baseline(saved, f"baseline {text}"))
    if text.endswith(".json"):
        return (text, *read_baseline(Path(text), f"--against {text}"))
    known = sorted(p.stem for p in baseline_dir().glob("*.json")) if baseline_dir().is_dir() \
        else []
    raise UsageError(f"--against {text!r}: no such baseline (saved: "
                     f"{', '.join(known) or 'none'}; a baseline is saved with --save NAME, "
                     "or give an earlier run's --json FILE)")


def baseline_target(text: str) -> tuple[str, Path]:
    """(the name shown, the file) of ``--baseline NAME|FILE``: a path (it ends in .json or
    names a folder) as given, else a name under the baseline folder."""
    if text.endswith(".json") or "/" in text or os.sep in text:
        return text, Path(text)
    if not NAME.match(text):
        raise UsageError(f"--baseline {text!r}: a baseline name is letters, digits, '.', '_' "
                         "and '-' (at most 64), or a path ending in .json")
    return text, baseline_dir() / f"{text}.json"
