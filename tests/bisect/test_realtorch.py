"""Bisect against real torch releases from the index pip is configured with (GBs each).

Runs only in `nox -s realtorch`. The behaviour bisected is a real difference between releases:
the module ``torch.accelerator.graphs`` ships from torch 2.12.0 on (the wheels of 2.10.0 and
2.11.0 have no torch/accelerator/graphs.py); the header ``torch/headeronly/core/enum_tag.h``
likewise first ships in 2.12.0, which makes an extension that includes it build from 2.12.0 on.
Environments are kept in build/realtorch-bisect (uv hard-links them from its cache), so a
second run downloads nothing; the machine's torch<=2.14.1 pip constraint is lifted for them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import opforge

pytestmark = [pytest.mark.realtorch, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "adopt"))
from third_party import write_hostguess  # noqa: E402

CACHE = ROOT / "build" / "realtorch-bisect"
SRC = str(Path(opforge.__file__).resolve().parent.parent)
PROBE = ["python", "-c", "import torch.accelerator.graphs"]


def opforge_cli(*args: str, cwd: Path, timeout: float = 3000):
    env = {**os.environ, "PYTHONPATH": SRC, "PIP_CONSTRAINT": "/dev/null",
           "OPFORGE_CACHE_DIR": str(CACHE), "OPFORGE_TORCH_INDEX": "pypi",
           "MAX_JOBS": os.environ.get("MAX_JOBS", "1"), "COLUMNS": "200"}
    env.pop("OPFORGE_MATRIX", None)
    env.pop("GITHUB_STEP_SUMMARY", None)
    t0 = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "opforge", *args], cwd=cwd, env=env,
                         capture_output=True, text=True, timeout=timeout)
    return run, time.monotonic() - t0


def probes(log: Path) -> list[dict]:
    return [e for e in map(json.loads, log.read_text().splitlines()) if e["event"] == "probe"]


def test_real_releases_bisect_to_the_one_that_added_torch_accelerator_graphs(tmp_path):
    state = tmp_path / "state.json"
    args = ("bisect", "--good", "2.10.0", "--bad", "2.12.0", "--release-index", "pypi",
            "--releases-only", "--regress", "success", "--state", str(state), "--json", "--",
            *PROBE)
    first, first_s = opforge_cli(*args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-4000:]
    data = json.loads(first.stdout)
    assert (data["last_good"]["label"], data["first_bad"]["label"]) == ("2.11.0", "2.12.0")
    assert data["probes"] == 3
    assert data["first_bad"]["environment"]["torch"]["version"].startswith("2.12.0")
    assert any(p.startswith("torch==2.11.0") for p in
               data["last_good"]["environment"]["packages"])
    assert "pip install torch==2.12.0" in data["reproduce"]
    log = state.with_suffix(".log.jsonl")
    made = [e for e in probes(log) if not e["reused_env"]]

    second, second_s = opforge_cli(*args, cwd=tmp_path)
    assert second.returncode == 0, second.stderr[-4000:]
    again = probes(log)[3:]
    assert len(again) == 3 and all(e["reused_env"] and e["actions"] == [] for e in again)
    assert json.loads(second.stdout)["first_bad"] == data["first_bad"]
    print(f"\nreal release bisect: 3 probes; first run {first_s:.0f} s ({len(made)} "
          f"environments made), second run {second_s:.0f} s (all reused)")


def _hostguess(root: Path, include_new_header: bool) -> Path:
    project, recipes = write_hostguess(root)
    if include_new_header:
        ops = project / "csrc" / "ops.cpp"
        ops.write_text("#include <torch/headeronly/core/enum_tag.h>\n" + ops.read_text())
    run, _ = opforge_cli("init", "--torch", "2.12.0", "--workflows-ref", "0" * 40, cwd=project)
    assert run.returncode == 0, run.stderr
    (project / "opforge_recipes.py").write_text(textwrap.dedent(recipes).lstrip())
    git = ["git", "-C", str(project), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "hostguess"], check=True)
    return project


def test_build_mode_builds_a_third_party_extension_against_real_releases(tmp_path):
    # the extension includes a header that first ships in 2.12.0: it builds from there on
    project = _hostguess(tmp_path / "hostguess", include_new_header=True)
    state = tmp_path / "state.json"
    run, seconds = opforge_cli("bisect", "--good", "2.10.0", "--bad", "2.12.0",
                               "--release-index", "pypi", "--releases-only", "--regress",
                               "success", "--state", str(state), "--json", cwd=project)
    assert run.returncode == 0, run.stderr[-4000:]
    data = json.loads(run.stdout)
    assert (data["last_good"]["label"], data["first_bad"]["label"]) == ("2.11.0", "2.12.0")
    steps = {e["date"]: e for e in probes(state.with_suffix(".log.jsonl"))}
    assert steps["2.11.0"]["reason"].startswith(
        "the extension does not build against torch 2.11.0: ops.cpp:1:10: fatal error: "
        "torch/headeronly/core/enum_tag.h: No such file or directory")
    assert steps["2.12.0"]["reason"] == "exit 0"  # built, then the smoke test passed

    # without that header it builds and passes the smoke test against 2.11.0 and 2.12.0 alike
    plain = _hostguess(tmp_path / "plain", include_new_header=False)
    state = tmp_path / "plain-state.json"
    run, plain_s = opforge_cli("bisect", "--good", "2.11.0", "--bad", "2.12.0",
                               "--release-index", "pypi", "--releases-only", "--regress",
                               "success", "--state", str(state), cwd=plain)
    assert run.returncode == 1
    assert "the good release 2.11.0 already passes the test (exit 0)" in run.stderr
    built = probes(state.with_suffix(".log.jsonl"))
    assert [(e["date"], e["reason"]) for e in built] == [("2.12.0", "exit 0"),
                                                         ("2.11.0", "exit 0")]
    wheels = sorted(p.name for p in (CACHE / "builds").glob("*/*.whl"))
    assert len(wheels) >= 3, wheels
    print(f"\nbuild mode: header bisect {seconds:.0f} s, plain 2.11.0/2.12.0 {plain_s:.0f} s")
