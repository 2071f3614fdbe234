"""The recipes file as text: stubs found, derived ones written in place, everything else kept
byte for byte; and `opforge recipes --derive`'s usage errors (exit 2, before anything runs)."""

from __future__ import annotations

import textwrap

import pytest
from projectkit import matrix_yaml

from opforge.cli import main
from opforge.errors import UsageError
from opforge.recipes.recipes_file import derived_lines, note_line, rewrite, stub_entries

TEXT = textwrap.dedent('''\
    """My recipes."""

    import torch

    RECIPES = {
        # my_ops::scale(Tensor x, float k) -> Tensor
        "scale": {
            "inputs": lambda dtype: [torch.ones(8, 8, dtype=dtype), 2.0],
            "skip": {"fake": "no fake kernel"},
            "stub": True,
        },
        "mine": {"inputs": lambda dtype: [torch.ones(3, dtype=dtype)]},  # written by hand
        # derive: no working call in 40 tries; the best ended on: RuntimeError: old
        "gather": {"inputs": lambda dtype: [torch.ones(8)], "mutates": [0], "stub": True},
        "done": {"inputs": lambda dtype: [torch.ones(2)], "derived": True},
    }
    FUNCTIONS = {
        "my_ops._C.helper": {"inputs": lambda dtype: [torch.ones(2)], "devices": ["cuda"],
                             "stub": True},
    }
''')


def test_the_stubs_are_found_with_what_they_keep():
    entries = {e.key: e for e in stub_entries(TEXT)}
    assert set(entries) == {"scale", "gather", "my_ops._C.helper"}
    assert entries["scale"].comment == "my_ops::scale(Tensor x, float k) -> Tensor"
    assert ("skip", '{"fake": "no fake kernel"}') in entries["scale"].fields
    assert entries["gather"].mutates == [0] and entries["gather"].note is not None
    assert entries["my_ops._C.helper"].table == "FUNCTIONS"
    assert entries["my_ops._C.helper"].devices == ["cuda"]


def test_a_derived_stub_is_replaced_in_place_and_nothing_else_moves():
    entries = stub_entries(TEXT)
    scale = next(e for e in entries if e.key == "scale")
    gather = next(e for e in entries if e.key == "gather")
    new = rewrite(TEXT, {("RECIPES", "scale"): derived_lines(scale, ["torch.ones(2, 2)", "1.0"])},
                  {("RECIPES", "gather"): note_line(gather, 7, "RuntimeError: new\nsecond")},
                  entries)
    namespace: dict = {}
    exec(compile(new, "recipes", "exec"), namespace)  # noqa: S102 - the file we just wrote
    scale_recipe = namespace["RECIPES"]["scale"]
    assert scale_recipe["derived"] is True and "stub" not in scale_recipe
    assert scale_recipe["skip"] == {"fake": "no fake kernel"}
    assert [t.shape for t in scale_recipe["inputs"](None)[:1]] == [(2, 2)]
    lines = new.splitlines()
    notes = [line for line in lines if line.strip().startswith("# derive:")]
    assert notes == ["    # derive: no working call in 7 tries; the best ended on: "
                     "RuntimeError: new second"]     # the old note replaced, one line
    for kept in ('    "mine": {"inputs": lambda dtype: [torch.ones(3, dtype=dtype)]},'
                 '  # written by hand', '"""My recipes."""',
                 '    "done": {"inputs": lambda dtype: [torch.ones(2)], "derived": True},'):
        assert kept in lines
    assert new.split("FUNCTIONS")[1] == TEXT.split("FUNCTIONS")[1]


def test_a_file_that_does_not_parse_is_a_usage_error_with_its_line():
    with pytest.raises(UsageError, match=r"recipes\.py:3: does not parse"):
        stub_entries("RECIPES = {}\n\nx = = 1\n", "recipes.py")




@pytest.fixture
def project(tmp_path):
    (tmp_path / "matrix.yaml").write_text(matrix_yaml("my_ops", ["scale", "gather"]))
    (tmp_path / "recipes.py").write_text(TEXT)
    return tmp_path


@pytest.mark.parametrize(("argv", "said"), [
    ([], "give --variant V"),
    (["--wheel", "nope.txt"], "not a .whl file"),
    (["--python", "/no/such/python"], "no such interpreter"),
    (["--python", "PY", "--ops", "scale,nothing"], "nothing: no stub recipe of that name"),
    (["--python", "PY", "--tries", "0"], "must be above 0"),
    (["--python", "PY", "--recipes", "missing.py"], "no such file"),
])
def test_bad_arguments_exit_2_with_one_line(project, capsys, argv, said, monkeypatch):
    import sys

    monkeypatch.chdir(project)
    argv = [sys.executable if a == "PY" else a for a in argv]
    before = (project / "recipes.py").read_text()
    try:
        code = main(["recipes", "--derive", "--file", str(project / "matrix.yaml"), *argv])
    except SystemExit as exc:     # argparse's own refusals
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert said in err and "Traceback" not in err, err
    assert (project / "recipes.py").read_text() == before
