"""opforge bench under generated bad input (see contract.py).

As for smoke, the interpreter handed to --python is a stand-in that exits at once without a
report: a case that passes validation ends in a failed benchmark (exit 1) in milliseconds;
every refused case must exit 2 before anything runs.
"""

from __future__ import annotations

import pytest
import test_contract_smoke as smoke_contract
from contract import PATH_KINDS, check, examples, make_path
from hypothesis import given
from hypothesis import strategies as st
from test_contract_matrix import NASTY, mutated_matrix

# the smoke contract's fixtures: a scratch folder, a stand-in interpreter, no GitHub variables
ROOT = smoke_contract.ROOT
work, python, _no_github = smoke_contract.work, smoke_contract.python, smoke_contract._no_github

FLAGS = st.lists(st.sampled_from([
    ["--budget", "0.1"], ["--budget", "0"], ["--budget", "-1"], ["--budget", "nan"],
    ["--budget", "fast"], ["--min-speedup", "0.5"], ["--min-speedup", "0"],
    ["--min-speedup", "inf"], ["--reference", "cpu"], ["--reference", "torchvision"],
    ["--ops", "nms,roi_align"], ["--ops", "1x"], ["--workloads", "small"], ["--forward-only"],
    ["--with", "torchvision"], ["--with", "not a requirement!"], ["--variant", "cpu"],
    ["--variant", "cu999"], ["--device-checks", "maybe"], ["--against", "never-saved"],
    ["--regression", "0.5"], ["--save", "a/b"], ["--bogus"]]), max_size=3)


@examples(40)
@given(data=mutated_matrix(), flags=FLAGS)
def test_bench_on_mutated_matrix(work, python, data, flags):
    smoke_contract.on_mutated_matrix("bench", work, python, data, flags)


@examples(30)
@given(words=st.lists(st.one_of(NASTY, st.text(max_size=8),
                                st.sampled_from(["--budget", "--min-speedup", "--json",
                                                 "--summary", "--with", "--recipes", "--",
                                                 "-"])),
                      max_size=5))
def test_bench_arguments(work, python, words):
    check(["bench", "--python", str(python), "--file", str(ROOT / "matrix.yaml"), *words],
          {1, 2}, watch=(work / "bin",), changes_allowed=True)


WRITABLE = ("empty-file", "missing", "dangling-symlink")


@pytest.mark.parametrize("option, kind", [
    (option, kind) for option in ("--json", "--summary", "--recipes") for kind in PATH_KINDS])
def test_bench_path_of_every_kind(tmp_path, python, option, kind):
    path = make_path(kind, tmp_path, "target")
    argv = ["bench", "--python", str(python), "--package", "demo", "--namespace", "demo",
            option, str(path)]
    if option != "--recipes":
        argv += ["--recipes", str(ROOT / "extension" / "recipes.py")]
    # an empty recipes file is read in the environment under test: the benchmark fails there
    fine = kind in WRITABLE if option != "--recipes" else kind == "empty-file"
    check(argv, {1} if fine else {2}, watch=(tmp_path,), changes_allowed=fine)


@pytest.mark.parametrize("argv, message", [
    (["--budget", "0"], "a positive number of seconds"),
    (["--min-speedup", "-2"], "a positive, finite ratio"),
    (["--with", "torch vision"], "not a requirement"),
    (["--save", "../escape"], "a baseline name is letters"),
    (["--regression", "1"], "a factor greater than 1"),
    (["--against", "never-saved"], "no such baseline"),
    (["--against", "missing.json"], "--against missing.json"),
    (["--baseline", ""], "--baseline '': name a baseline"),
    (["--baseline", "a b"], "a baseline name is letters"),
    (["--baseline", "b", "--against", "c"], "both name a baseline: give one"),
    (["--baseline", "NOT_A_BENCH"], "not an `opforge bench` JSON document"),
])
def test_bench_bad_numbers_and_requirements_say_so(python, capsys, monkeypatch, tmp_path,
                                                   argv, message):
    from opforge.cli import main

    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path))
    if "NOT_A_BENCH" in argv:  # a file that exists and is not a bench run
        (tmp_path / "smoke.json").write_text('{"kind": "smoke"}')
        argv = [str(tmp_path / "smoke.json") if a == "NOT_A_BENCH" else a for a in argv]
    assert main(["bench", "--python", str(python), "--package", "demo", "--namespace", "demo",
                 "--recipes", str(ROOT / "extension" / "recipes.py"), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("opforge bench: error: ") and message in err[0]


def test_bench_without_recipes_says_what_to_name(python, capsys):
    from opforge.cli import main

    assert main(["bench", "--python", str(python), "--package", "demo",
                 "--namespace", "demo"]) == 2
    assert "no recipes file" in capsys.readouterr().err
