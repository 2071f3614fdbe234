"""Validate before acting (issue 29): hostile saved states, verdicts, baselines, YAML,
environment variables, wheels and signals. Each refused input is one line and a documented
exit code, with nothing written; a wheel that is not what it claims fails inspect (exit 1)."""

from __future__ import annotations

import _json
import base64
import copy
import hashlib
import json
import os
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from contract import check, examples
from hypothesis import given
from hypothesis import strategies as st
from test_races import DAYS, PARAMS, nightly, step

from opforge import yamlsafe
from opforge.bench.baselines import read_baseline
from opforge.cli import environment as envvars
from opforge.errors import UsageError

MATRIX = Path(__file__).resolve().parents[2] / "matrix.yaml"


def _state(tmp: Path, **params) -> dict:
    (tmp / "index").mkdir(exist_ok=True)
    return {"schema": 1, "params": {**PARAMS, "index": str(tmp / "index"), "cwd": str(tmp),
                                    **params},
            "listed": [nightly(d) for d in DAYS], "steps": [step(DAYS[0])], "result": None,
            "looked_up": [], "stopped": "interrupted"}


# -- a resumed state is range-checked -------------------------------------------------------

BAD_PARAMS = [("timeout", -5), ("timeout", 0), ("timeout", 1e999), ("variant", "../../etc"),
              ("variant", "cpu/../../x"), ("variant", ""), ("retries", -1), ("retries", 10**12),
              ("regress", "sideways"), ("good", "2024-02-30"), ("good", "yesterday"),
              ("match", "("), ("slower_than", 0.5), ("timeout_skip", True), ("python", ""),
              ("cwd", "a\x00b"), ("command", ["a\x00b"]), ("companions", ["../x"])]


@pytest.mark.parametrize("name, value", BAD_PARAMS, ids=[f"{n}={v!r}"[:40] for n, v in BAD_PARAMS])
def test_a_resumed_state_out_of_range_is_refused(tmp_path, name, value):
    saved = tmp_path / "saved"
    saved.mkdir()
    text = json.dumps(_state(tmp_path, **{name: value})).replace("Infinity", "1e999")
    (saved / "state.json").write_text(text)
    result = check(["bisect", "--resume", "--state", str(saved / "state.json")], {2},
                   watch=(saved,))
    assert f"params.{name}" in result.err, result.err


def test_verdicts_with_a_step_this_bisect_never_listed_are_refused(tmp_path):
    saved = tmp_path / "saved"
    saved.mkdir()
    plan = _state(tmp_path)
    plan["stopped"] = None
    (saved / "plan.json").write_text(json.dumps(plan))
    probe = copy.deepcopy(plan)
    probe["steps"] = [step("2030-01-01")]
    (saved / "probe.json").write_text(json.dumps(probe))
    result = check(["bisect", "--plan", "2", "--state", str(saved / "plan.json"),
                    "--verdicts", str(saved / "probe.json"), "--", "true"], {2}, watch=(saved,))
    assert "2030-01-01" in result.err and "not a candidate" in result.err


@pytest.mark.parametrize("argv", [
    ["bisect", "--state", ".", "--good", DAYS[0], "--bad", DAYS[1], "--", "true"],
    ["bisect", "--state", "..", "--good", DAYS[0], "--bad", DAYS[1], "--", "true"],
    ["cache", "prune", "--max-size", "9" * 400],
    ["cache", "prune", "--max-size", "9" * 30 + "T"],
])
def test_bad_paths_and_sizes_are_one_line(argv, tmp_path, monkeypatch):
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path / "cache"))
    check(argv, {2}, watch=(tmp_path,))


@pytest.mark.parametrize("output", ["missing-folder/out", "a-directory", "a-file/out"])
def test_plan_with_an_unwritable_github_output_writes_no_state(tmp_path, monkeypatch, output):
    (tmp_path / "a-directory").mkdir()
    (tmp_path / "a-file").write_text("")
    (tmp_path / "index").mkdir()
    monkeypatch.setenv("GITHUB_OUTPUT", str(tmp_path / output))
    check(["bisect", "--plan", "2", "--state", str(tmp_path / "state.json"), "--index",
           str(tmp_path / "index"), "--good", DAYS[0], "--bad", DAYS[1], "--", "true"], {2},
          watch=(tmp_path,))
    assert not (tmp_path / "state.json").exists()


# -- environment variables ------------------------------------------------------------------

ENV_TEXT = st.one_of(st.text(max_size=12), st.sampled_from(
    ["uv", "pip", "UV", "conda", "pypi", "https://x.org/whl", "file:///nonexistent", "off", "on",
     "0", "1", "40G", "-1", "1e999", "9" * 400, "/dev/null", "stable", "nightly", "bogus",
     "http://", "ftp://x", "pypi\n"]))


