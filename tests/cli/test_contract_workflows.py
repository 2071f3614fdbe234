"""opforge workflows check under generated bad input: broken workflow files, broken matrices,
paths of every kind (see contract.py). The check only reads: nothing may change, ever."""

from __future__ import annotations

from pathlib import Path

import pytest
from contract import PATH_KINDS, check, examples, make_path
from hypothesis import given
from hypothesis import strategies as st
from test_contract_matrix import NASTY, VALID, mutated_matrix

from opforge.init import WorkflowsPin, render_workflows

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = (ROOT / ".github" / "workflows" / "reusable-build-smoke.yml").read_text()
WORKFLOWS = {**render_workflows(VALID, "matrix.yaml", WorkflowsPin("a" * 40, "opforge==0.1.0", "")),
             "pipeline.yml": PIPELINE}   # a repository's own pipeline, like opforge's


def _repo(root: Path, workflows: dict[str, bytes], matrix: bytes = VALID.encode()) -> Path:
    import shutil

    shutil.rmtree(root, ignore_errors=True)
    (root / ".github" / "workflows").mkdir(parents=True)
    (root / "matrix.yaml").write_bytes(matrix)
    for name, data in workflows.items():
        (root / ".github" / "workflows" / name).write_bytes(data)
    return root


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("contract-workflows")


def test_the_unbroken_repository_passes(work):
    root = _repo(work / "repo", {k: v.encode() for k, v in WORKFLOWS.items()})
    result = check(["workflows", "check", "--root", str(root)], {0}, watch=(root,))
    assert "ok (4 workflow(s))" in result.err


@st.composite
def mutated_workflow(draw) -> tuple[str, bytes]:
    name = draw(st.sampled_from(sorted(WORKFLOWS)))
    lines = WORKFLOWS[name].splitlines(keepends=True)
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(lines) - 1))
        edit = draw(st.sampled_from(["value", "value", "drop", "double", "cut", "indent"]))
        line = lines[i]
        if edit == "value" and ":" in line:
            lines[i] = f"{line.partition(':')[0]}: {draw(NASTY)}\n"
        elif edit == "drop":
            del lines[i]
        elif edit == "double":
            lines.insert(i, line)
        elif edit == "cut":
            lines[i] = line[:draw(st.integers(0, max(0, len(line) - 1)))] + "\n"
        else:
            lines[i] = " " * draw(st.integers(1, 3)) + line
        if not lines:
            break
    data = "".join(lines).encode("utf-8")
    if draw(st.integers(0, 3)) == 0:
        at = draw(st.integers(0, max(0, len(data) - 1)))
        data = data[:at] + draw(st.binary(max_size=3)) + data[at + 1:]
    return name, data


@examples(20)
@given(broken=mutated_workflow())
def test_broken_workflows_are_problems_never_crashes(work, broken):
    name, data = broken
    files = {k: v.encode() for k, v in WORKFLOWS.items()}
    files[name] = data
    root = _repo(work / "repo", files)
    check(["workflows", "check", "--root", str(root)], {0, 1}, watch=(root,))


@examples(8)
@given(matrix=mutated_matrix())
def test_a_broken_matrix_is_exit_2_or_a_problem(work, matrix):
    root = _repo(work / "repo", {k: v.encode() for k, v in WORKFLOWS.items()}, matrix)
    check(["workflows", "check", "--root", str(root)], {0, 1, 2}, watch=(root,))


@pytest.mark.parametrize("kind", PATH_KINDS)
def test_root_and_file_of_every_kind(tmp_path, kind):
    path = make_path(kind, tmp_path)
    check(["workflows", "check", "--root", str(path)], {2}, watch=(tmp_path,))
    root = _repo(tmp_path / "repo", {"ci.yml": WORKFLOWS["opforge-ci.yml"].encode()})
    check(["workflows", "check", "--root", str(root), "--file", str(path)], {2},
          watch=(tmp_path,))


@pytest.mark.parametrize("kind", ["fifo", "directory", "symlink-loop", "dangling-symlink"])
def test_a_workflow_file_that_is_not_a_file(tmp_path, kind):
    root = _repo(tmp_path / "repo", {})
    make_path(kind, root / ".github" / "workflows", "ci.yml")
    check(["workflows", "check", "--root", str(root)], {0, 1}, watch=(root,))


@pytest.mark.parametrize("argv", [["workflows"], ["workflows", "fix"],
                                  ["workflows", "check", "--bogus"],
                                  ["workflows", "check", "--root"]])
def test_bad_arguments(argv):
    check(argv, {2})
