"""Baselines: `opforge bench --save NAME` / `--against NAME|FILE`. A baseline keeps both sides'
times and noises; a row is slower than its baseline only when our own time moved beyond the
threshold and our noise (and the ratio of the sides fell alike); a reference, a yardstick or a
machine that moved is a WARN naming the side that moved. The rows here are constructed: the
verdict is a function of the numbers, and no test times anything."""

from __future__ import annotations

import json

import pytest

from opforge.bench.compare import baseline_rows, compare_to_baseline
from opforge.bench.report import exit_code, markdown
from opforge.errors import UsageError


def _row(op, ours_s, reference_s, noise=0.05, reference_noise=0.05) -> dict:
    row = {"op": op, "workload": "small", "direction": "forward", "device": "cpu",
           "reference": "ref", "status": "pass", "speedup": reference_s / ours_s,
           "noise": noise, "ours_s": ours_s, "reference_s": reference_s, "spread": 0.0,
           "rounds": 5}
    if reference_noise is not None:
        row["reference_noise"] = reference_noise
    return row


def _doc(*rows) -> dict:
    return {"kind": "bench", "package": "p", "rows": list(rows)}


def _base(*rows) -> dict:
    return baseline_rows(_doc(*rows), "base")


def test_our_time_slower_beyond_threshold_and_noise_fails_naming_the_factor():
    base = _base(_row("a", 1e-3, 2e-3), _row("b", 1e-3, 2e-3), _row("c", 1e-3, 2e-3))
    now = _doc(_row("a", 10e-3, 2e-3), _row("b", 1.1e-3, 2e-3), _row("c", 0.5e-3, 2e-3))
    compare_to_baseline(now, base, "base", 1.5)
    a, b, c = now["rows"]
    assert a["status"] == "fail" and a["baseline"]["verdict"] == "fail"
    assert a["message"] == ("10.00x slower than baseline base (reference unchanged (2 ms → "
                            "2 ms); ours 1 ms → 10 ms; speed-up 0.2x, was 2x; allowed 1.5x "
                            "beyond noise ±10%)")
    assert b["status"] == "pass" and b["baseline"]["verdict"] == "ok" and "warning" not in b
    assert c["status"] == "pass" and c["baseline"]["change"] == pytest.approx(2.0)
    assert c["baseline"]["moved"] == ["ours"]  # faster: reported, never a failure
    assert "0.10x of base" in markdown(now) and exit_code(now) == 1


def test_ours_unchanged_and_the_reference_faster_is_a_warn_naming_the_reference(capsys):
    """The measured false alarm: ours 503 µs → 477 µs, the reference 3.19 ms → 154 µs."""
    from opforge.bench.report import render_terminal

    base = _base(_row("scaled_add", 503e-6, 3.19e-3))
    now = _doc(_row("scaled_add", 477e-6, 154e-6))
    compare_to_baseline(now, base, "base", 1.5)
    row = now["rows"][0]
    assert row["status"] == "pass" and row["baseline"]["verdict"] == "warn"
    assert row["baseline"]["moved"] == ["reference"]
    assert row["warning"] == ("the reference moved, not ours: compared with baseline base, "
                              "reference 3.19 ms → 154 µs; ours unchanged (503 µs → 477 µs); "
                              "speed-up 0.323x, was 6.34x")
    assert exit_code(now) == 0 and now["baseline"]["slower"] == 0
    assert now["baseline"]["warned"] == 1
    summary = markdown(now)
    assert "- ⚠️ `scaled_add` small fwd on cpu: the reference moved, not ours" in summary
    assert "1 rows warned: a side moved that is not ours alone" in summary
    render_terminal(now)
    out = capsys.readouterr().out
    assert "WARN scaled_add small fwd on cpu: the reference moved, not ours" in out
    assert "FAIL" not in out.replace("FAIL opforge", "")


def test_ours_slower_within_its_noise_does_not_fail():
    base = _base(_row("a", 1e-3, 2e-3, noise=0.4))
    now = _doc(_row("a", 2e-3, 2e-3, noise=0.4))  # 2x slower, allowed 1.5x beyond ±80%
    compare_to_baseline(now, base, "base", 1.5)
    row = now["rows"][0]
    assert row["status"] == "pass" and row["baseline"]["verdict"] != "fail"
    assert "ours unchanged (1 ms → 2 ms)" in row["baseline"]["line"]