@examples(80)
@given(name=st.sampled_from(sorted(envvars.CHECKS)), value=ENV_TEXT)
def test_environment_variables_are_checked_before_anything_runs(name, value):
    if "\x00" in value:
        return  # no environment can hold it
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        result = check(["matrix", "--file", str(MATRIX)], {0, 2})
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old
    if result.code == 2:
        assert name in result.err, result.err
    elif value and name == "OPFORGE_INSTALLER":
        assert value in ("uv", "pip")
    elif value and name == "OPFORGE_COMPILER_CACHE":
        assert value.strip().lower() in {"0", "off", "false", "no", "1", "on", "true", "yes"}


# -- YAML: one guarded loader ---------------------------------------------------------------


def _alias_bomb(levels: int, width: int) -> str:
    lines = [f"a0: &a0 [{', '.join(['x'] * width)}]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]")
    return "\n".join(lines) + f"\njobs:\n  x:\n    steps: *a{levels - 1}\n"


@examples(40)
@given(kind=st.sampled_from(["alias", "flow", "block", "mixed"]), n=st.integers(1, 2000),
       width=st.integers(2, 12))
def test_yaml_bombs_are_refused_quickly_never_a_crash(kind, n, width):
    if kind == "alias":
        text = _alias_bomb(min(n, 12), width)
    elif kind == "flow":
        text = "a: " + "[" * n + "]" * n + "\n"
    elif kind == "block":
        text = "".join(f"{'  ' * i}k{i}:\n" for i in range(min(n, 300))) + "  " * min(n, 300) \
            + "v\n"
    else:
        text = "a: " + "{x: [" * n + "1" + "]}" * n + "\n"
    try:
        doc = yamlsafe.load(text, "w.yml")
    except UsageError as exc:
        assert str(exc).startswith("w.yml:") and "\n" not in str(exc)
        return
    # what keeps a bomb quick is that nothing past the limits is ever built (a bound on the
    # work, not a clock: no timed assertion)
    nodes, depth = _size(doc)
    assert nodes <= yamlsafe.MAX_YAML_NODES and depth <= yamlsafe.MAX_DEPTH, (nodes, depth)


def _size(doc) -> tuple[int, int]:
    """(nodes, depth) of a loaded document, aliases counted as expanded (stops past the cap)."""
    nodes, depth, stack = 0, 0, [(doc, 1)]
    while stack and nodes <= yamlsafe.MAX_YAML_NODES:
        item, level = stack.pop()
        nodes, depth = nodes + 1, max(depth, level)
        children = item.values() if isinstance(item, dict) else item \
            if isinstance(item, list) else ()
        stack.extend((child, level + 1) for child in children)
    return nodes, depth


def test_workflows_check_names_a_bomb_as_a_problem(tmp_path):
    folder = tmp_path / ".github" / "workflows"
    folder.mkdir(parents=True)
    (folder / "bomb.yml").write_text(_alias_bomb(9, 9))
    (folder / "deep.yml").write_text("jobs: " + "[" * 1000 + "]" * 1000 + "\n")
    (tmp_path / "matrix.yaml").write_text(MATRIX.read_text())
    os.symlink(MATRIX.parent / "extension", tmp_path / "extension")
    result = check(["workflows", "check", "--root", str(tmp_path)], {1, 2})
    assert "bomb.yml:" in result.out + result.err and "deep.yml:" in result.out + result.err


# -- bench baselines ------------------------------------------------------------------------

ROW = {"op": "nms", "workload": "w", "direction": "forward", "device": "cpu",
       "reference": "torchvision", "speedup": 1.2, "ours_s": 0.002, "best_s": 0.0019,
       "noise": 0.05}
VALUES = st.one_of(st.sampled_from(["1e999", "-1e999", "-1", "0", '"fast"', "[1]", "{}",
                                    "true", "null", "1" + "0" * 400, "1e-400"]),
                   st.floats(allow_nan=False, allow_infinity=False).map(repr))


@examples(80)
@given(field=st.sampled_from(sorted(ROW)), raw=VALUES)
def test_a_baseline_holding_nonsense_is_one_line_never_a_crash(tmp_path_factory, field, raw):
    path = tmp_path_factory.mktemp("baseline") / "b.json"
    row = json.dumps({**ROW, field: "@@"}).replace('"@@"', raw)
    path.write_text('{"kind": "bench", "rows": [' + row + "]}")
    try:
        rows, _ = read_baseline(path, "--against b.json")
    except UsageError as exc:
        assert str(exc).startswith("--against b.json") and "\n" not in str(exc)
        return
    for kept in rows.values():
        for key in ("speedup", "ours_s", "best_s", "noise"):
            value = kept.get(key)
            assert value is None or (isinstance(value, (int, float)) and value < float("inf"))


