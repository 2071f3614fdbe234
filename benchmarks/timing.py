"""Timing that holds on a noisy machine: interleaved rounds, a median of medians, the noise.

bench_cpu.py times every row's conditions (opforge and torchvision at each thread count, and a
row's baseline) with this module:

- a *measurement* runs one condition for a fixed wall-clock budget as short batches of calls
  (each batch about BATCH_SECONDS, far shorter than a scheduler time slice, so most batches run
  without being preempted) and keeps the median batch's time per call;
- a *round* takes one measurement of every condition, in an order that turns from round to
  round (rotated, and reversed every other round), so a burst of load from other processes
  lands on every condition alike rather than on whichever ran at that moment;
- a row's figure for a ratio (a speed-up, a 2t/1t) is the median over rounds of that round's
  ratio: a median of medians. Its noise is half the interquartile range of the rounds' ratios,
  printed beside it: a row whose figure sits within its noise of a limit is a coin toss, and
  more rounds (--rounds) narrow it.
"""

import statistics
import time

# One batch of calls lasts about this long: a Linux time slice on a contended core is a few
# milliseconds, so a batch this short is rarely cut by one.
BATCH_SECONDS = 200e-6
# A measurement takes at least this many batches, however long a call: a call of several
# milliseconds on a contended core is cut by a time slice about as often as not, and the
# median of a handful of such batches flips between the cut and the clean time.
MIN_BATCHES = 15
# ... unless that takes longer than this: a call of tens of milliseconds is cut by a slice or
# more every time, so its time is not two-valued, and three batches do (three at least).
MAX_SECONDS = 0.5


def batch_size(fn, clock=time.perf_counter):
    """Calls per batch: enough that a batch lasts about BATCH_SECONDS (at least one)."""
    fn()  # warm: allocator caches, lazy initialisation, first-touch of the inputs
    start = clock()
    fn()
    once = max(clock() - start, 1e-9)
    return max(1, round(BATCH_SECONDS / once))


def measure(fn, seconds, per_batch, clock=time.perf_counter):
    """The median time per call of fn over batches of `per_batch` calls run for about
    `seconds` (MIN_BATCHES batches at least, unless they would take over MAX_SECONDS; three
    at least)."""
    batches = []
    start = clock()
    deadline, cap = start + seconds, start + max(seconds, MAX_SECONDS)
    while len(batches) < 3 or clock() < deadline or (
            len(batches) < MIN_BATCHES and clock() < cap):
        start = clock()
        for _ in range(per_batch):
            fn()
        batches.append((clock() - start) / per_batch)
    return statistics.median(batches)


def round_order(keys, round_index):
    """The order of the conditions in round `round_index`: rotated by one every second round
    and reversed on odd rounds (two conditions go ABBA BAAB), so no condition always runs
    first or always follows the same neighbour."""
    keys = list(keys)
    if not keys:
        return keys
    shift = (round_index // 2) % len(keys)
    order = keys[shift:] + keys[:shift]
    return order[::-1] if round_index % 2 else order


def interleaved(conditions, rounds, seconds, prepare=None, clock=time.perf_counter):
    """{key: [seconds per call in round 0, 1, ...]} for conditions {key: fn}. `prepare(key)`
    runs before each measurement of that key (bench_cpu sets the thread count there) and
    before its batch size is chosen."""
    sizes = {}
    for key, fn in conditions.items():
        if prepare:
            prepare(key)
        sizes[key] = batch_size(fn, clock)
    times = {key: [] for key in conditions}
    for r in range(rounds):
        for key in round_order(conditions, r):
            if prepare:
                prepare(key)
            times[key].append(measure(conditions[key], seconds, sizes[key], clock))
    return times


def ratio(numerator, denominator):
    """(median of the per-round ratios, noise): numerator[r] / denominator[r] round by round,
    the noise being half their interquartile range (0 for fewer than two rounds)."""
    ratios = [a / b for a, b in zip(numerator, denominator, strict=True)]
    if len(ratios) < 2:
        return ratios[0], 0.0
    q1, _, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
    return statistics.median(ratios), (q3 - q1) / 2