def test_ours_slower_within_the_threshold_does_not_fail_even_if_the_reference_moved():
    base = _base(_row("a", 1e-3, 2e-3, noise=0.0))
    now = _doc(_row("a", 1.4e-3, 0.2e-3, noise=0.0))  # ours 1.4x (allowed 1.5x), ref 10x faster
    compare_to_baseline(now, base, "base", 1.5)
    row = now["rows"][0]
    assert row["status"] == "pass" and row["baseline"]["verdict"] == "warn"
    assert "reference 2 ms → 200 µs; ours unchanged (1 ms → 1.4 ms)" in row["warning"]


def test_both_sides_slower_alike_is_the_machine_a_warn_not_a_fail():
    base = _base(_row("a", 1e-3, 2e-3))
    now = _doc(_row("a", 3e-3, 6e-3))
    compare_to_baseline(now, base, "base", 1.5)
    row = now["rows"][0]
    assert row["status"] == "pass" and row["baseline"]["moved"] == ["ours", "reference"]
    assert row["warning"].startswith("ours 3.00x slower than baseline base and the reference "
                                     "alike (reference 2 ms → 6 ms; ours 1 ms → 3 ms;")
    assert row["warning"].endswith("the machine is slower or busier, not the op")


def test_ours_slower_while_the_reference_also_slowed_less_fails():
    base = _base(_row("a", 1e-3, 2e-3, noise=0.0, reference_noise=0.0))
    now = _doc(_row("a", 4e-3, 3.2e-3, noise=0.0, reference_noise=0.0))  # ours 4x, ref 1.6x
    compare_to_baseline(now, base, "base", 1.5)
    row = now["rows"][0]
    assert row["status"] == "fail", row
    assert row["message"].startswith("4.00x slower than baseline base (reference 2 ms → 3.2 ms;"
                                     " ours 1 ms → 4 ms;")


def test_an_old_baseline_without_reference_noise_takes_this_runs():
    """A baseline saved before the reference's noise was measured: its missing noise is this
    run's (same method, same machine), so a reference that moved within that noise is
    'unchanged'; our own slowdown still fails."""
    old = _row("a", 1e-3, 2e-3, reference_noise=None)
    old2 = _row("b", 1e-3, 2e-3, reference_noise=None)
    base = _base(old, old2)
    now = _doc(_row("a", 1e-3, 0.8e-3, reference_noise=0.5), _row("b", 10e-3, 2e-3))
    compare_to_baseline(now, base, "base", 1.5)
    a, b = now["rows"]
    # 2.5x faster, within 1.5x beyond ±100% (0.5 taken for both runs)
    assert "reference unchanged (2 ms → 800 µs); ours unchanged (1 ms → 1 ms)" in \
        a["baseline"]["line"]
    assert a["status"] == "pass"
    assert b["status"] == "fail" and b["message"].startswith("10.00x slower than baseline base")


def test_an_old_baseline_row_without_our_time_can_only_warn():
    old = _row("a", 1e-3, 2e-3, reference_noise=None)
    del old["ours_s"], old["reference_s"]
    now = _doc(_row("a", 10e-3, 2e-3))
    compare_to_baseline(now, _base(old), "base", 1.5)
    row = now["rows"][0]
    assert row["status"] == "pass" and row["baseline"]["verdict"] == "warn"
    assert "the baseline has no time of ours to tell which side moved" in row["warning"]
    assert "save it again" in row["warning"]


def test_a_baseline_file_of_an_older_opforge_is_read_and_a_bad_new_field_refused(tmp_path):
    from opforge.bench.baselines import read_baseline

    older = _doc(_row("a", 1e-3, 2e-3, reference_noise=None))
    path = tmp_path / "old.json"
    path.write_text(json.dumps(older))
    rows, _machine = read_baseline(path, "--against old.json")
    assert [k[0] for k in rows] == ["a"]
    for bad in ("-0.1", '"0.1"', "1e999"):  # 1e999: JSON reads it as infinity
        text = json.dumps(_doc(_row("a", 1e-3, 2e-3, reference_noise=12345.5)))
        path.write_text(text.replace("12345.5", bad))
        with pytest.raises(UsageError, match=r"row 1 \(a\): reference_noise is"):
            read_baseline(path, "--against old.json")


def test_rows_the_baseline_lacks_are_left_alone():
    base = _base(_row("old", 1e-3, 2e-3))
    now = _doc(_row("old", 1e-3, 2e-3), _row("new", 10e-3, 2e-3, noise=0.0))
    compare_to_baseline(now, base, "base", 1.5)
    assert "baseline" not in now["rows"][1] and now["rows"][1]["status"] == "pass"
    assert "1 timed rows are not in the baseline (not compared)" in markdown(now)


