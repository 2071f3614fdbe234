"""`opforge bisect --probe` runs started together on one `--state` (issue 29): each keeps its
step. Before the state lock, two probes on one state both exited 0 and the state kept one.

Real processes, the way a user (or a fan-out on one host) starts them: a round of three
probes is planned, the three `--probe` processes are started at once, and the state must hold
every step (without the lock each probe saved the state it read at its start plus its own
step: the last one to finish won). One round: each probe makes an environment (~10 s each on
a 2-core runner); tests/safety/test_races.py repeats the race itself many times.
"""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow

ENDS = ("--good", "2024-06-01", "--bad", "2024-06-11", "--match", "does not exist")


def test_probes_started_together_on_one_state_each_keep_their_step(bisector):
    plan = bisector(*ENDS, "--plan", "3")
    assert plan.returncode == 0, plan.stderr
    keys = [p["key"] for p in plan.json()["probes"]]
    assert len(keys) == 3
    runs = [bisector.start(*ENDS, "--probe", key) for key in keys]
    outs = [run.communicate(timeout=300) for run in runs]
    assert [run.returncode for run in runs] == [0] * len(runs), [err for _, err in outs]
    saved = json.loads(bisector.state.read_text())
    assert {s["nightly"]["date"] for s in saved["steps"]} == set(keys)
