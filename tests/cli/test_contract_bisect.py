"""opforge bisect under generated bad input: arguments, paths and saved states of every wrong
shape (see contract.py). The index is an empty folder, so no case gets as far as installing
a nightly; the saved state in the watched folder must come out byte for byte the same."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from contract import PATH_KINDS, check, examples, make_path
from hypothesis import given
from hypothesis import strategies as st
from test_contract_matrix import NASTY

STEP = {"nightly": {"date": "2024-06-01", "version": "2.5.0.dev20240601+cpu",
                    "filename": "torch-2.5.0.dev20240601+cpu-cp311-cp311-linux_x86_64.whl",
                    "url": "file:///nightlies/torch.whl", "sha256": None},
        "outcome": "good", "reason": "exit 0", "exit_code": 0, "attempts": 1,
        "duration_s": 1.5, "sha256": None, "git_version": None, "reused_env": False,
        "output_tail": ""}


def valid_state(index: Path, cwd: Path) -> dict:
    params = {"good": "2024-06-01", "bad": "2024-06-10", "variant": "cpu", "python": "3.11",
              "index": str(index), "command": ["true"], "wheel": None, "match": None,
              "regress": "failure", "retries": 0, "timeout": None, "timeout_skip": False,
              "cwd": str(cwd), "notes": []}
    return {"schema": 1, "params": params, "listed": [], "steps": [STEP], "result": None,
            "looked_up": [], "stopped": "interrupted"}


JSON = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(),
                              st.text(max_size=12), NASTY),
                    lambda c: st.one_of(st.lists(c, max_size=3),
                                        st.dictionaries(st.text(max_size=8), c, max_size=3)),
                    max_leaves=10)


@st.composite
def damaged_state(draw, base: dict) -> bytes:
    """The valid state with parts replaced, removed or retyped; or not JSON at all."""
    how = draw(st.sampled_from(["replace", "replace", "replace", "delete", "random", "bytes"]))
    if how == "random":
        return json.dumps(draw(JSON)).encode()
    if how == "bytes":
        text = json.dumps(base).encode()
        at = draw(st.integers(0, len(text) - 1))
        return text[:at] + draw(st.binary(max_size=4)) + text[at + 1:]
    state = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        node, key = state, None
        while True:  # walk down to a random node
            keys = list(node) if isinstance(node, dict) else list(range(len(node))) \
                if isinstance(node, list) else []
            if not keys:
                break
            key = draw(st.sampled_from(keys))
            child = node[key]
            if not isinstance(child, (dict, list)) or not child or draw(st.booleans()):
                break
            node = child
        if key is None:
            continue
        if how == "delete" and isinstance(node, dict):
            del node[key]
        else:
            node[key] = draw(JSON)
    return json.dumps(state).encode()


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("contract-bisect")
    (root / "empty-index").mkdir()
    (root / "saved").mkdir()
    return root


def _run(work: Path, args: list[str], *, resume: bool = False):
    argv = ["bisect", "--state", str(work / "saved" / "state.json"), *args]
    if not resume and "--index" not in args:
        argv += ["--index", str(work / "empty-index")]
    if resume:
        argv.append("--resume")
    return check([*argv, "--", "true"] if "--" not in args else argv, {2},
                 watch=(work / "saved",))


@examples(100)
@given(data=st.data())
def test_resume_on_a_damaged_state(work, data):
    state = data.draw(damaged_state(valid_state(work / "empty-index", work)))
    (work / "saved" / "state.json").write_bytes(state)
    _run(work, [], resume=True)
    _run(work, ["--good", "2024-06-01", "--bad", "2024-06-10"])  # a new bisect keeps it too


DATES = st.one_of(st.sampled_from(["2024-06-01", "2024-06-10", "20240605", "2999-01-01",
                                   "2024-02-30", "latest", "2.5.0.dev20240601+cpu",
                                   "0000-00-00", "report.json", "/dev/null", ""]),
                  st.dates().map(str), NASTY, st.text(max_size=10))
NUMBERS = st.one_of(st.sampled_from(["nan", "inf", "-inf", "0", "-1", "1e309", "0x10", "", "1"]),
                    st.floats().map(repr), st.integers().map(str), st.text(max_size=5))


@examples(120)
@given(good=st.one_of(st.none(), DATES), bad=st.one_of(st.none(), DATES),
       timeout=st.one_of(st.none(), NUMBERS), retries=st.one_of(st.none(), NUMBERS),
       extra=st.lists(st.sampled_from([
           ["--match", "("], ["--match", "does not exist"], ["--match", ""],
           ["--variant", "CPU"], ["--variant", "cpu\n"], ["--variant", "cu130"],
           ["--regress", "success"], ["--regress", "sideways"], ["--timeout-skip"],
           ["--restart"], ["--json"], ["--markdown", "-"], ["--json", "-", "--markdown", "-"],
           ["--python", "3.11"], ["--python", "9.99"], ["--python", "/nonexistent/python"],
           ["--wheel", "nope.whl"], ["--pytorch-repo", "/nonexistent"], ["--bogus"],
           ["--", "/nonexistent/command"], ["--"]]), max_size=3))
def test_bisect_arguments(work, good, bad, timeout, retries, extra):
    (work / "saved" / "state.json").write_text(json.dumps(valid_state(work / "empty-index",
                                                                      work)))
    args: list[str] = []
    for option, value in (("--good", good), ("--bad", bad), ("--timeout", timeout),
                          ("--retries", retries)):
        if value is not None:
            args += [option, value]
    for pair in extra:
        args += pair
    _run(work, args)


# what each option is: something read, or a destination written
READ = ("--index", "--wheel", "--python", "--pytorch-repo", "--good")
WRITTEN = ("--state", "--log", "--json", "--markdown")


@pytest.mark.parametrize("kind", PATH_KINDS)
@pytest.mark.parametrize("option", READ + WRITTEN)
def test_bisect_path_of_every_kind(work, tmp_path, option, kind):
    saved = work / "saved" / "state.json"
    saved.write_text(json.dumps(valid_state(work / "empty-index", work)))
    name = {"--wheel": "x.whl", "--good": "report.json"}.get(option, "target")
    path = make_path(kind, tmp_path, name)
    args = [option, str(path)]
    if option == "--state":
        args = ["--index", str(work / "empty-index")] + args
    argv = ["bisect", *args]
    if option != "--state":
        argv = ["bisect", "--state", str(saved), *args, "--index", str(work / "empty-index")] \
            if option != "--index" else ["bisect", "--state", str(saved), *args]
    check([*argv, "--restart", "--", "true"], {2}, watch=(work / "saved", tmp_path))