def test_a_baseline_that_shares_no_row_with_the_run_is_not_a_pass():
    now = _doc(_row("new", 1e-3, 2e-3))
    compare_to_baseline(now, _base(_row("old", 1e-3, 2e-3)), "base", 1.5)
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
    (baseline_dir() / "nightly.json").write_text(json.dumps(_doc(_row("a", 1e-3, 3e-3))))
    name, rows, _machine = load_baseline("nightly")
    assert name == "nightly" and [k[0] for k in rows] == ["a"]
    with pytest.raises(UsageError, match=r"no such baseline \(saved: nightly"):
        load_baseline("weekly")


def test_the_summary_says_what_the_run_was_compared_with():
    base = _base(_row("a", 1e-3, 2e-3), _row("b", 1e-3, 2e-3))
    now = _doc(_row("a", 10e-3, 2e-3), _row("b", 1e-3, 2e-3))
    compare_to_baseline(now, base, "the last good run (nightly-bench-cpu-41)", 1.5)
    assert ("Compared with the last good run (nightly-bench-cpu-41): 2 rows, 1 slower by more "
            "than 1.5x beyond noise.") in markdown(now)
    first = _doc(_row("a", 1e-3, 2e-3))
    first["baseline"] = {"name": None, "note": "no last good run yet"}
    assert "No baseline to compare with: no last good run yet." in markdown(first)
    assert "Compared with" not in markdown(_doc(_row("a", 1e-3, 2e-3)))


def _alone(op, ours_s, noise=0.05, yardstick_s=1e-3) -> dict:
    """A row timed alone, paired with a yardstick (1 ms): its pace is the yardstick / its time."""
    return {"op": op, "workload": "small", "direction": "forward", "device": "cpu",
            "reference": "cpu", "status": "pass", "alone": True, "ours_s": ours_s,
            "yardstick_s": yardstick_s, "pace": yardstick_s / ours_s, "noise": noise,
            "yardstick_noise": noise, "rounds": 5}


def _run(*rows, cpu="CPU A") -> dict:
    return {"kind": "bench", "package": "p", "rows": list(rows),
            "environment": {"cpu": cpu, "threads": 2}}


def test_rows_timed_alone_compare_their_pace_with_the_saved_run():
    from opforge.bench.compare import machine

    saved = _run(_alone("a", 1e-3), _alone("b", 1e-3))
    now = _run(_alone("a", 10e-3), _alone("b", 1.1e-3))
    compare_to_baseline(now, baseline_rows(saved, "base"), "base", 1.5, machine(saved))
    a, b = now["rows"]
    assert a["status"] == "fail" and a["baseline"]["by"] == "pace"
    assert a["message"] == ("10.00x slower than baseline base (yardstick unchanged (1 ms → "
                            "1 ms); ours 1 ms → 10 ms; pace against the yardstick 0.1x, was 1x;"
                            " allowed 1.5x beyond noise ±10%)")
    assert b["status"] == "pass" and "0.91x of base" in markdown(now)
    assert "Note:" not in markdown(now)  # same machine
    now["saved"] = {"line": "not saved as baseline b: 1 row failed (a/small/forward/cpu)"}
    summary = markdown(now)  # the job summary: op and factor, and what --save did
    assert "- ❌ `a` small fwd on cpu: 10.00x slower than baseline base" in summary
    assert "not saved as baseline b: 1 row failed (a/small/forward/cpu)" in summary


def test_a_row_alone_whose_yardstick_slowed_alike_is_the_machine_not_a_fail():
    saved = _run(_alone("a", 1e-3))
    now = _run(_alone("a", 3e-3, yardstick_s=3e-3))  # a machine three times slower
    compare_to_baseline(now, baseline_rows(saved, "base"), "base", 1.5)
    row = now["rows"][0]
    assert row["status"] == "pass" and row["baseline"]["moved"] == ["ours", "yardstick"]
    assert "the machine is slower or busier, not the op" in row["warning"]


def test_rows_alone_from_another_machine_are_compared_and_the_summary_says_so():
    from opforge.bench.compare import machine

    saved = _run(_alone("a", 1e-3), cpu="CPU A")
    now = _run(_alone("a", 1e-3), _alone("new", 1e-3), cpu="CPU B")
    compare_to_baseline(now, baseline_rows(saved, "base"), "base", 1.5, machine(saved))
    text = markdown(now)
    assert "1 timed rows are not in the baseline (not compared)" in text
    assert ("1 rows timed alone were compared, and the baseline ran on CPU A, 2 threads, this "
            "run on CPU B, 2 threads") in text


def test_a_run_that_timed_nothing_is_not_a_pass_and_says_why():
    from opforge.bench.report import headline, nothing_timed

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
