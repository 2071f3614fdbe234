"""The verdicts `opforge bench` takes inside the target, on injected numbers: the speed-up floor
(and an op declared slower), a thread count's cost, a row against its plain op. The timing
itself is replaced (``paired`` returns what the test says), so each verdict is a function of
the numbers and nothing here is timed; how well real timings catch real slowdowns is measured
by ``benchmarks/bench_planted.py``."""

from __future__ import annotations

import pytest

from opforge.bench.target import bench as target
from opforge.bench.target.bench import Bench, Row, judge_vs_plain


def _pair(ratio: float, a_s: float = 1e-3) -> dict:
    return {"a_s": a_s, "b_s": a_s * ratio, "ratio": ratio, "spread": 0.0, "rounds": 5}


@pytest.fixture
def timed(monkeypatch):
    """Bench.measure / measure_alone with the blocks untimed and ``paired`` answering, in
    order, the (speed, ours against ours, the other side against itself) results given."""
    torch = pytest.importorskip("torch")
    answers: list[dict] = []
    monkeypatch.setattr(target, "_block", lambda t, call, target_s=0.02: call)
    monkeypatch.setattr(target, "paired", lambda a, b, **_: answers.pop(0))

    def run(*results, options=None, alone=False):
        answers[:] = list(results)
        runner = Bench(torch, "ns", {}, "recipes.py", options or {})
        row = Row(op="op", workload="small", direction="forward", device="cpu",
                  reference="ref")
        args = [torch.ones(8)]
        if alone:
            runner.measure_alone(row, torch.neg, args, [])
        else:
            runner.measure(row, torch.neg, torch.neg, args, "cpu", [], {})
        assert not answers, "a timing the verdict did not use"
        return row
    return run


def test_a_row_slower_than_the_floor_beyond_its_noise_fails(timed):
    row = timed(_pair(0.05), _pair(1.1), _pair(0.98))
    assert row["status"] == "fail"
    assert row["message"] == "0.05x the reference's speed: slower than the 0.1x allowed"
    assert row["noise"] == pytest.approx(0.1) and row["reference_noise"] == pytest.approx(0.02)
    assert row["ours_s"] == 1e-3 and row["reference_s"] == pytest.approx(5e-5)


def test_a_row_below_the_floor_only_within_its_noise_passes(timed):
    row = timed(_pair(0.08), _pair(1.5), _pair(1.0))  # 0.08 x (1 + 0.5) >= 0.1
    assert row["status"] == "pass" and row["message"] == "0.08x the reference's speed"


def test_an_op_declared_slower_passes_its_own_floor_and_says_so(timed):
    row = timed(_pair(0.05), _pair(1.0), _pair(1.0), options={"op_min_speedup": {"op": 1 / 40}})
    assert row["status"] == "pass" and row["declared_slower"] is True
    assert row["min_speedup"] == pytest.approx(1 / 40)
    assert row["message"] == ("0.05x the reference's speed: slower than 0.1x, as declared "
                              "(matrix.yaml declares op up to 40x slower)")
    row = timed(_pair(0.01), _pair(1.0), _pair(1.0), options={"op_min_speedup": {"op": 1 / 40}})
    assert row["status"] == "fail" and "slower than the 0.025x allowed (matrix.yaml" in \
        row["message"]


def test_a_row_timed_alone_keeps_both_sides_and_both_noises(timed):
    row = timed(_pair(3.0, a_s=2e-3), _pair(1.04), _pair(0.9), alone=True)
    assert row["status"] == "pass" and row["alone"] is True
    assert (row["ours_s"], row["yardstick_s"], row["pace"]) == (2e-3, pytest.approx(6e-3), 3.0)
    assert row["noise"] == pytest.approx(0.04) and row["yardstick_noise"] == pytest.approx(0.1)


def _threads(cost_of_first: float, cost: float, noise=0.0, status="pass") -> tuple[Row, Row]:
    first = Row(op="op", threads=1, ours_s=cost_of_first, noise=noise, status="pass")
    later = Row(op="op", threads=2, ours_s=cost, noise=noise, status=status, message="earlier")
    return first, later


@pytest.mark.parametrize(("options", "times", "noise", "fails"), [
    ({"max_thread_cost": 1.5}, (1e-3, 4e-3), 0.0, True),
    ({"max_thread_cost": 1.5}, (1e-3, 1.4e-3), 0.0, False),
    ({"max_thread_cost": 1.5}, (1e-3, 2e-3), 0.2, False),  # 2 <= 1.5 x (1 + 0.2 + 0.2)
    ({}, (1e-3, 40e-3), 0.0, False),                       # no limit: only reported
])
def test_a_thread_count_fails_only_above_its_limit_beyond_both_rows_noise(options, times,
                                                                          noise, fails):
    runner = Bench(None, "ns", {}, "recipes.py", options)
    first, later = _threads(*times, noise=noise)
    runner.judge_thread_cost(later, first)
    assert later["thread_cost"] == pytest.approx(times[1] / times[0])
    assert later["thread_cost_of"] == 1 and "thread_cost" not in first
    assert later["status"] == ("fail" if fails else "pass")
    if fails:
        assert later["message"] == ("2 threads take 4.00x the time of 1 (at most 1.5x allowed, "
                                    "beyond noise ±0%)")


def test_a_thread_cost_on_a_contended_machine_says_so_and_a_failed_row_keeps_its_reason():
    runner = Bench(None, "ns", {}, "recipes.py", {"max_thread_cost": 1.2, "contended": True})
    first, later = _threads(1e-3, 3e-3)
    runner.judge_thread_cost(later, first)
    assert later["message"].endswith("while busy processes hold every core")
    first, later = _threads(1e-3, 3e-3, status="fail")
    runner.judge_thread_cost(later, first)
    assert later["message"] == "earlier" and later["thread_cost"] == pytest.approx(3)


@pytest.mark.parametrize(("vs", "noise", "limit", "fails"), [
    (10.0, 0.05, 3, True), (2.0, 0.05, 3, False), (3.5, 0.2, 3, False), (50.0, 0.0, None, False),
])
def test_a_row_against_its_plain_op_fails_only_above_max_vs_plain_beyond_noise(vs, noise,
                                                                               limit, fails):
    row = Row(op="heavy", status="pass", noise=noise, plain="plain", vs_plain=vs,
              message="1x the reference's speed")
    judge_vs_plain(row, limit)
    assert row["status"] == ("fail" if fails else "pass")
    assert row.get("max_vs_plain") == limit
    if fails:
        assert row["message"] == ("10.00x the time of plain on the same arguments (at most 3x "
                                  "allowed, beyond noise ±5%)")
