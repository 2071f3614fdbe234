"""The pure search, exhaustively over small ranges: every regression point, every skip set."""

from __future__ import annotations

import itertools
import math
from datetime import date

import pytest

from opforge.bisect.search import (
    EndpointError,
    Found,
    Outcome,
    Probe,
    bisect,
    max_probes,
    next_step,
    walkback_dates,
)

G, B, S = Outcome.GOOD, Outcome.BAD, Outcome.SKIP


def truth(first_bad: int, skipped: frozenset[int] = frozenset()):
    def predicate(i: int) -> Outcome:
        if i in skipped:
            return S
        return B if i >= first_bad else G
    return predicate


def counting(predicate):
    calls: list[int] = []

    def wrapped(i):
        calls.append(i)
        return predicate(i)
    return wrapped, calls


@pytest.mark.parametrize("n", range(2, 17))
def test_finds_every_regression_point_within_the_probe_bound(n):
    for first_bad in range(1, n):
        predicate, calls = counting(truth(first_bad))
        step, _ = bisect(list(range(n)), predicate)
        assert step == Found(first_bad - 1, first_bad)
        assert len(calls) <= math.ceil(math.log2(n)) + 2
        assert len(calls) <= max_probes(n)
        assert len(calls) == len(set(calls)), "a candidate was probed twice"


@pytest.mark.parametrize("n", range(3, 9))
def test_every_placement_of_skips_gives_the_smallest_remaining_range(n):
    interior = range(1, n - 1)
    for first_bad in range(1, n):
        for k in range(len(interior) + 1):
            for skipped in map(frozenset, itertools.combinations(interior, k)):
                predicate, calls = counting(truth(first_bad, skipped))
                step, _ = bisect(list(range(n)), predicate)
                testable = [i for i in range(n) if i not in skipped]
                last_good = max(i for i in testable if i < first_bad)
                first_bad_seen = min(i for i in testable if i >= first_bad)
                assert step == Found(last_good, first_bad_seen,
                                     tuple(range(last_good + 1, first_bad_seen)))
                assert step.exact == (last_good + 1 == first_bad_seen)
                assert len(calls) == len(set(calls))
                assert len(calls) <= max_probes(n) + len(skipped)


def test_skip_is_not_counted_as_bad_or_good():
    # 0 good, 1..3 skipped, 4 bad: the answer must keep all three skipped ones in the range.
    step, results = bisect(list(range(5)), truth(2, frozenset({1, 2, 3})))
    assert step == Found(0, 4, (1, 2, 3))
    assert not step.exact
    assert {i for i, o in results.items() if o is S} == {1, 2, 3}


def test_skipped_middle_probes_a_neighbour():
    results = {8: B, 0: G, 4: S}
    assert next_step(9, results) in (Probe(3), Probe(5))


@pytest.mark.parametrize("outcome", [G, S])
def test_bad_endpoint_that_does_not_fail_is_reported(outcome):
    assert next_step(5, {}) == Probe(4)
    assert next_step(5, {4: outcome}) == EndpointError("bad", outcome)


@pytest.mark.parametrize("outcome", [B, S])
def test_good_endpoint_that_does_not_pass_is_reported(outcome):
    assert next_step(5, {4: B}) == Probe(0)
    assert next_step(5, {4: B, 0: outcome}) == EndpointError("good", outcome)


def test_adjacent_endpoints_need_only_the_endpoint_probes():
    predicate, calls = counting(truth(1))
    assert bisect([0, 1], predicate)[0] == Found(0, 1)
    assert sorted(calls) == [0, 1]


@pytest.mark.parametrize("n", [0, 1])
def test_fewer_than_two_candidates_is_an_error(n):
    with pytest.raises(ValueError):
        next_step(n, {})


def test_recorded_results_are_not_probed_again():
    # resuming: whatever is recorded counts, only the rest is probed
    predicate, first = counting(truth(5))
    step, recorded = bisect(list(range(8)), predicate)
    partial = dict(list(recorded.items())[:2])
    predicate2, second = counting(truth(5))
    assert bisect(list(range(8)), predicate2, partial)[0] == step
    assert not set(second) & set(partial)
    assert len(second) == len(first) - 2


def test_walkback_goes_two_days_then_a_week_then_two_weeks_at_a_time():
    days = walkback_dates(date(2024, 6, 30), limit=5)
    assert days == [date(2024, 6, 28), date(2024, 6, 21), date(2024, 6, 7),
                    date(2024, 5, 24), date(2024, 5, 10)]


def test_plan_spreads_a_round_evenly_and_settles_80_candidates_in_two_rounds_of_8():
    from opforge.bisect.search import plan

    n = 82  # the good end, 80 in between, the bad end
    for first_bad in range(1, n):
        truth = {i: Outcome.GOOD if i < first_bad else Outcome.BAD for i in range(n)}
        results = {0: Outcome.GOOD, n - 1: Outcome.BAD}  # endpoints checked (a round of 2)
        rounds = 0
        while True:
            step = plan(n, results, 8)
            if isinstance(step, Found):
                break
            assert len(step) <= 8 and not set(step) & set(results)
            results.update({i: truth[i] for i in step})
            rounds += 1
        assert (step.last_good, step.first_bad) == (first_bad - 1, first_bad)
        assert rounds <= 2


def test_plan_takes_untested_endpoints_first():
    from opforge.bisect.search import plan

    assert plan(10, {}, 1) == [9]
    assert plan(10, {}, 4)[:1] == [0] and 9 in plan(10, {}, 4) and len(plan(10, {}, 4)) == 4
    assert isinstance(plan(10, {0: Outcome.BAD, 9: Outcome.BAD}, 3), EndpointError)
