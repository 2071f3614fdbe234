"""A pure-Python op extension whose ops check their arguments, for the stub verdicts.

``write_stubbed(root)`` writes the package ``stubbed`` (torch.library ops: no compiler) and a
recipes file whose recipes are the kind ``opforge init`` writes (``"stub": True``: float
tensors of one size for every argument). Each op's CPU kernel refuses those inputs the way
real kernels do, with torch's own checks:

| op | CPU kernel | with the stub's inputs |
| --- | --- | --- |
| gather | torch.gather along 0 | "gather(): Expected dtype int64 for index" (RuntimeError) |
| segment | torch._check that index is int64 | "expected scalar type Long but found Float" |
| sized | a + b | "The size of tensor a (7) must match the size of tensor b (8)" |
| pick | x.sum(dim) | "Dimension out of range" (IndexError) |
| flat | torch._check(x.dim() == 1) | "Expected x.dim() == 1" |
| cuda_only | raises "No CPU version supported" | the op's design: declared no_kernel |
| nocpu | no CPU kernel registered (Meta only) | "Could not run ... 'CPU' backend" |
| fine | x * 2 | runs |

``helpers.long_only`` (FUNCTIONS) checks its argument like a pybind11 function would.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import yaml
from projectkit import matrix_yaml

PACKAGE = '''
import torch

lib = torch.library.Library("stubbed", "DEF")
lib.define("gather(Tensor src, Tensor index) -> Tensor")
lib.define("segment(Tensor src, Tensor index) -> Tensor")
lib.define("sized(Tensor a, Tensor b) -> Tensor")
lib.define("pick(Tensor x, int dim) -> Tensor")
lib.define("flat(Tensor x) -> Tensor")
lib.define("cuda_only(Tensor x) -> Tensor")
lib.define("nocpu(Tensor x) -> Tensor")
lib.define("fine(Tensor x) -> Tensor")


def _segment(src, index):
    torch._check(index.dtype == torch.long,
                 lambda: f"expected scalar type Long but found {str(index.dtype)[6:].title()}")
    return src.index_select(0, index)


def _flat(x):
    torch._check(x.dim() == 1, lambda: f"Expected x.dim() == 1 to be true, but got false: {x.dim()}")
    return x.cumsum(0)


def _cuda_only(x):
    if x.device.type == "cpu":
        raise RuntimeError("No CPU version supported")
    return x + 1


lib.impl("gather", lambda src, index: torch.gather(src, 0, index), "CPU")
lib.impl("segment", _segment, "CPU")
lib.impl("sized", lambda a, b: a + b, "CPU")
lib.impl("pick", lambda x, dim: x.sum(dim), "CPU")
lib.impl("flat", _flat, "CPU")
lib.impl("cuda_only", _cuda_only, "CPU")
lib.impl("fine", lambda x: x * 2, "CPU")
for _name in ("gather", "segment", "flat", "cuda_only", "nocpu", "fine"):
    lib.impl(_name, lambda x, *rest: torch.empty_like(x), "Meta")
lib.impl("sized", lambda a, b: torch.empty_like(a), "Meta")
lib.impl("pick", lambda x, dim: x.sum(dim), "Meta")
'''

HELPERS = '''
import torch


def long_only(x):
    if x.dtype != torch.long:
        raise RuntimeError(f"long_only: expected scalar type Long but found {x.dtype}")
    return x + 1
'''

RECIPES = '''
import torch


def _floats(*sizes):
    return lambda dtype: [torch.linspace(0.1, 1, n, dtype=dtype).reshape(n) for n in sizes]


STUB = {stub}
RECIPES = {{
    "gather": {{"inputs": _floats(8, 8), "stub": STUB}},
    "segment": {{"inputs": _floats(8, 8), "stub": STUB}},
    "sized": {{"inputs": _floats(7, 8), "stub": STUB}},
    "pick": {{"inputs": lambda dtype: [torch.linspace(0.1, 1, 8, dtype=dtype), 1],
              "stub": STUB}},
    "flat": {{"inputs": lambda dtype: [torch.linspace(0.1, 1, 64, dtype=dtype).reshape(8, 8)],
              "stub": STUB}},
    "cuda_only": {{"inputs": _floats(8), "stub": STUB}},
    "nocpu": {{"inputs": _floats(8), "stub": STUB}},
    "fine": {{"inputs": _floats(8), "stub": STUB}},
}}
FUNCTIONS = {{
    "stubbed.helpers.long_only": {{"inputs": _floats(8), "stub": STUB}},
    "stubbed.helpers.not_there": {{"inputs": _floats(8), "stub": STUB}},
}}
'''


REFUSING = ("gather", "segment", "sized", "pick", "flat")


def write_stubbed(root: Path, *, stub: bool = True) -> Path:
    """The package ``stubbed`` under ``root`` (put it on PYTHONPATH) and its recipes file."""
    pkg = root / "stubbed"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text(textwrap.dedent(PACKAGE), encoding="utf-8")
    (pkg / "helpers.py").write_text(textwrap.dedent(HELPERS), encoding="utf-8")
    recipes = root / ("stub_recipes.py" if stub else "authored_recipes.py")
    recipes.write_text(textwrap.dedent(RECIPES.format(stub=stub)), encoding="utf-8")
    return recipes


def write_matrix(root: Path, recipes: Path, ops: str, name: str = "matrix.yaml") -> Path:
    path = root / name
    listed = yaml.safe_load(f"[{ops}]")  # the test's flow list: names and {op: {fields}}
    path.write_text(matrix_yaml("stubbed", listed, recipes=recipes.name,
                                expected_keys=("CPU", "Meta")), encoding="utf-8")
    return path
