"""Which call killed the interpreter, and what the next probe says of it.

Before each op's check (and each module function's call) the probe writes where it is to a
small file (the spec's ``at``), closed before the call: a segfault in a kernel leaves it
behind. The runner (``opforge.smoke.runner``) reads it when the probe dies of a signal, puts the
call in the spec's ``crashed`` and probes again, so one crashing op costs its own checks, not
the whole report.

What the rerun says: a stub recipe's made-up inputs that crash the op are the op not checking
its inputs (a kernel reading past a tensor it was not given), not a registration failure: a
warning naming the op and the recipe to write. A recipe the author wrote (or one derived and
kept) that crashes the op is a failure, named.
"""

from __future__ import annotations

import json
import os


class Breadcrumb:
    """Writes the call about to run to ``path`` (nothing when the spec names none)."""

    def __init__(self, path: str | None):
        self.path = path

    def at(self, **where) -> None:
        if not self.path:
            return
        tmp = f"{self.path}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(where, fh)
        os.replace(tmp, self.path)  # whole or absent: never half a line after a crash

    def clear(self) -> None:
        self.at(stage="between calls")


def read(path: str) -> dict | None:
    """The call the probe was in when it died (``kind``, ``name``, ``check``...), or None."""
    try:
        with open(path, encoding="utf-8") as fh:
            where = json.load(fh)
    except (OSError, ValueError):
        return None
    return where if isinstance(where, dict) and where.get("name") else None


def key(kind: str, name: str) -> str:
    return f"{kind}:{name}"


def recipe_kind(recipe: dict) -> str:
    return "stub" if recipe.get("stub") else "derived" if recipe.get("derived") else "written"


def report_crash(report, crashed: dict, kind: str, name: str, namespace: str,
                 path: str | None) -> bool:
    """If ``name`` crashed an earlier probe, report it (warn for a stub, fail otherwise) and
    return True: its checks are not run again."""
    info = crashed.get(key(kind, name))
    if not info:
        return False
    signal = info.get("signal") or "a signal"
    check = info.get("check") or "run"
    where = f" on {info['device']}" if info.get("device") else ""
    what = f"{namespace}::{name}" if kind == "op" else name
    recipes = path or "the recipes file (matrix.yaml: extension.recipes)"
    fields = {"crashed": signal, "crashed_in": check, "device": info.get("device")}
    if kind == "op":
        fields["op"] = name
    if info.get("recipe") == "stub":
        report.check(f"crash:{name}", "run", "warn",
                     f"the stub's made-up inputs crashed the interpreter ({signal}) in "
                     f"{what}'s {check} check{where}: it does not check its inputs (a kernel "
                     f"reading past a tensor it was not given) \u2014 write a recipe for {name} "
                     f"in {recipes} (docs/adopt.md#2-fill-in-the-recipes) or run opforge "
                     "recipes --derive; its other checks were not run", reason="stub-crashed",
                     **fields)
    else:
        made = "derived by opforge recipes --derive" if info.get("recipe") == "derived" else \
            "written"
        report.check(f"crash:{name}", "run", "fail",
                     f"{what} crashed the interpreter ({signal}) in its {check} check{where} "
                     f"with the inputs of its recipe ({made}, {recipes}); its other checks were "
                     "not run, the rest of the package was probed without it", **fields)
    return True
