"""Baselines: `opforge bench --save NAME` / `--against NAME|FILE`, compared by speed-ups (each a
ratio from its own run), a regression failing only beyond the threshold and both runs' noise."""

from __future__ import annotations

import json

import pytest

from opforge.errors import UsageError
from opforge.smoke.benchreport import baseline_rows, compare_to_baseline, markdown


def _doc(*rows) -> dict:
    return {"kind": "bench", "package": "p", "rows": [
        {"op": op, "workload": "small", "direction": "forward", "device": "cpu",
         "reference": "ref", "status": "pass", "speedup": speedup, "noise": noise,
         "ours_s": 1e-3, "reference_s": 1e-3 * speedup, "spread": 0.0, "rounds": 5}
        for op, speedup, noise in rows]}


def test_a_row_much_slower_than_its_baseline_fails_and_says_by_how_much():
    base = baseline_rows(_doc(("a", 2.0, 0.05), ("b", 2.0, 0.05), ("c", 2.0, 0.05)), "base")
    now = _doc(("a", 0.2, 0.05), ("b", 1.8, 0.05), ("c", 4.0, 0.05))
    compare_to_baseline(now, base, "base", 1.5)
    a, b, c = now["rows"]
    assert a["status"] == "fail" and "10.00x slower than baseline base" in a["message"]
    assert b["status"] == "pass" and b["baseline"]["change"] == pytest.approx(0.9)
    assert c["status"] == "pass" and c["baseline"]["change"] == pytest.approx(2.0)
    assert "0.10x of base" in markdown(now)


def test_a_slowdown_within_the_measured_noise_does_not_fail():
    base = baseline_rows(_doc(("a", 2.0, 0.4)), "base")
    now = _doc(("a", 1.0, 0.4))  # 2x slower, threshold 1.5, but ±80% noise between them
    compare_to_baseline(now, base, "base", 1.5)
    assert now["rows"][0]["status"] == "pass"


def test_rows_the_baseline_lacks_are_left_alone():
    now = _doc(("new", 0.01, 0.0))
    compare_to_baseline(now, {}, "base", 1.5)
    assert "baseline" not in now["rows"][0]


@pytest.mark.parametrize("doc", [[], {"kind": "smoke"}, {"kind": "bench", "rows": "x"},
                                 {"kind": "bench", "rows": [1]}])
def test_a_file_that_is_not_a_bench_run_is_refused(doc):
    with pytest.raises(UsageError, match="base"):
        baseline_rows(doc, "base")


def test_save_then_against_by_name(tmp_path, monkeypatch):
    from opforge.cli.bench import baseline_dir, load_baseline

    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path))
    baseline_dir().mkdir(parents=True)
    (baseline_dir() / "nightly.json").write_text(json.dumps(_doc(("a", 3.0, 0.1))))
    name, rows = load_baseline("nightly")
    assert name == "nightly" and [k[0] for k in rows] == ["a"]
    with pytest.raises(UsageError, match=r"no such baseline \(saved: nightly"):
        load_baseline("weekly")


def test_the_summary_says_what_the_run_was_compared_with():
    base = baseline_rows(_doc(("a", 2.0, 0.05), ("b", 2.0, 0.05)), "base")
    now = _doc(("a", 0.2, 0.05), ("b", 2.0, 0.05))
    compare_to_baseline(now, base, "the last good run (nightly-bench-cpu-41)", 1.5)
    assert ("Compared with the last good run (nightly-bench-cpu-41): 2 rows, 1 slower by more "
            "than 1.5x beyond noise.") in markdown(now)
    first = _doc(("a", 2.0, 0.05))
    first["baseline"] = {"name": None, "note": "no last good run yet"}
    assert "No baseline to compare with: no last good run yet." in markdown(first)
    assert "Compared with" not in markdown(_doc(("a", 2.0, 0.05)))
