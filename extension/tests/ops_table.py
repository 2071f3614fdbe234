"""The one list of opforge's operators, read from the built extension's schemas: a new op
is checked for its registrations on every backend without editing a list of names. Each op's
tests live in its module test_<op>.py (`module_of`), its smoke recipe in extension/recipes.py
(`recipes`)."""

import importlib
import importlib.util
from pathlib import Path

import torch

import opforge_ops  # noqa: F401  (loading it registers the schemas)

_ALL = sorted(
    schema.name.split("::", 1)[1]
    for schema in torch._C._jit_get_all_schemas()
    if schema.name.startswith("opforge::")
)
_FORWARD = [op for op in _ALL if not op.startswith("_")]
# Other underscore ops than a forward op's _<op>_backward are helpers the wrappers call
# (_boxes_to_rois): no kernel per backend, nor autograd and autocast registrations of their
# own, and not in matrix.yaml's promises (_boxes_to_rois: test_roi_align.py).
HELPER_OPS = tuple(op for op in _ALL if op.startswith("_") and
                   not (op.endswith("_backward") and op[1:-len("_backward")] in _FORWARD))
OPS = tuple(op for op in _ALL if op not in HELPER_OPS)
FORWARD_OPS = tuple(op for op in OPS if not op.startswith("_"))
BACKWARD_OPS = tuple(op for op in OPS if op.startswith("_"))

TESTS_DIR = Path(__file__).resolve().parent
RECIPES_PY = TESTS_DIR.parent / "recipes.py"


def module_of(op):
    """The test module of a forward op, test_<op>.py beside this file: its tests, its slow
    reference (`reference`, see ops_reference.py) and its torchvision-compatibility cases
    (`torchvision_cases`, see torchvision_compat/tv_cases.py). Imported by the name pytest's
    import mode (prepend, the default) gives it, so it is the module pytest collects, not a
    second copy whose tests or registrations would run twice."""
    module = importlib.import_module(f"test_{op}")
    where = Path(module.__file__).resolve()
    assert where == TESTS_DIR / f"test_{op}.py", f"test_{op} was imported from {where}, not from {TESTS_DIR}"
    return module


def recipes():
    """op -> its smoke recipe (extension/recipes.py's RECIPES: inputs, grad, autocast ...)."""
    spec = importlib.util.spec_from_file_location("opforge_ops_recipes", RECIPES_PY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.RECIPES
