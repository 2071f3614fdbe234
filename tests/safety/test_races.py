"""Locks where state is shared, proven by processes that really race (issue 29).

Every test starts its processes together (racing.race: forked, held at a barrier, released at
once) and repeats the race ROUNDS times on fresh files. What each asserts is what a user
would see go wrong without the lock: a lost --probe step, two bisects on one state, an
environment built twice or used half-built, a torn baseline, a half-written compiler script.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from pathlib import Path

import pytest
from racing import race

from opforge import compiler_cache
from opforge.bench import baselines
from opforge.bisect import cache as cache_mod
from opforge.bisect import state as state_mod
from opforge.bisect.envs import MARKER, EnvCache, NightlyEnv, env_python
from opforge.bisect.index import Nightly
from opforge.locks import FileLock, LockHeld

WORKERS = 4
ROUNDS = 12
DAYS = [f"2024-06-{d:02d}" for d in range(1, 11)]
PARAMS = {"good": DAYS[0], "bad": DAYS[-1], "variant": "cpu", "python": "3.11",
          "index": "/nightlies", "command": ["true"], "wheel": None, "match": None,
          "regress": "failure", "retries": 0, "timeout": None, "timeout_skip": False,
          "cwd": "/", "notes": []}


def nightly(day: str) -> dict:
    compact = day.replace("-", "")
    name = f"torch-2.5.0.dev{compact}+cpu-cp311-cp311-linux_x86_64.whl"
    return {"date": day, "version": f"2.5.0.dev{compact}+cpu", "filename": name,
            "url": f"file:///nightlies/{name}", "sha256": None}


def step(day: str) -> dict:
    return {"nightly": nightly(day), "outcome": "good", "reason": "exit 0", "exit_code": 0,
            "attempts": 1, "duration_s": 1.0, "sha256": None, "git_version": None,
            "reused_env": False, "output_tail": ""}


def state_with(*days: str) -> state_mod.BisectState:
    return state_mod.BisectState.from_json({
        "schema": 1, "params": PARAMS, "listed": [nightly(d) for d in DAYS],
        "steps": [step(d) for d in days], "result": None, "looked_up": [], "stopped": None})


def leftovers(folder: Path) -> list[str]:
    """Scratch files a writer left behind (a crash or a lost race would leave them)."""
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


# -- the bisect state -----------------------------------------------------------------------


def _probe_saves(path: Path, day: str) -> str:
    """What one `opforge bisect --probe` does with the state: claim it shared, save its step."""
    lock = state_mod.claim(path, shared=True)
    state_mod.save(state_with(day), path, merge=True)
    lock.release()
    return day


def test_probes_started_together_on_one_state_all_keep_their_steps(tmp_path):
    for n in range(ROUNDS):
        path = tmp_path / f"round{n}" / "state.json"
        path.parent.mkdir()
        days = DAYS[1:1 + WORKERS]
        results = race(_probe_saves, [(path, d) for d in days])
        assert results == [("ok", d) for d in days]
        saved = state_mod.load(path)
        assert sorted(saved.steps) == sorted(days), f"round {n}: a probe's step was lost"
        assert leftovers(path.parent) == []


def _full_bisect_claims(path: Path) -> int:
    lock = state_mod.claim(path)  # exclusive: a full bisect, --plan, --resume
    time.sleep(0.25)              # still running when the others try
    lock.release()
    return os.getpid()


def test_two_bisects_on_one_state_one_runs_the_other_is_refused_naming_it(tmp_path):
    for n in range(ROUNDS):
        path = tmp_path / f"round{n}" / "state.json"
        path.parent.mkdir()
        results = race(_full_bisect_claims, [(path,)] * WORKERS)
        winners = [value for status, value in results if status == "ok"]
        refused = [value for status, value in results if status == "raised"]
        assert len(winners) == 1, results
        assert len(refused) == WORKERS - 1
        for message in refused:
            assert message.startswith("LockHeld: --state ") and "in use by another bisect" \
                in message and f"pid {winners[0]} " in message, message


def test_a_bisect_is_refused_up_front_while_probes_hold_the_state(tmp_path):
    path = tmp_path / "state.json"
    probe = FileLock(state_mod.lock_path(path), what="probe").acquire(shared=True)
    try:
        state_mod.check_free(path, shared=True)  # another probe: fine
        with pytest.raises(LockHeld, match="in use by a full bisect or a --plan|in use by"):
            state_mod.check_free(path)
    finally:
        probe.release()
    state_mod.check_free(path)


# -- the environment cache --------------------------------------------------------------------


class SlowBuild(EnvCache):
    """EnvCache whose build is a slow fake (no download, no pip): an interpreter file, a pause
    in which a racing process would see the environment half-made, then the marker."""

    builds: Path

    def _make(self, candidate, path):
        if path.exists():  # a half-built one: removed and made again, under the build lock
            import shutil
            shutil.rmtree(path)
        python = env_python(path)
        python.parent.mkdir(parents=True)
        python.write_text("#!/bin/sh\n")
        time.sleep(0.2)
        env = NightlyEnv(path, python, candidate.version, None, "0" * 64, {}, ["built"])
        self._write_marker(env, candidate.url)
        with open(self.builds, "a") as log:
            log.write(f"{os.getpid()}\n")
        return env


def _ensure(root: Path, builds: Path, day: str) -> tuple[str, bool, bool]:
    envs = SlowBuild(root, sys.executable, [])
    envs.builds = builds
    env = envs.ensure(Nightly.from_json(nightly(day)))
    marker = json.loads((env.path / MARKER).read_text())  # never half-made when handed out
    return str(env.path), env.reused, marker["torch"]["url"] == nightly(day)["url"]


def test_bisects_needing_one_nightly_build_it_once_and_share_it(tmp_path):
    for n in range(ROUNDS):
        root, builds = tmp_path / f"round{n}", tmp_path / f"builds{n}"
        if n % 2:  # an interrupted earlier build left a half-made environment
            half = root / "envs" / nightly(DAYS[3])["filename"][:-4].replace("+", "_")
            (half / "lib").mkdir(parents=True)
        results = race(_ensure, [(root, builds, DAYS[3])] * WORKERS)
        assert all(status == "ok" for status, _ in results), results
        paths = {value[0] for _, value in results}
        assert len(paths) == 1 and all(value[2] for _, value in results)
        assert len(builds.read_text().split()) == 1, f"round {n}: built more than once"
        assert sum(1 for _, value in results if not value[1]) == 1  # one made, the rest reused


def _prune(env_dir: Path) -> bool:
    return cache_mod.remove(cache_mod.CachedEnv(env_dir, "2.5.0", 1, 0.0))


def test_an_environment_in_use_is_not_pruned_by_another_process(tmp_path):
    root = tmp_path / "cache"
    envs = SlowBuild(root, sys.executable, [])
    envs.builds = tmp_path / "builds"
    env = envs.ensure(Nightly.from_json(nightly(DAYS[2])))  # this process now uses it
    assert race(_prune, [(env.path,)] * 2) == [("ok", False)] * 2
    assert (env.path / MARKER).is_file()
    for lock in envs._held.values():
        lock.release()
    assert race(_prune, [(env.path,)]) == [("ok", True)]
    assert not env.path.exists()


# -- bench baselines and the compiler cache's scripts ----------------------------------------


def _save_baseline(path: Path, n: int) -> int:
    rows = [{"op": f"op{i}", "workload": "w", "direction": "forward", "device": "cpu",
             "reference": "ref", "speedup": 1.0 + n, "ours_s": 0.001 * (n + 1)}
            for i in range(200)]
    baselines.save(path, {"kind": "bench", "writer": n, "rows": rows})
    return n


def _read_baseline(path: Path) -> int:
    """Read the baseline over and over while the others write it: never a torn file."""
    seen = 0
    deadline = time.monotonic() + 0.3
    while time.monotonic() < deadline:
        if path.exists():
            doc = json.loads(path.read_text())
            assert len(doc["rows"]) == 200
            seen += 1
    return seen


def _baseline_role(path: Path, n: int) -> int:
    return _save_baseline(path, n) if n < WORKERS else _read_baseline(path)


def test_baselines_saved_together_are_each_whole(tmp_path):
    for n in range(ROUNDS):
        path = tmp_path / f"round{n}" / "main.json"
        _save_baseline(path, 99)  # an earlier run's, replaced while being read
        results = race(_baseline_role, [(path, i) for i in range(WORKERS + 1)])
        assert all(status == "ok" for status, _ in results), results
        assert json.loads(path.read_text())["writer"] in range(WORKERS)
        assert leftovers(path.parent) == []


def _write_script(path: Path, n: int) -> int:
    compiler_cache._script(path, f"#!/bin/sh\n# writer {n}\n" + "exec true\n" * 2000)
    return n


def test_compiler_scripts_written_together_are_whole_and_executable(tmp_path):
    for n in range(ROUNDS):
        path = tmp_path / f"round{n}" / "bin" / "c++"
        results = race(_write_script, [(path, i) for i in range(WORKERS)])
        assert all(status == "ok" for status, _ in results), results
        text = path.read_text()
        assert text.count("exec true") == 2000 and text.startswith("#!/bin/sh\n# writer ")
        assert stat.S_IMODE(path.stat().st_mode) == 0o755
        assert leftovers(path.parent) == []
