"""The bisection itself: a pure function of the results so far, like ``git bisect``.

Candidates are indices ``0 .. n-1`` in time order; index 0 is the good endpoint and
``n-1`` the bad one. ``next_step(n, results)`` says what to test next (or that the search is
over); the caller runs the probe, records its outcome and asks again. Keeping the search a
function of the recorded results is what makes ``--resume`` trivial and lets the tests run
it over every placement of skips without a single subprocess. No I/O in this module.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, timedelta
from typing import TypeVar

T = TypeVar("T")


class Outcome(enum.Enum):
    GOOD = "good"
    BAD = "bad"
    SKIP = "skip"


@dataclass(frozen=True)
class Probe:
    """Test candidate ``index`` next."""

    index: int


@dataclass(frozen=True)
class Found:
    """The search is over: ``last_good`` passes, ``first_bad`` fails.

    ``skipped`` are the candidates strictly between them, all untestable; when it is not
    empty the regression is in one of them or in ``first_bad`` (git bisect's "only skipped
    commits left to test").
    """

    last_good: int
    first_bad: int
    skipped: tuple[int, ...] = ()

    @property
    def exact(self) -> bool:
        return not self.skipped


@dataclass(frozen=True)
class EndpointError:
    """An endpoint did not behave as claimed: ``which`` is "good" or "bad"."""

    which: str
    outcome: Outcome


Step = Probe | Found | EndpointError


def max_probes(n: int) -> int:
    """The most probes ``next_step`` needs for ``n`` candidates when nothing is skipped."""
    return (n - 1).bit_length() + 2 if n > 1 else 0


def next_step(n: int, results: Mapping[int, Outcome]) -> Step:
    """What to do next, given the outcomes recorded so far (index -> Outcome)."""
    if n < 2:
        raise ValueError(f"a bisection needs at least two candidates, got {n}")
    good, bad = 0, n - 1
    # Endpoints first, bad before good: a bad endpoint that passes is the commoner mistake.
    for index, which, expected in ((bad, "bad", Outcome.BAD), (good, "good", Outcome.GOOD)):
        if index not in results:
            return Probe(index)
        if results[index] is not expected:
            return EndpointError(which, results[index])
    hi = min(i for i, o in results.items() if o is Outcome.BAD and 0 <= i < n)
    lo = max(i for i, o in results.items() if o is Outcome.GOOD and 0 <= i < hi)
    untested = [i for i in range(lo + 1, hi) if i not in results]
    if not untested:
        return Found(lo, hi, tuple(range(lo + 1, hi)))
    return Probe(_nearest_to_middle(untested, lo, hi))


def _nearest_to_middle(untested: Sequence[int], lo: int, hi: int) -> int:
    # Ties go to the older side, so a skip run shifts the probe the same way git bisect's does.
    middle = (lo + hi) / 2
    return min(untested, key=lambda i: (abs(i - middle), i))


def bisect(candidates: Sequence[T], predicate: Callable[[T], Outcome],
           results: Mapping[int, Outcome] | None = None) -> tuple[Step, dict[int, Outcome]]:
    """Run the whole search with an in-process predicate (tests, and as documentation)."""
    recorded = dict(results or {})
    while True:
        step = next_step(len(candidates), recorded)
        if not isinstance(step, Probe):
            return step, recorded
        recorded[step.index] = predicate(candidates[step.index])


WALKBACK_STEPS = (timedelta(days=2), timedelta(days=7))
WALKBACK_REPEAT = timedelta(days=14)


def walkback_dates(bad: date, limit: int = 16) -> list[date]:
    """Dates to try when no good nightly was given: 2 days back, then a week, then two weeks
    at a time. The caller maps each to the newest nightly on or before it and stops at the
    first good one."""
    out: list[date] = []
    day = bad
    for k in range(limit):
        day -= WALKBACK_STEPS[k] if k < len(WALKBACK_STEPS) else WALKBACK_REPEAT
        out.append(day)
    return out


def plan(n: int, results: Mapping[int, Outcome], k: int) -> list[int] | Found | EndpointError:
    """The next ``k`` candidates to test side by side (a round on ``k`` machines), or the end.

    Untested endpoints come first; the rest are spread evenly over the open interval, so one
    round of ``k`` verdicts cuts it ``k + 1`` ways (k = 8: two rounds settle 80 candidates).
    """
    if k < 1:
        raise ValueError(f"a round needs at least one probe, got {k}")
    step = next_step(n, results)
    if not isinstance(step, Probe):
        return step
    ends = [i for i in (n - 1, 0) if i not in results]
    bads = [i for i, o in results.items() if o is Outcome.BAD]
    hi = min(bads) if bads else n - 1
    goods = [i for i, o in results.items() if o is Outcome.GOOD and i < hi]
    lo = max(goods) if goods else 0
    untested = [i for i in range(lo + 1, hi) if i not in results]
    chosen = ends[:k]
    slots = k - len(chosen)
    for j in range(1, slots + 1):
        if not untested:
            break
        target = lo + (hi - lo) * j / (slots + 1)
        best = min(untested, key=lambda i: (abs(i - target), i))
        chosen.append(best)
        untested.remove(best)
    return sorted(chosen)
