"""benchmarks/timing.py, the statistic bench_cpu.py reports, on a simulated clock: a machine
whose load comes in bursts must not move a ratio, and the noise printed must be the rounds'
spread."""

import importlib.util
from pathlib import Path

import pytest

TIMING_PY = Path(__file__).resolve().parents[1] / "benchmarks" / "timing.py"
spec = importlib.util.spec_from_file_location("bench_timing", TIMING_PY)
timing = importlib.util.module_from_spec(spec)
spec.loader.exec_module(timing)


class Machine:
    """A clock, and calls that advance it by their cost times the machine's load at that
    moment; `slice_every` calls, one call is cut by a time slice of `slice_cost`."""

    def __init__(self, load=lambda now: 1.0, slice_every=0, slice_cost=0.0):
        self.now = 0.0
        self.load = load
        self.calls = 0
        self.slice_every = slice_every
        self.slice_cost = slice_cost

    def clock(self):
        return self.now

    def call(self, cost):
        def run():
            self.calls += 1
            self.now += cost * self.load(self.now)
            if self.slice_every and self.calls % self.slice_every == 0:
                self.now += self.slice_cost
        return run


def test_round_order_turns_and_measures_each_condition_once():
    keys = ["a", "b", "c", "d"]
    orders = [timing.round_order(keys, r) for r in range(8)]
    assert all(sorted(order) == keys for order in orders)
    assert {order[0] for order in orders} == set(keys)  # nothing always goes first
    assert orders[1] == ["d", "c", "b", "a"]  # reversed
    assert orders[3] == ["a", "d", "c", "b"]  # rotated by one, then reversed
    assert timing.round_order([], 3) == []


def test_a_batch_cut_by_a_time_slice_does_not_move_the_median():
    machine = Machine(slice_every=7 * 20, slice_cost=3e-3)
    per_call = timing.measure(machine.call(10e-6), 0.05, 20, machine.clock)
    # one batch of 20 calls in seven is cut by 3 ms: the mean per call would be 3x the call;
    # the median batch is a clean one
    assert per_call == pytest.approx(10e-6)


def test_batches_are_short_next_to_a_time_slice():
    machine = Machine()
    assert timing.batch_size(machine.call(1e-6), machine.clock) == 200
    assert timing.batch_size(machine.call(1.0), machine.clock) == 1  # a long call: one per batch


def test_a_load_burst_moves_times_but_not_the_ratio():
    # load 3x for a stretch of the run, as another job starting and stopping would do
    machine = Machine(load=lambda now: 3.0 if 0.3 < now < 0.9 else 1.0)
    conditions = {"ours": machine.call(1e-4), "theirs": machine.call(2.5e-4)}
    times = timing.interleaved(conditions, 15, 0.02, clock=machine.clock)
    assert max(times["ours"]) / min(times["ours"]) == pytest.approx(3.0, rel=0.01)
    value, noise = timing.ratio(times["theirs"], times["ours"])
    assert value == pytest.approx(2.5, rel=0.01)
    assert noise < 0.05


def test_prepare_runs_before_every_measurement_of_its_condition():
    machine = Machine()
    seen = []
    conditions = {1: machine.call(1e-4), 2: machine.call(1e-4)}
    timing.interleaved(conditions, 3, 0.001, prepare=seen.append, clock=machine.clock)
    assert seen == [1, 2, 1, 2, 2, 1, 2, 1]  # batch sizing, then ABBA over rounds 0-2


def test_ratio_is_the_median_of_round_ratios_with_half_the_interquartile_range():
    value, noise = timing.ratio([1.0, 2.0, 3.0, 4.0, 5.0], [1.0, 1.0, 1.0, 1.0, 1.0])
    assert value == 3.0
    assert noise == pytest.approx(1.0)  # quartiles 2 and 4
    assert timing.ratio([3.0], [2.0]) == (1.5, 0.0)
    with pytest.raises(ValueError):
        timing.ratio([1.0, 2.0], [1.0])


def test_a_measurement_takes_enough_batches_but_not_forever():
    machine = Machine()
    calls = machine.calls
    timing.measure(machine.call(2e-3), 0.001, 1, machine.clock)  # a 2 ms call, 1 ms budget
    assert machine.calls - calls == timing.MIN_BATCHES
    calls = machine.calls
    timing.measure(machine.call(1.0), 0.001, 1, machine.clock)  # a 1 s call: three batches
    assert machine.calls - calls == 3
