"""A call that kills the interpreter is named, and costs only its own checks.

The package ``crashy`` (torch.library ops, no compiler) has kernels that die of SIGSEGV the
way an unchecked C++ kernel does when it reads past a tensor it was not given. The probe
leaves a breadcrumb before each call; the runner reads it, probes again without that call,
and the report says which op crashed in which check. A stub recipe's made-up inputs crashing
an op is a warning that names the recipe to write (the op does not check its inputs: no
registration failure); a recipe the author wrote that crashes the op is a FAIL naming it.
A crash before any call (while the package loads) stays the probe's own FAIL.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import textwrap

import pytest
from projectkit import matrix_yaml

from opforge.cli import main

pytest.importorskip("torch")

PACKAGE = '''
import os
import signal

import torch

if os.environ.get("CRASHY_AT_IMPORT"):
    os.kill(os.getpid(), signal.SIGSEGV)


def _die():
    os.kill(os.getpid(), signal.SIGSEGV)  # what an out-of-bounds read in a kernel does


def _reads(x, index):
    if index.numel() < x.numel():  # an unchecked kernel reads x.numel() entries of index
        _die()
    return x + index.to(x.dtype)


class _Grad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 3

    @staticmethod
    def backward(ctx, g):
        _die()


lib = torch.library.Library("crashy", "DEF")
lib.define("reads(Tensor x, Tensor index) -> Tensor")
lib.define("tripled(Tensor x) -> Tensor")
lib.define("fine(Tensor x) -> Tensor")
lib.impl("reads", _reads, "CPU")
lib.impl("tripled", lambda x: x * 3, "CPU")
lib.impl("tripled", lambda x: _Grad.apply(x), "Autograd")
lib.impl("fine", lambda x: x * 2, "CPU")
'''

HELPERS = '''
from crashy import _die


def boom(x):
    _die()


def calm(x):
    return x + 1
'''

RECIPES = '''
import torch

STUB = {stub}
RECIPES = {{
    "reads": {{"inputs": lambda dtype: [torch.ones(8, 8, dtype=dtype), torch.arange(8)],
               "stub": STUB}},
    "tripled": {{"inputs": lambda dtype: [torch.ones(4, dtype=dtype, requires_grad=True)],
                 "grad": [0], "skip": {{"fake": "no fake kernel", "compile": "no fake kernel"}},
                 "stub": STUB}},
    "fine": {{"inputs": lambda dtype: [torch.ones(4, dtype=dtype)], "stub": STUB,
              "skip": {{"fake": "no fake kernel", "compile": "no fake kernel"}}}},
}}
FUNCTIONS = {{
    "crashy.helpers.boom": {{"inputs": lambda dtype: [torch.ones(4, dtype=dtype)], "stub": STUB}},
    "crashy.helpers.calm": {{"inputs": lambda dtype: [torch.ones(4, dtype=dtype)], "stub": STUB}},
}}
'''



def _tree(root, stub: bool):
    pkg = root / "crashy"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text(textwrap.dedent(PACKAGE), encoding="utf-8")
    (pkg / "helpers.py").write_text(textwrap.dedent(HELPERS), encoding="utf-8")
    recipes = root / f"recipes_{'stub' if stub else 'written'}.py"
    recipes.write_text(textwrap.dedent(RECIPES.format(stub=stub)), encoding="utf-8")
    matrix = root / f"matrix_{'stub' if stub else 'written'}.yaml"
    matrix.write_text(matrix_yaml("crashy", ["reads", "tripled", "fine"], recipes=recipes.name),
                      encoding="utf-8")
    return matrix


def _smoke(root, matrix, out, **env) -> tuple[int, dict, dict, str]:
    printed = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(printed):
        mp.setenv("PYTHONPATH", str(root))
        mp.delenv("GITHUB_STEP_SUMMARY", raising=False)
        for name, value in env.items():
            mp.setenv(name, value)
        code = main(["smoke", "--python", sys.executable, "--file", str(matrix),
                     "--variant", "cpu", "--json", str(out)])
    doc = json.loads(out.read_text())
    return code, {c["id"]: c for c in doc["checks"]}, doc, printed.getvalue()


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("crashy")


def test_stub_inputs_that_crash_an_op_warn_and_the_rest_is_probed(root, tmp_path):
    code, checks, doc, out = _smoke(root, _tree(root, stub=True), tmp_path / "doc.json")
    assert code == 0, [c for c in checks.values() if c["status"] == "fail"]
    crash = checks["crash:reads"]
    assert crash["status"] == "warn" and crash["reason"] == "stub-crashed", crash
    assert crash["crashed"] == "SIGSEGV" and crash["crashed_in"] == "run"
    assert "crashy::reads's run check on cpu" in crash["message"]
    assert "write a recipe for reads in " in crash["message"]
    assert "opforge recipes --derive" in crash["message"]
    assert not any(c.startswith("run:reads") for c in checks)   # its checks were not run
    # the crash in a backward is named as such
    grad = checks["crash:tripled"]
    assert grad["status"] == "warn" and grad["crashed_in"] == "backward", grad
    # a module function that crashes, the same way
    boom = checks["crash:crashy.helpers.boom"]
    assert boom["status"] == "warn" and boom["reason"] == "stub-crashed", boom
    # everything else was probed: the census, the other op, the other function
    assert checks["run:fine:cpu"]["status"] == "pass"
    assert checks["call:crashy.helpers.calm:cpu"]["status"] == "pass"
    census = {row["op"]: row["keys"]["CPU"]["status"] for row in doc["census"]["ops"]}
    assert census == {"reads": "ok", "tripled": "ok", "fine": "ok"}, census
    assert set(doc["runner"]["crashed"]) == {"op:reads", "op:tripled",
                                             "function:crashy.helpers.boom"}
    assert "probe" not in checks


def test_a_written_recipe_that_crashes_its_op_fails_naming_it(root, tmp_path):
    code, checks, doc, out = _smoke(root, _tree(root, stub=False), tmp_path / "doc.json")
    assert code == 1
    crash = checks["crash:reads"]
    assert crash["status"] == "fail", crash
    assert crash["message"].startswith("crashy::reads crashed the interpreter (SIGSEGV) in its "
                                       "run check on cpu with the inputs of its recipe (written")
    assert checks["crash:tripled"]["status"] == "fail"
    assert checks["crash:crashy.helpers.boom"]["status"] == "fail"
    assert checks["run:fine:cpu"]["status"] == "pass"
    fails = sorted(c["id"] for c in checks.values() if c["status"] == "fail")
    assert fails == ["crash:crashy.helpers.boom", "crash:reads", "crash:tripled"], fails
    assert "crash:reads" in out


def test_a_crash_while_the_package_loads_stays_the_probes_failure(root, tmp_path):
    code, checks, doc, _ = _smoke(root, _tree(root, stub=True), tmp_path / "doc.json",
                                  CRASHY_AT_IMPORT="1")
    assert code == 1
    probe = checks["probe"]
    assert probe["status"] == "fail"
    assert "died with SIGSEGV" in probe["message"]
    assert "crashed" not in doc.get("runner", {})
    assert not any(c.startswith("crash:") for c in checks)
