"""The rule for ``--ops`` and ``--workloads`` names, shared by the host (which knows the names a
recipes file writes as literals, before any environment is made) and the target (which knows
them all, once the file has run). Standard library only."""

from __future__ import annotations

import difflib


def _unknown(option: str, asked, known: list[str], where: str, what: str,
             plural: str) -> str | None:
    missing = [name for name in asked if name not in known]
    if not missing:
        return None
    hints = [m for name in missing for m in difflib.get_close_matches(name, known, n=1)]
    return (f"{option} {','.join(missing)}: {where} has no such {what} (its {plural}: "
            f"{', '.join(sorted(known)) or 'none'})"
            + (f"; did you mean {', '.join(hints)}?" if hints else ""))


def problem(recipes: dict, ops, workloads, where: str) -> str | None:
    """What is wrong with ``--ops`` / ``--workloads`` against ``recipes`` (op -> the set of its
    workload names, None where it is not known), in one line; None when nothing is, or when it
    cannot be told. An op bench can time has a recipe with workloads; a workload name must be
    one of the chosen ops' (any of them)."""
    timed = sorted(op for op, names in recipes.items() if names is None or names)
    if ops:
        said = _unknown("--ops", ops, timed, where, "op with workloads", "ops with workloads")
        if said:
            return said
    chosen = [recipes[op] for op in (ops or timed)]
    if workloads and all(names is not None for names in chosen):
        return _unknown("--workloads", workloads, sorted(set().union(*chosen)), where,
                        "workload", "workloads" + (f" of {','.join(ops)}" if ops else ""))
    return None


def names_of(recipes: dict) -> dict:
    """op -> the set of its workload names, of a loaded RECIPES (a malformed recipe: none)."""
    out = {}
    for op, recipe in recipes.items():
        loads = recipe.get("workloads") if isinstance(recipe, dict) else None
        out[op] = frozenset(loads) if isinstance(loads, dict) else frozenset()
    return out
