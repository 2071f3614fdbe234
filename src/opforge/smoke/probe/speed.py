"""Paired, alternating timing: the ratio of two sides measured in the same rounds.

Shared by the smoke speed check (a device kernel against the same op on the CPU) and by
``opforge bench`` (an op against its reference). Every round times both sides back to back, in
alternating order, and yields one ratio; the verdict is the median of those ratios, so a
machine that slows down for a while (a shared CI runner) slows both sides of a round alike.
Absolute times are reported for the reader, never judged.
"""

from __future__ import annotations

import statistics
import time


def synchronizer(torch_mod, device: str):
    """A function that waits for ``device``'s queued work (a no-op for the CPU)."""
    if device == "cuda":
        return torch_mod.cuda.synchronize
    if device == "mps":
        return torch_mod.mps.synchronize
    return lambda: None


def block_timer(call, sync, number: int) -> float:
    """Seconds per call of ``number`` calls of ``call`` (queued device work included)."""
    sync()
    t0 = time.perf_counter()
    for _ in range(number):
        call()
    sync()
    return (time.perf_counter() - t0) / number


def calls_per_block(call, sync, target_s: float, limit: int = 10_000) -> int:
    """How many calls make a block of about ``target_s`` (at least one): from the fastest of
    three single calls, so a stall of a busy machine does not shrink every block to one call."""
    once = min(block_timer(call, sync, 1) for _ in range(3))
    return max(1, min(limit, int(target_s / max(once, 1e-7))))


def paired(time_a, time_b, budget_s: float = 0.25, min_rounds: int = 5,
           max_rounds: int = 15, inner: int = 3) -> dict:
    """Alternate ``time_a()`` and ``time_b()`` (each: seconds per call of one block).

    A round alternates the two sides ``inner`` times (a b a b ..., starting with the other
    side every round) and yields one ratio, fastest b over fastest a: a busy machine only ever
    adds time, so the fastest block of each side is the one least disturbed, and the two were
    measured moments apart. Returns both sides' median (over rounds) of those fastest times,
    ``ratio`` (the median of the rounds' ratios b/a), its ``spread`` (the ratios'
    inter-quartile range over their median) and ``rounds``. Stops at ``max_rounds`` or when
    ``budget_s`` is spent, but never before ``min_rounds``.
    """
    a_times, b_times, ratios = [], [], []
    t0 = time.perf_counter()
    for i in range(max_rounds):
        a_block, b_block = [], []
        for j in range(inner):
            if (i + j) % 2 == 0:
                a_block.append(time_a())
                b_block.append(time_b())
            else:
                b_block.append(time_b())
                a_block.append(time_a())
        a, b = min(a_block), min(b_block)
        a_times.append(a)
        b_times.append(b)
        ratios.append(b / max(a, 1e-12))
        if i + 1 >= min_rounds and time.perf_counter() - t0 >= budget_s:
            break
    ratio = statistics.median(ratios)
    return {"a_s": statistics.median(a_times), "b_s": statistics.median(b_times),
            "ratio": ratio, "spread": spread(ratios), "rounds": len(ratios)}


def yardstick(n: int = 20_000) -> int:
    """Fixed work in plain Python (about a millisecond), the same in every run and on every
    torch: what an op with no reference but itself is paired with, so its pace (yardstick
    time / its time) is a ratio from one run that a machine's speed or load moves little."""
    total = 0
    for i in range(n):
        total += i * i % 7
    return total


def spread(ratios: list[float]) -> float:
    """The ratios' inter-quartile range relative to their median (0 for fewer than 2)."""
    if len(ratios) < 2:
        return 0.0
    quartiles = statistics.quantiles(ratios, n=4, method="inclusive")
    return (quartiles[2] - quartiles[0]) / max(statistics.median(ratios), 1e-12)


def seconds(value: float) -> str:
    """A duration the way a reader wants it: 292 ms, 41.3 µs, 1.20 s."""
    if value >= 1:
        return f"{value:.2f} s"
    if value >= 1e-3:
        return f"{value * 1e3:.3g} ms"
    return f"{value * 1e6:.3g} µs"
