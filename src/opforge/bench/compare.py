"""A bench run against a saved baseline: which side of each row moved, and whether it is ours.

A timed row has two sides measured in the same alternating rounds: ours, and the other side
(the reference, or, for a row timed alone, the fixed yardstick). A baseline keeps both sides'
times and both noises (each side timed against itself). A row is slower than its baseline
(FAIL) only when **our time** moved beyond ``--regression`` and beyond our noise in both runs,
**and** the ratio of the sides (speed-up, or pace) fell by as much beyond both sides' noise:
ours moved while the other side, timed beside it, did not move alike (a slower or busier
machine moves both). Every other move is a WARN that names the side that moved
("reference 3.19 ms → 154 µs; ours unchanged (503 µs → 477 µs)"): what opforge does not own,
a reference's time or the host, never fails a row.

Baselines saved before both sides' noises were kept (no ``reference_noise`` or
``yardstick_noise``): the missing noise is taken from this run's same side (same method, same
machine). A baseline row without our time (``ours_s``) cannot show that ours moved: it is a
WARN at most, saying so.
"""

from __future__ import annotations

import math

from opforge.errors import UsageError
from opforge.smoke.probe.speed import seconds

# --regression: the slowdown of our own time a row may show against its baseline
DEFAULT_REGRESSION = 1.5
# by: (the other side's time, its noise, how a message names it)
SIDES = {"speedup": ("reference_s", "reference_noise", "reference"),
         "pace": ("yardstick_s", "yardstick_noise", "yardstick")}


def row_key(row: dict) -> tuple:
    return tuple(row.get(k) for k in ("op", "workload", "direction", "device", "reference",
                                      "threads"))


