"""The probe's check table: a check is one row and one function, and the rest follows from it
(the driver runs it, a failure is explained by the census, the report gives it a column)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from rich.console import Console

from opforge.smoke import report as smoke_report
from opforge.smoke.probe import Report, checks, runs
from opforge.smoke.probe.recipes import validate

torch = pytest.importorskip("torch")


def _runner(keys: dict[str, str], recipe: dict) -> runs.OpRunner:
    """aten.add as the op under test, on the CPU only, with census cells ``keys``."""
    report = Report(SimpleNamespace(package="p", namespace="aten", spec={}))
    report.doc["devices"] = {"cpu": {"present": True},
                             "cuda": {"present": False, "detail": "no cuda here"},
                             "mps": {"present": False, "detail": "no mps here"}}
    rows = {"add": {"found": True, "declared": True, "internal": False,
                    "keys": {k: {"status": v} for k, v in keys.items()}}}
    return runs.OpRunner(report, torch, "aten", rows, ["cpu"], {"add": recipe}, "recipes.py")


ADD = {"inputs": lambda dtype: [torch.ones(3, dtype=dtype), torch.ones(3, dtype=dtype)],
       "overload": "Tensor", "expected": [2.0, 2.0, 2.0],
       "skip": {"compile": "torch.compile takes seconds; not what this test is about"}}


def test_a_row_and_a_function_make_a_check_that_runs_is_explained_and_has_a_column(monkeypatch):
    seen = []

    def planted(runner: runs.OpRunner, call: checks.Call) -> None:
        seen.append((call.op, call.dtype, call.cpu_out is not None))
        runner.report.check(f"planted:{call.op}", "planted", "fail", "the planted check failed",
                            op=call.op)

    monkeypatch.setattr(checks, "CHECKS", (*checks.CHECKS, checks.Check("planted", ("Meta",),
                                                                   planted)))
    runner = _runner({"CPU": "ok", "Meta": "missing", "Autograd": "ok"}, ADD)
    runner.run_all(import_ok=True)
    doc = runner.report.doc
    by_id = {c["id"]: c for c in doc["checks"]}
    assert by_id["run:add:cpu"]["status"] == "pass"  # the checks before it ran first
    assert seen == [("add", torch.float32, True)]     # once, with the CPU's results in hand
    planted_check = by_id["planted:add"]
    assert planted_check["explained_by"] == "census: add has no Meta kernel"
    assert planted_check["message"] == "the planted check failed [census: add has no Meta kernel]"
    assert validate("add", {**ADD, "skip": {"planted": "a reason"}}, "recipes.py",
                    checks.skippable()) is None

    console = Console(record=True, width=200)
    smoke_report.render_terminal(doc, console)
    table = {line.split()[0]: line.split() for line in console.export_text().splitlines()
             if line.strip().startswith(("op ", "add "))}
    assert table["op"] == ["op", "cpu", "cuda", "mps", "fake", "compile", "planted"]
    assert table["add"] == ["add", "ok", "no", "device", "no", "device", "ok", "skip", "FAIL"]


def test_a_failure_is_explained_by_the_keys_its_row_names():
    # the run check's row names the device's key: no CPU kernel explains a CPU run failing
    runner = _runner({"CPU": "missing"}, {**ADD, "expected": [3.0, 3.0, 3.0]})
    runner.run_all(import_ok=True)
    run = next(c for c in runner.report.doc["checks"] if c["id"] == "run:add:cpu")
    assert run["status"] == "fail"
    assert run["explained_by"] == "census: add has no CPU kernel"


def test_a_recipe_skips_only_checks_the_table_lets_it_skip():
    problem = validate("add", {**ADD, "skip": {"speed": "no"}}, "recipes.py", checks.skippable())
    assert problem == ("recipes.py: RECIPES['add']['skip'] maps checks (run, backward, fake, "
                       "compile, autocast) to the reason they do not apply")
