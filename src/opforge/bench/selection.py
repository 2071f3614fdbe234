"""``--ops`` and ``--workloads`` checked against the recipes file before any environment is made.

The recipes file is Python that runs in the environment under test (it imports torch, maybe
the package): here it is only parsed, never run. ``RECIPES = {"op": {..., "workloads": {"small":
...}}}`` written as literals names its ops and their workloads, and a name that is not among
them is a usage error (exit 2) in one line. Names built by code (a helper that returns the
workloads, a ``RECIPES`` filled in later) cannot be known without running the file: those are
checked inside the environment under test instead, by the same rule and the same message
(``bench/target/selection.py``).
"""

from __future__ import annotations

import ast
from pathlib import Path

from opforge.bench.target.selection import problem
from opforge.errors import UsageError
from opforge.files import read_text

# op -> its workload names (None: written as code, not literals); None: RECIPES itself is code
Names = dict[str, frozenset[str] | None] | None


def _literal_keys(node: ast.AST) -> list[str] | None:
    """The keys of a dict literal whose keys are all strings (None: anything else)."""
    if not isinstance(node, ast.Dict):
        return None
    keys = [k.value if isinstance(k, ast.Constant) and isinstance(k.value, str) else None
            for k in node.keys]  # a None key is a ** unpacking
    return None if None in keys else keys


def _workloads(recipe: ast.AST) -> frozenset[str] | None:
    keys = _literal_keys(recipe)
    if keys is None:
        return None
    if "workloads" not in keys:
        return frozenset()  # a recipe without workloads: bench times nothing of it
    return _set(_literal_keys(recipe.values[keys.index("workloads")]))


def _set(keys: list[str] | None) -> frozenset[str] | None:
    return None if keys is None else frozenset(keys)


def read_names(path: Path) -> Names:
    """The ops of the recipes file at ``path`` and each op's workloads, as far as they are
    written as literals (a file that does not parse: None, and the probe reports it)."""
    try:
        tree = ast.parse(read_text(path, what="recipes file"), filename=str(path))
    except (SyntaxError, ValueError):
        return None
    assigned = [n for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign))
                and any(isinstance(t, ast.Name) and t.id == "RECIPES"
                        for t in (n.targets if isinstance(n, ast.Assign) else [n.target]))]
    uses = sum(1 for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == "RECIPES")
    if len(assigned) != 1 or uses != 1 or assigned[0].value is None:
        return None  # RECIPES built, changed or read by code: only running the file tells
    keys = _literal_keys(assigned[0].value)
    if keys is None:
        return None
    return {op: _workloads(value) for op, value in zip(keys, assigned[0].value.values)}


def check(path: Path | None, ops, workloads) -> None:
    """Refuse (UsageError) an ``--ops`` or ``--workloads`` name the recipes file at ``path``
    shows not to exist; names it does not show as literals are left to the probe."""
    if path is None or not (ops or workloads):
        return
    names = read_names(path)
    if names is None:
        return
    said = problem(names, ops, workloads, path.name)
    if said:
        raise UsageError(said)