def _positive(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < math.inf


def baseline_rows(doc: object, label: str) -> dict[tuple, dict]:
    """A saved run's timed rows by key (raises UsageError naming ``label`` when it is not one):
    rows with a speed-up, and rows timed alone (their pace)."""
    if not isinstance(doc, dict) or doc.get("kind") != "bench":
        raise UsageError(f"{label}: not an `opforge bench` JSON document")
    rows = doc.get("rows")
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise UsageError(f"{label}: its 'rows' is not a list of rows")
    out = {}
    for r in rows:
        if _positive(r.get("speedup")) or (r.get("alone") is True and _positive(r.get("pace"))):
            out[row_key(r)] = r
    return out


def machine(doc: object) -> str | None:
    """Where a run ran, as far as absolute times care: processor and threads."""
    env = doc.get("environment") if isinstance(doc, dict) else None
    if not isinstance(env, dict) or not env.get("cpu"):
        return None
    return f"{env.get('cpu')}, {env.get('threads', '?')} threads"


def _noise(value: object) -> float | None:
    return float(value) if _positive(value) or value == 0 else None


def _pair_noise(row: dict, old: dict, key: str, fallback: float) -> float:
    """Both runs' noise of one side; one run's missing value is the other's (an older
    baseline kept no reference noise), both missing: ``fallback`` (ours, measured alike)."""
    now, then = _noise(row.get(key)), _noise(old.get(key))
    if now is None and then is None:
        return fallback
    return (now if now is not None else then) + (then if then is not None else now)


def _factor(row: dict, old: dict, key: str) -> float | None:
    """This run's time of a side over the baseline's (above 1: slower), None if unknown."""
    if _positive(row.get(key)) and _positive(old.get(key)):
        return row[key] / old[key]
    return None


def _moved(factor: float | None, allowed: float) -> str | None:
    """'slower' or 'faster' beyond ``allowed`` (the threshold widened by noise), else None."""
    if factor is None:
        return None
    if factor > allowed:
        return "slower"
    return "faster" if factor * allowed < 1 else None


def _side(name: str, row: dict, old: dict, key: str, moved: str | None) -> str:
    if not (_positive(row.get(key)) and _positive(old.get(key))):
        return f"{name}'s time not in the baseline"
    times = f"{seconds(old[key])} → {seconds(row[key])}"
    return f"{name} {times}" if moved else f"{name} unchanged ({times})"


def judge(row: dict, old: dict, name: str, threshold: float) -> dict | None:
    """The comparison of one timed row with its baseline row: the ``baseline`` entry the row
    gets (``verdict`` fail | warn | ok, ``line`` saying which side moved), None when the two
    rows share no measure (a speed-up against a pace)."""
    by = next((k for k in SIDES if _positive(row.get(k)) and _positive(old.get(k))), None)
    if by is None:
        return None
    other_s, other_noise, other = SIDES[by]
    ours_noise = float(_noise(row.get("noise")) or 0) + float(_noise(old.get("noise")) or 0)
    their_noise = _pair_noise(row, old, other_noise, ours_noise)
    ours_f, their_f = _factor(row, old, "ours_s"), _factor(row, old, other_s)
    ours_moved = _moved(ours_f, threshold * (1 + ours_noise))
    their_moved = _moved(their_f, threshold * (1 + their_noise))
    ratio_change = row[by] / old[by]  # below 1: ours lost ground on the other side
    ratio_fell = ratio_change * threshold * (1 + ours_noise + their_noise) < 1
    label = "speed-up" if by == "speedup" else "pace against the yardstick"
    line = (f"{_side(other, row, old, other_s, their_moved)}; "
            f"{_side('ours', row, old, 'ours_s', ours_moved)}; {label} {row[by]:.3g}x, was "
            f"{old[by]:.3g}x")
    allowed = f"allowed {threshold:g}x beyond noise ±{ours_noise * 100:.0f}%"
    entry = {"name": name, "by": by, by: old[by], "ratio_change": ratio_change,
             "ours_s": old.get("ours_s"), other_s: old.get(other_s),
             "ours_change": ours_f, f"{other}_change": their_f,
             "moved": [side for side, moved in (("ours", ours_moved), (other, their_moved))
                       if moved],
             # what the table shows: our speed against the baseline's (0.5x: half as fast)
             "change": 1 / ours_f if ours_f else ratio_change}
    if ours_moved == "slower" and ratio_fell:
        entry.update(verdict="fail", line=(f"{ours_f:.2f}x slower than baseline {name} ({line};"
                                           f" {allowed})"))
    elif ours_f is None and ratio_fell:
        entry.update(verdict="warn", line=(f"{label} {1 / ratio_change:.2f}x lower than "
                                           f"baseline {name}, and the baseline has no time of "
                                           f"ours to tell which side moved ({line}): save it "
                                           "again"))
    elif ours_moved == "slower":
        entry.update(verdict="warn", line=(f"ours {ours_f:.2f}x slower than baseline {name} "
                                           f"and the {other} alike ({line}): the machine is "
                                           "slower or busier, not the op"))
    elif their_moved or ratio_fell:
        entry.update(verdict="warn", line=(f"the {other} moved, not ours: compared with "
                                           f"baseline {name}, {line}" if their_moved else
                                           f"{label} fell against baseline {name}, each side "
                                           f"within {threshold:g}x beyond noise ({line})"))
    else:
        entry.update(verdict="ok", line=f"as baseline {name} ({line})")
    return entry


def compare_to_baseline(doc: dict, base: dict[tuple, dict], name: str, threshold: float,
                        base_machine: str | None = None) -> None:
    """Mark each timed row with its comparison against the baseline (``judge``): a FAIL is
    ours slower beyond ``threshold`` and noise while the other side stayed; a WARN names the
    side that moved. Rows timed alone are paced by a plain single-threaded Python yardstick:
    a machine with fewer threads than the baseline's can still make a parallel op look slower
    (the summary says when the machines differ)."""
    compared = alone_rows = 0
    for row in doc.get("rows", []):
        old = base.get(row_key(row))
        if old is None or "ours_s" not in row:
            continue
        entry = judge(row, old, name, threshold)
        if entry is None:
            continue
        compared += 1
        alone_rows += entry["by"] == "pace"
        row["baseline"] = entry
        if entry["verdict"] == "fail":
            row.update(status="fail", message=entry["line"])
        elif entry["verdict"] == "warn":
            row["warning"] = entry["line"]
    timed = sum(1 for r in doc.get("rows", []) if "ours_s" in r)
    judged = [r["baseline"]["verdict"] for r in doc.get("rows", []) if "baseline" in r]
    doc["baseline"] = {"name": name, "rows_compared": compared, "threshold": threshold,
                       "slower": judged.count("fail"), "warned": judged.count("warn"),
                       "not_in_baseline": timed - compared, "baseline_rows": len(base)}
    if timed and not compared:
        doc["baseline"]["nothing_compared"] = True
    here = machine(doc)
    if alone_rows and base_machine and here and base_machine != here:
        doc["baseline"]["machine"] = (f"{alone_rows} rows timed alone were compared, and the "
                                      f"baseline ran on {base_machine}, this run on {here}")
