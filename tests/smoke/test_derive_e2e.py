"""`opforge recipes --derive` end to end on a package nobody wrote recipes for: the stubs of
tests/smoke/stubbed.py (ops whose own checks refuse the stub's inputs), derived in the real
interpreter, then smoked. The derived recipes run green with no stub warning left for them;
the ops no call can fix stay stubs with the reason written above them; recipes the author
wrote are left byte for byte."""

from __future__ import annotations

import ast
import contextlib
import io
import json
import sys

import pytest
from stubbed import REFUSING, write_matrix, write_stubbed

from opforge.cli import main

pytest.importorskip("torch")

STUB_FINE = '    "fine": {"inputs": _floats(8), "stub": True},\n'
AUTHORED = '    "fine": {"inputs": lambda dtype: [torch.ones(3, dtype=dtype)]},  # mine\n'


def _run(argv, root) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(err):
        mp.setenv("PYTHONPATH", str(root))
        mp.delenv("GITHUB_STEP_SUMMARY", raising=False)
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def derived(tmp_path_factory):
    root = tmp_path_factory.mktemp("derive")
    recipes = write_stubbed(root)
    # as `opforge init` writes them: a literal True, and the function's signature above it
    text = recipes.read_text().replace("STUB}", "True}").replace(
        '    "stubbed.helpers.long_only"', '    # long_only(Tensor x)\n'
                                          '    "stubbed.helpers.long_only"')
    assert STUB_FINE in text
    text = text.replace(STUB_FINE, AUTHORED)
    recipes.write_text(text)
    before = text
    matrix = write_matrix(root, recipes, ", ".join(
        [*REFUSING, "{cuda_only: {no_kernel: [cpu]}}", "nocpu", "fine"]))
    code, out, err = _run(["recipes", "--derive", "--python", sys.executable,
                           "--file", str(matrix)], root)
    return root, matrix, recipes, before, code, out, err


def _entries(text: str) -> dict[str, ast.Dict]:
    tree = ast.parse(text)
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
            for key, value in zip(node.value.keys, node.value.values):
                found[key.value] = value
    return found


def _flags(entry: ast.Dict) -> dict[str, object]:
    return {k.value: v.value for k, v in zip(entry.keys, entry.values)
            if isinstance(v, ast.Constant)}


def test_the_refused_stubs_get_a_working_call_marked_derived(derived):
    _, _, recipes, _, code, out, err = derived
    assert code == 0, err
    entries = _entries(recipes.read_text())
    for op in (*REFUSING, "stubbed.helpers.long_only"):
        flags = _flags(entries[op])
        assert flags.get("derived") is True and "stub" not in flags, (op, flags)
    assert "6 of 8 ops got a working call" in err + out, err + out


def test_what_no_call_can_fix_stays_a_stub_with_the_reason(derived):
    _, _, recipes, _, _, out, err = derived
    text = recipes.read_text()
    entries = _entries(text)
    for op in ("cuda_only", "nocpu", "stubbed.helpers.not_there"):
        assert _flags(entries[op]).get("stub") is True, op
    lines = text.splitlines()
    # no CPU kernel registered: one try, then the dispatcher's words above the stub
    nocpu = next(i for i, line in enumerate(lines) if '"nocpu":' in line) - 1
    assert lines[nocpu].strip().startswith("# derive: no working call in 1 tries"), lines[nocpu]
    assert "Could not run 'stubbed::nocpu'" in lines[nocpu], lines[nocpu]
    # a function that is not there: said so, nothing tried
    missing = next(i for i, line in enumerate(lines) if '"stubbed.helpers.not_there":' in line)
    assert "no attribute 'not_there'" in lines[missing - 1], lines[missing - 1]
    # declared without a CPU kernel (matrix.yaml no_kernel: [cpu]): skipped, no note
    cuda_only = next(i for i, line in enumerate(lines) if '"cuda_only":' in line)
    assert not lines[cuda_only - 1].strip().startswith("# derive:"), lines[cuda_only - 1]
    assert "1 skipped" in err + out


def test_authored_recipes_and_the_rest_of_the_file_are_untouched(derived):
    _, _, recipes, before, _, _, _ = derived
    after = recipes.read_text()
    assert AUTHORED.strip() in after
    assert after.split("RECIPES = {")[0] == before.split("RECIPES = {")[0]


def test_the_next_smoke_runs_the_derived_calls_green(derived, tmp_path):
    """The derived recipes pass; what stays red is what derive said no call can fix."""
    root, matrix, _, _, _, _, _ = derived
    doc = tmp_path / "doc.json"
    code, out, err = _run(["smoke", "--python", sys.executable, "--file", str(matrix),
                           "--variant", "cpu", "--json", str(doc)], root)
    checks = {c["id"]: c for c in json.loads(doc.read_text())["checks"]}
    failed = sorted(i for i, c in checks.items() if c["status"] == "fail")
    assert code == 1
    assert failed and all("nocpu" in i or "not_there" in i for i in failed), failed
    for op in REFUSING:
        run = checks[f"run:{op}:cpu"]
        assert run["status"] == "pass", run
        assert f"stub:{op}" not in checks, checks[f"stub:{op}"]
    assert checks["call:stubbed.helpers.long_only:cpu"]["status"] == "pass"


def test_derive_twice_changes_nothing(derived):
    root, matrix, recipes, _, _, _, _ = derived
    first = recipes.read_text()
    code, out, err = _run(["recipes", "--derive", "--python", sys.executable,
                           "--file", str(matrix)], root)
    assert code == 0, err
    assert recipes.read_text() == first
