"""A red names a real fault: a stub's made-up inputs refused by the op's own checks are a
warning that names the recipe to write; a recipe the author wrote, a missing kernel, a missing
function and an op's own "no kernel for this device" stay failures; a device matrix.yaml says
an op has no kernel for, by design, is skipped with that reason (tests/smoke/stubbed.py)."""

from __future__ import annotations

import contextlib
import io
import json
import sys

import pytest
from stubbed import REFUSING, write_matrix, write_stubbed

from opforge.cli import main

pytest.importorskip("torch")

ALL = ", ".join([*REFUSING, "{cuda_only: {no_kernel: [cpu]}}", "fine"])


def _smoke(root, matrix, tmp_path) -> tuple[int, dict, str]:
    out, printed = tmp_path / "doc.json", io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(printed):
        mp.setenv("PYTHONPATH", str(root))
        mp.delenv("GITHUB_STEP_SUMMARY", raising=False)
        code = main(["smoke", "--python", sys.executable, "--file", str(matrix),
                     "--variant", "cpu", "--json", str(out)])
    doc = json.loads(out.read_text())
    return code, {c["id"]: c for c in doc["checks"]}, printed.getvalue()


@pytest.fixture(scope="module")
def stubbed_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("stubbed")
    return root, write_stubbed(root), write_stubbed(root, stub=False)


def _without_functions(recipes):
    """The recipes file without its FUNCTIONS (one of which names a missing function)."""
    text = recipes.read_text()
    recipes.with_name("ops_" + recipes.name).write_text(text.split("FUNCTIONS =")[0])
    return recipes.with_name("ops_" + recipes.name)


@pytest.fixture(scope="module")
def green(stubbed_root, tmp_path_factory):
    """Every op with a stub recipe: five refuse it, one is declared without a CPU kernel."""
    root, stub, _ = stubbed_root
    matrix = write_matrix(root, _without_functions(stub), ALL, "green.yaml")
    return _smoke(root, matrix, tmp_path_factory.mktemp("green"))


def test_stub_inputs_the_ops_refuse_warn_and_the_run_is_green(green):
    code, checks, out = green
    assert code == 0, [c for c in checks.values() if c["status"] == "fail"]
    said = {"gather": "Expected dtype int", "segment": "expected scalar type Long but found",
            "sized": "The size of tensor a (7) must match the size of tensor b (8)",
            "pick": "Dimension out of range", "flat": "Expected x.dim() == 1"}
    for op in REFUSING:
        run = checks[f"run:{op}:cpu"]
        assert run["status"] == "warn" and run["reason"] == "stub-rejected", run
        assert run["message"].startswith(f"stub inputs rejected by stubbed::{op}: \""), run
        assert said[op] in run["rejected"] and said[op] in run["message"]
        assert f"write a recipe for {op} in " in run["message"]
        assert "opforge recipes --derive" in run["message"]
        # the checks that need the CPU run are skipped, each saying why
        for dependent in (f"fake:{op}", f"compile:{op}"):
            assert checks[dependent]["status"] == "skip", checks[dependent]
            assert checks[dependent]["reason"] == "stub-rejected"
            assert f"run:{op}:cpu" in checks[dependent]["message"]
    assert checks["run:fine:cpu"]["status"] == "pass"
    assert "stub refused" in out


def test_an_op_without_a_cpu_kernel_by_design_is_skipped_with_the_reason(green):
    code, checks, _ = green
    assert code == 0
    run = checks["run:cuda_only:cpu"]
    assert run["status"] == "skip" and run["reason"] == "by-design", run
    assert "matrix.yaml declares that cuda_only has no cpu kernel" in run["message"]
    assert checks["compile:cuda_only"]["reason"] == "by-design"
    assert checks["fake:cuda_only"]["status"] == "pass"  # its Meta kernel needs no CPU one
    assert "census:cuda_only:CPU" not in checks  # the census expects nothing there


def test_an_undeclared_no_cpu_version_fails_and_names_the_declaration(stubbed_root, tmp_path):
    root, stub, _ = stubbed_root
    matrix = write_matrix(root, _without_functions(stub), "cuda_only", "undeclared.yaml")
    code, checks, _ = _smoke(root, matrix, tmp_path)
    run = checks["run:cuda_only:cpu"]
    assert code == 1 and run["status"] == "fail" and run["error_kind"] == "no-kernel", run
    assert "No CPU version supported" in run["message"]
    assert "{no_kernel: [cpu]}" in run["message"]


def test_an_authored_recipe_the_op_refuses_fails(stubbed_root, tmp_path):
    root, _, authored = stubbed_root
    matrix = write_matrix(root, _without_functions(authored), "segment, fine", "authored.yaml")
    code, checks, _ = _smoke(root, matrix, tmp_path)
    run = checks["run:segment:cpu"]
    assert code == 1 and run["status"] == "fail" and run["error_kind"] == "rejected", run
    assert "expected scalar type Long but found" in run["message"]
    assert checks["run:fine:cpu"]["status"] == "pass"


def test_a_stub_for_an_op_without_its_cpu_kernel_fails_naming_the_key(stubbed_root, tmp_path):
    root, stub, _ = stubbed_root
    matrix = write_matrix(root, _without_functions(stub), "nocpu, fine", "nocpu.yaml")
    code, checks, _ = _smoke(root, matrix, tmp_path)
    run = checks["run:nocpu:cpu"]
    assert code == 1 and run["status"] == "fail", run
    assert "Could not run 'stubbed::nocpu' with arguments from the 'CPU' backend" in run["message"]
    assert run["explained_by"] == "census: nocpu has no CPU kernel"
    assert checks["census:nocpu:CPU"]["status"] == "fail"


def test_stub_functions_refused_warn_and_missing_ones_fail(stubbed_root, tmp_path):
    root, stub, _ = stubbed_root
    matrix = write_matrix(root, stub, "fine", "functions.yaml")
    code, checks, _ = _smoke(root, matrix, tmp_path)
    refused = checks["call:stubbed.helpers.long_only:cpu"]
    assert refused["status"] == "warn" and refused["reason"] == "stub-rejected", refused
    assert "write a recipe for stubbed.helpers.long_only" in refused["message"]
    missing = checks["call:stubbed.helpers.not_there"]
    assert code == 1 and missing["status"] == "fail" and "not_there" in missing["message"]