# -- inspect: the archive itself ------------------------------------------------------------

LIB = Path(_json.__file__).read_bytes()  # a real ELF shared library of this interpreter


def _wheel(tmp: Path, members: dict[str, bytes], *, links: tuple[str, ...] = (),
           record_edit=None) -> Path:
    info = "demo-1.0.dist-info"
    members = {f"{info}/METADATA": b"Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n",
               f"{info}/WHEEL": b"Wheel-Version: 1.0\nTag: py3-none-any\n", **members}
    lines = {name: f"sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}"
             for name, data in members.items()}
    if record_edit:
        record_edit(lines)
    record = "".join(f"{n},{v}\n" for n, v in lines.items()) + f"{info}/RECORD,,\n"
    path = tmp / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            item = zipfile.ZipInfo(name)
            if name in links:
                item.external_attr = (stat.S_IFLNK | 0o777) << 16
            zf.writestr(item, data)
        zf.writestr(f"{info}/RECORD", record)
    return path


HOSTILE_WHEELS = {
    "outside-dotdot": (dict(members={"../../x.so": LIB}), "outside the install folder"),
    "outside-absolute": (dict(members={"/tmp/x.so": LIB}), "an absolute path"),
    "symlink-member": (dict(members={"demo/_C.so": b"/etc/passwd"}, links=("demo/_C.so",)),
                       "a symbolic link"),
    "not-elf": (dict(members={"demo/_C.so": b"#!/bin/sh\necho hi\n"}), "not a library"),
    "truncated-elf": (dict(members={"demo/_C.so": LIB[:len(LIB) // 2]}), "truncated"),
    "elf-header-only": (dict(members={"demo/_C.so": LIB[:64]}), "truncated"),
    "record-wrong-hash": (dict(members={"demo/_C.so": LIB}, record_edit=lambda r: r.update(
        {"demo/_C.so": "sha256=" + "A" * 43 + f",{len(LIB)}"})), "does not match"),
    "record-missing-entry": (dict(members={"demo/_C.so": LIB}, record_edit=lambda r: r.pop(
        "demo/_C.so")), "does not list demo/_C.so"),
    "record-extra-entry": (dict(members={"demo/_C.so": LIB}, record_edit=lambda r: r.update(
        {"demo/gone.py": "sha256=x,1"})), "which the wheel does not hold"),
    "record-wrong-size": (dict(members={"demo/_C.so": LIB}, record_edit=lambda r: r.update(
        {"demo/_C.so": r["demo/_C.so"].rsplit(",", 1)[0] + ",7"})), "RECORD says 7"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_WHEELS))
def test_inspect_fails_a_wheel_that_is_not_what_it_claims(tmp_path, case):
    kwargs, words = HOSTILE_WHEELS[case]
    wheel = _wheel(tmp_path, **kwargs)
    result = check(["inspect", str(wheel), "--json"], {1}, watch=(tmp_path,))
    problems = json.loads(result.out)["problems"]
    assert any(words in p for p in problems), problems


def test_inspect_passes_the_same_wheel_well_formed(tmp_path):
    check(["inspect", str(_wheel(tmp_path, {"demo/_C.so": LIB}))], {0}, watch=(tmp_path,))


# -- signals: a second Ctrl-C during the first one's cleanup -------------------------------

CLEANUP = """
import os, signal, sys, time
from opforge.cli import _stop_signals_raise
from opforge.errors import Interrupted
with _stop_signals_raise():
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(10)
    except Interrupted:
        for _ in range(int(sys.argv[1])):  # more Ctrl-C while cleaning up
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
        print("cleanup finished", flush=True)
"""


@pytest.mark.parametrize("more, finished, code", [(1, True, 0), (2, False, 130)])
def test_a_second_ctrl_c_lets_the_cleanup_finish_a_third_stops_at_once(more, finished, code):
    done = subprocess.run([sys.executable, "-c", CLEANUP, str(more)], capture_output=True,
                          text=True, timeout=30)
    assert "Traceback" not in done.stderr, done.stderr
    assert ("cleanup finished" in done.stdout) == finished
    assert done.returncode == code
    assert "cleaning up after the interrupt" in done.stderr


def test_compat_torch_empty_is_refused_not_a_plain_smoke(tmp_path):
    check(["smoke", "--wheel", str(tmp_path / "x-1.0-py3-none-any.whl"), "--compat-torch", ""],
          {2}, watch=(tmp_path,))
