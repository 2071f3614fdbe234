"""Baselines: `opforge bench --save NAME` / `--against NAME|FILE`, compared by speed-ups (each a
ratio from its own run), a regression failing only beyond the threshold and both runs' noise."""

from __future__ import annotations

import json

import pytest

from opforge.bench.report import baseline_rows, compare_to_baseline, markdown
from opforge.errors import UsageError


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
    base = baseline_rows(_doc(("old", 2.0, 0.05)), "base")
    now = _doc(("old", 2.0, 0.05), ("new", 0.2, 0.0))
    compare_to_baseline(now, base, "base", 1.5)
    assert "baseline" not in now["rows"][1] and now["rows"][1]["status"] == "pass"
    assert "1 timed rows are not in the baseline (not compared)" in markdown(now)


def test_a_baseline_that_shares_no_row_with_the_run_is_not_a_pass():
    from opforge.bench.report import exit_code

    now = _doc(("new", 2.0, 0.0))
    compare_to_baseline(now, baseline_rows(_doc(("old", 2.0, 0.05)), "base"), "base", 1.5)
    assert exit_code(now) == 1
    assert ("Nothing was compared with base: none of its 1 rows matches a row timed now"
            in markdown(now))


@pytest.mark.parametrize("doc", [[], {"kind": "smoke"}, {"kind": "bench", "rows": "x"},
                                 {"kind": "bench", "rows": [1]}])
def test_a_file_that_is_not_a_bench_run_is_refused(doc):
    with pytest.raises(UsageError, match="base"):
        baseline_rows(doc, "base")


def test_save_then_against_by_name(tmp_path, monkeypatch):
    from opforge.bench.baselines import baseline_dir, load_baseline

    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path))
    baseline_dir().mkdir(parents=True)
    (baseline_dir() / "nightly.json").write_text(json.dumps(_doc(("a", 3.0, 0.1))))
    name, rows, _machine = load_baseline("nightly")
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


def _alone(op, ours_s, noise=0.05) -> dict:
    """A row timed alone, paired with a yardstick of 1 ms: its pace is 1 ms / its time."""
    return {"op": op, "workload": "small", "direction": "forward", "device": "cpu",
            "reference": "cpu", "status": "pass", "alone": True, "ours_s": ours_s,
            "yardstick_s": 1e-3, "pace": 1e-3 / ours_s, "noise": noise, "rounds": 5}


def _run(*rows, cpu="CPU A") -> dict:
    return {"kind": "bench", "package": "p", "rows": list(rows),
            "environment": {"cpu": cpu, "threads": 2}}


def test_rows_timed_alone_compare_their_pace_with_the_saved_run():
    from opforge.bench.report import machine

    saved = _run(_alone("a", 1e-3), _alone("b", 1e-3))
    now = _run(_alone("a", 10e-3), _alone("b", 1.1e-3))
    compare_to_baseline(now, baseline_rows(saved, "base"), "base", 1.5, machine(saved))
    a, b = now["rows"]
    assert a["status"] == "fail" and a["baseline"]["by"] == "pace"
    assert a["message"] == ("10.00x slower than baseline base (timed alone, paced by a fixed "
                            "yardstick: 10 ms, was 1 ms; allowed 1.5x beyond noise ±10%)")
    assert b["status"] == "pass" and "0.91x of base" in markdown(now)
    assert "Note:" not in markdown(now)  # same machine
    now["saved"] = {"line": "not saved as baseline b: 1 row failed (a/small/forward/cpu)"}
    summary = markdown(now)  # the job summary: op and factor, and what --save did
    assert "- ❌ `a` small fwd on cpu: 10.00x slower than baseline base" in summary
    assert "not saved as baseline b: 1 row failed (a/small/forward/cpu)" in summary


def test_rows_alone_from_another_machine_are_compared_and_the_summary_says_so():
    from opforge.bench.report import machine

    saved = _run(_alone("a", 1e-3), cpu="CPU A")
    now = _run(_alone("a", 1e-3), _alone("new", 1e-3), cpu="CPU B")
    compare_to_baseline(now, baseline_rows(saved, "base"), "base", 1.5, machine(saved))
    text = markdown(now)
    assert "1 timed rows are not in the baseline (not compared)" in text
    assert ("1 rows timed alone were compared, and the baseline ran on CPU A, 2 threads, this "
            "run on CPU B, 2 threads") in text


def test_a_run_that_timed_nothing_is_not_a_pass_and_says_why():
    from opforge.bench.report import exit_code, headline, nothing_timed

    skipped = {"kind": "bench", "package": "p", "devices": ["cpu"], "rows": [
        {"op": op, "workload": "small", "device": "cpu", "status": "skip",
         "reason": "no-reference", "message": "reference torchvision.ops.nms: No module named "
                                              "'torchvision'"} for op in ("a", "b")]}
    assert exit_code(skipped) == 1
    assert headline(skipped) == ("FAIL opforge bench p: 0 timed, 0 failed, 2 skipped on cpu: "
                                 "nothing was timed: 2 rows skipped: reference "
                                 "torchvision.ops.nms: No module named 'torchvision'")
    empty = {"kind": "bench", "package": "p", "rows": []}
    assert exit_code(empty) == 1 and "no workload was selected" in nothing_timed(empty)
    failed = {"kind": "bench", "package": "p", "rows": [{"op": "a", "status": "fail"}]}
    assert exit_code(failed) == 1 and nothing_timed(failed) is None  # its failure says why


def test_save_says_what_it_did_in_one_line(tmp_path):
    from opforge.bench.run import store

    target = tmp_path / "b.json"
    passing = _run(_alone("a", 1e-3))
    assert store(passing, "baseline b", target) == \
        f"saved this run as baseline b ({target}): 1 rows timed."
    before = target.read_bytes()
    failing = _run(_alone("a", 1e-3), dict(_alone("b", 1e-3), status="fail"))
    line = store(failing, "baseline b", target)
    assert line == (f"not saved as baseline b: 1 row failed (b/small/forward/cpu); {target} "
                    "keeps the run saved before.")
    assert target.read_bytes() == before
    line = store(failing, "baseline c", tmp_path / "c.json")
    assert line.endswith("c.json was not written.") and not (tmp_path / "c.json").exists()
    nothing = {"kind": "bench", "package": "p", "rows": []}
    assert "nothing was timed" in store(nothing, "baseline c", tmp_path / "c.json")
