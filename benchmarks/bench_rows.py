"""The benchmark rows of extension/recipes.py (its BENCHMARKS), which bench_cpu.py and
bench_cuda.py time: each op's rows live beside its smoke recipe, so no script names an op."""

import importlib.util
from pathlib import Path

RECIPES_PY = Path(__file__).resolve().parents[1] / "extension" / "recipes.py"


def rows(kind):
    """(op, row) for every row of kind "cpu" or "cuda", in the recipes' op order. An op of
    RECIPES without rows of that kind is an error: an empty list says it has none."""
    spec = importlib.util.spec_from_file_location("opforge_ops_recipes", RECIPES_PY)
    recipes = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipes)
    missing = [op for op in recipes.RECIPES if kind not in recipes.BENCHMARKS.get(op, {})]
    if missing:
        raise SystemExit(f"{RECIPES_PY}: BENCHMARKS gives no {kind!r} rows for "
                         f"{', '.join(missing)} (an empty list if there are none)")
    return [(op, row) for op, kinds in recipes.BENCHMARKS.items() for row in kinds[kind]]
