"""opforge smoke under generated bad input (see contract.py).

The interpreter handed to --python is a stand-in that exits at once without a report, so a
case that passes validation ends in a failed probe (exit 1) within milliseconds instead of
installing anything; every refused case must exit 2 before that.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from contract import PATH_KINDS, check, examples, make_path
from hypothesis import given
from hypothesis import strategies as st
from test_contract_matrix import NASTY, mutated_matrix

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("contract-smoke")


@pytest.fixture(scope="module")
def python(work) -> Path:
    fake = work / "bin" / "python"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\nexit 3\n")
    fake.chmod(0o755)
    return fake


@pytest.fixture(autouse=True)
def _no_github(monkeypatch):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)


FLAGS = st.lists(st.sampled_from([
    ["--device-checks", "skip"], ["--device-checks", "maybe"], ["--expect-keys", "CPU,Meta"],
    ["--expect-keys", "cpu;rm"], ["--ops", "nms,roi_align"], ["--ops", "1x"],
    ["--internal-ops", "_b"], ["--package", "demo"], ["--namespace", "demo"],
    ["--package", "no-dash"], ["--namespace", "a.b"], ["--variant", "cpu"], ["--variant", "mps"],
    ["--torch-index", "pypi"], ["--torch", "torch==2.13.0"], ["--keep-env"],
    ["--requirement", "x"], ["--variant"], ["--bogus"]]), max_size=3)


@examples(80)
@given(data=mutated_matrix(), flags=FLAGS)
def test_smoke_on_mutated_matrix(work, python, data, flags):
    on_mutated_matrix("smoke", work, python, data, flags)


def on_mutated_matrix(command: str, work: Path, python: Path, data: bytes, flags) -> None:
    """``command --python PYTHON --file <data> FLAGS...`` exits 1 (the probe) or 2 (refused)."""
    folder = work / "inputs"
    folder.mkdir(exist_ok=True)
    (folder / "matrix.yaml").write_bytes(data)
    argv = [command, "--python", str(python), "--file", str(folder / "matrix.yaml")]
    for pair in flags:
        argv += pair
    check(argv, {1, 2}, watch=(folder,))


@examples(40)
@given(words=st.lists(st.one_of(NASTY, st.text(max_size=8),
                                st.sampled_from(["--wheel", "--python", "--json", "--junit",
                                                 "--env-dir", "--file", "--", "-"])),
                      max_size=5))
def test_smoke_arguments(work, python, words):
    # an accepted case may write a report named by a generated word (into the scratch cwd)
    check(["smoke", "--python", str(python), "--file", str(ROOT / "matrix.yaml"), *words],
          {1, 2}, watch=(work / "bin",), changes_allowed=True)


# a report destination that can be written: an existing file, a new file (folders made)
WRITABLE = ("empty-file", "missing", "dangling-symlink")


# Not here: a usable --wheel or --env-dir, which get a real environment and pip install
# (test_smoke_cli covers pip's refusal: exit 1, nothing left behind).
REAL_ENV = {("--wheel", "empty-file"), ("--env-dir", "missing"), ("--env-dir", "directory"),
            ("--env-dir", "dangling-symlink")}


@pytest.mark.parametrize("option, kind", [
    (option, kind) for option in ("--wheel", "--python", "--file", "--json", "--junit",
                                  "--env-dir")
    for kind in PATH_KINDS if (option, kind) not in REAL_ENV])
def test_smoke_path_of_every_kind(tmp_path, python, option, kind):
    path = make_path(kind, tmp_path, "x.whl" if option == "--wheel" else "target")
    if option in ("--wheel", "--env-dir"):
        argv = ["smoke", option, str(path), "--package", "demo", "--namespace", "demo"]
    else:
        argv = ["smoke", "--python", str(python), "--package", "demo", "--namespace", "demo",
                option, str(path)]
    fine = option in ("--json", "--junit") and kind in WRITABLE
    check(argv, {1} if fine else {2}, watch=(tmp_path,), changes_allowed=fine)


@pytest.mark.parametrize("kind", ["directory", "under-a-file", "unwritable", "symlink-loop"])
def test_smoke_step_summary_of_every_kind(tmp_path, python, monkeypatch, kind):
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(make_path(kind, tmp_path)))
    check(["smoke", "--python", str(python), "--package", "demo", "--namespace", "demo"], {2},
          watch=(tmp_path,))
    assert os.environ["GITHUB_STEP_SUMMARY"]
