"""`opforge cache list|prune` and the size limit: least recently used environments go first."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import opforge
from opforge.bisect.cache import CachedEnv, choose_evictions, parse_size


def _env(root: Path, name: str, size: int, age_days: float, torch: str | None = "2.4.0"):
    path = root / "envs" / name
    path.mkdir(parents=True)
    (path / "blob").write_bytes(b"x" * size)
    if torch:
        (path / "opforge-env.json").write_text(json.dumps({"torch": {"version": torch}}))
    used = path / ".last-used"
    used.write_text("")
    stamp = time.time() - age_days * 86400
    os.utime(used, (stamp, stamp))


def _cache(root: Path, *args: str) -> subprocess.CompletedProcess:
    src = str(Path(opforge.__file__).resolve().parent.parent)
    env = {**os.environ, "OPFORGE_CACHE_DIR": str(root), "PYTHONPATH": src}
    return subprocess.run([sys.executable, "-m", "opforge", "cache", *args], capture_output=True,
                          text=True, env=env)


def test_eviction_takes_the_least_recently_used_first_and_keeps_those_in_use():
    envs = [CachedEnv(Path(n), "2.4", 100, t) for n, t in (("a", 3), ("b", 1), ("c", 2))]
    assert [e.path.name for e in choose_evictions(envs, 200)] == ["b"]
    assert [e.path.name for e in choose_evictions(envs, 100, keep=[Path("b")])] == ["c", "a"]
    assert choose_evictions(envs, 300) == []


@pytest.mark.parametrize("text, size", [("40G", 40 << 30), ("500M", 500 << 20), ("1.5k", 1536),
                                        ("123", 123), ("2GiB", 2 << 30)])
def test_sizes_parse(text, size):
    assert parse_size(text, "--max-size") == size


def test_list_and_prune_by_size(tmp_path):
    _env(tmp_path, "torch-old", 40000, 10)
    _env(tmp_path, "torch-mid", 40000, 5)
    _env(tmp_path, "torch-new", 40000, 1)
    listed = _cache(tmp_path, "list", "--json")
    assert listed.returncode == 0, listed.stderr
    names = [Path(e["path"]).name for e in json.loads(listed.stdout)["environments"]]
    assert names == ["torch-old", "torch-mid", "torch-new"]  # least recently used first
    dry = _cache(tmp_path, "prune", "--max-size", "90K", "--dry-run")
    assert dry.returncode == 0 and "would remove torch-old" in dry.stdout
    assert (tmp_path / "envs" / "torch-old").exists()
    pruned = _cache(tmp_path, "prune", "--max-size", "90K")
    assert pruned.returncode == 0, pruned.stderr
    assert sorted(p.name for p in (tmp_path / "envs").iterdir()) == ["torch-mid", "torch-new"]
    older = _cache(tmp_path, "prune", "--older-than", "3")
    assert sorted(p.name for p in (tmp_path / "envs").iterdir()) == ["torch-new"], older.stdout


@pytest.mark.parametrize("argv, message", [
    (("prune",), "give exactly one of --max-size SIZE, --older-than DAYS, --all"),
    (("prune", "--max-size", "lots"), "--max-size 'lots': expected a size like 40G"),
    (("prune", "--all", "--older-than", "1"), "give exactly one of"),
    (("prune", "--older-than", "-1"), "--older-than -1: must be 0 or more days"),
    (("shrink",), "invalid choice: 'shrink'"),
])
def test_bad_arguments_remove_nothing_and_exit_2(tmp_path, argv, message):
    _env(tmp_path, "torch-old", 1000, 10)
    run = _cache(tmp_path, *argv)
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("opforge cache: error: ") and message in lines[0]
    assert (tmp_path / "envs" / "torch-old").exists()


@pytest.mark.slow
def test_a_bisect_over_its_size_limit_evicts_other_runs_environments(fresh_bisector):
    fresh_bisector.env["PROBE_MODE"] = "bad_from:20240602"
    first = fresh_bisector("--good", "2024-06-01", "--bad", "2024-06-03", "--no-prefetch")
    assert first.returncode == 0, first.stderr
    fresh_bisector.env.update(PROBE_MODE="bad_from:20240610", OPFORGE_CACHE_MAX_SIZE="1")
    second = fresh_bisector("--good", "2024-06-08", "--bad", "2024-06-11", "--no-prefetch",
                            "--restart")
    assert second.returncode == 0, second.stderr
    left = sorted(p.name for p in (fresh_bisector.cache / "envs").iterdir())
    # the environments this bisect used stay; the first bisect's went, oldest first
    assert all(any(day in name for day in ("20240608", "20240610", "20240611")) for name in left)
    assert len(left) == 3
