"""The paired, alternating measurement both the smoke speed check and `opforge bench` use:
planted timings (no clock), so the verdict logic is tested exactly; and the recipes' workload
fields are validated like the rest of a recipe."""

from __future__ import annotations

import itertools

import pytest

from opforge.smoke.probe.checks import skippable
from opforge.smoke.probe.recipes import RecipeError, resolve_reference, validate
from opforge.smoke.probe.speed import paired, seconds, spread


def _times(*values):
    it = itertools.cycle(values)
    return lambda: next(it)


def test_median_of_ratios_ignores_a_machine_that_slows_down_for_a_while():
    # both sides slow down 5x in some rounds (a busy neighbour): every round's ratio stays 20
    load = itertools.cycle([1, 1, 5, 1, 5, 5, 1])
    factor = {"now": 1}

    def a():
        factor["now"] = next(load)
        return 1e-3 * factor["now"]

    result = paired(a, lambda: 20e-3 * factor["now"], budget_s=0, min_rounds=7, inner=1)
    assert result["ratio"] == pytest.approx(20) and result["spread"] == pytest.approx(0)
    assert result["rounds"] == 7


def test_one_outlier_round_does_not_move_the_verdict():
    result = paired(_times(1e-3), _times(1e-3, 1e-3, 50e-3, 1e-3, 1e-3), budget_s=0,
                    min_rounds=5, inner=1)
    assert result["ratio"] == pytest.approx(1)


def test_a_stalled_block_inside_a_round_does_not_move_its_ratio():
    # every round has one block of each side stalled 40x: the fastest blocks still say 10
    a = _times(1e-3, 40e-3, 1e-3)
    b = _times(400e-3, 10e-3, 10e-3)
    result = paired(a, b, budget_s=0, min_rounds=5, max_rounds=5, inner=3)
    assert result["ratio"] == pytest.approx(10) and result["rounds"] == 5
    assert result["a_s"] == pytest.approx(1e-3) and result["b_s"] == pytest.approx(10e-3)


def test_sides_alternate_order():
    order = []
    paired(lambda: order.append("a") or 1.0, lambda: order.append("b") or 1.0, budget_s=0,
           min_rounds=2, max_rounds=2, inner=2)
    assert "".join(order) == "abba" + "baab"


def test_spread_and_seconds():
    assert spread([1.0]) == 0 and spread([1.0, 1.0, 1.0]) == 0
    assert spread([1.0, 2.0, 3.0, 4.0, 5.0]) == pytest.approx(2 / 3)
    assert [seconds(x) for x in (1.2, 0.292, 41.3e-6)] == ["1.20 s", "292 ms", "41.3 µs"]


def _inputs(dtype):
    return []


@pytest.mark.parametrize("recipe, problem", [
    ({"inputs": _inputs, "workloads": []}, "must be a non-empty dict"),
    ({"inputs": _inputs, "workloads": {"small": {}}}, "needs 'inputs'"),
    ({"inputs": _inputs, "workloads": {"small": {"inputs": _inputs, "size": 3}}},
     "unknown field(s) size"),
    ({"inputs": _inputs, "workloads": {"small": {"inputs": _inputs, "grad": "0"}}},
     "list of argument indices"),
    ({"inputs": _inputs, "workloads": {"small": {"inputs": _inputs, "devices": "cuda"}}},
     "list of device names"),
    ({"inputs": _inputs, "reference": 3}, "must be a callable, a dotted name"),
    ({"inputs": _inputs, "workloads": {"s": {"inputs": _inputs, "reference": ""}}},
     "must be a callable, a dotted name"),
])
def test_bad_workloads_are_named(recipe, problem):
    assert problem in (validate("op", recipe, "r.py", skippable()) or "")


def test_good_workloads_pass():
    assert validate("op", {"inputs": _inputs, "reference": "cpu", "workloads": {
        "small": {"inputs": _inputs, "grad": [0], "devices": ["cuda"],
                  "reference": "math.hypot"}}}, "r.py", skippable()) is None


def test_references_resolve_to_callables_or_say_why_not():
    import math
    import os.path

    assert resolve_reference("math.hypot") is math.hypot
    assert resolve_reference("os.path.join") is os.path.join
    assert resolve_reference(None) == "cpu" and resolve_reference("cpu") == "cpu"
    with pytest.raises(RecipeError, match="cannot import it"):
        resolve_reference("no_such_library_xyz.ops.nms")
    with pytest.raises(RecipeError, match="has no attribute"):
        resolve_reference("math.no_such_function")
    with pytest.raises(RecipeError, match="not callable"):
        resolve_reference("math.pi")
