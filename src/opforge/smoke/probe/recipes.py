"""The extension's recipes file: how to call each op, loaded in the target environment.

The file is plain Python (standard library and torch) that defines ``RECIPES``, a dict from op
name to a dict with these fields (docs/adopt.md has the full reference):

  inputs     (dtype) -> list of arguments, built on the CPU (required); tensors are moved to
             each device by the probe, so every device sees the same values
  dtypes     floating dtypes to run with (default [torch.float32])
  expected   the CPU result (a tensor, list or number), or
  check      (call, args, out) -> None, or a string saying what is wrong (may raise AssertionError)
  grad       argument indices that get a gradient: the backward check (default: none)
  autocast   argument indices lowered to float16 / bfloat16 under torch.autocast (default: none)
  mutates    argument indices whose values after the call are the result (in-place / out= ops)
  outputs    result indices compared across devices (default: all)
  atol, rtol, grad_atol, grad_rtol, autocast_atol   tolerances against the CPU (float32)
  skip       {check: reason}: checks that do not apply (run, backward, fake, compile, autocast)
  overload   the overload to call (default "default")

A recipe that raises is reported as that recipe's failure with its file:line.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import traceback

from .common import first_line

CHECKS = ("run", "backward", "fake", "compile", "autocast")
FIELDS = {"inputs", "dtypes", "expected", "check", "grad", "autocast", "mutates", "outputs",
          "atol", "rtol", "grad_atol", "grad_rtol", "autocast_atol", "skip", "overload"}


class RecipeError(Exception):
    """A recipe (or the recipes file) is wrong or raised; the message names file:line."""


def where(exc: BaseException, path: str) -> str:
    """file:line of the deepest frame inside the recipes file (else of the deepest frame)."""
    frames = traceback.extract_tb(exc.__traceback__)
    real = os.path.realpath(path)
    own = [f for f in frames if os.path.realpath(f.filename) == real]
    frame = (own or frames)[-1:]
    return f"{frame[0].filename}:{frame[0].lineno}" if frame else path


def load(path: str) -> dict:
    """Execute the recipes file and return its RECIPES (raises RecipeError)."""
    if not os.path.isfile(path):
        raise RecipeError(f"{path}: no such recipes file")
    spec = importlib.util.spec_from_file_location("opforge_smoke_recipes", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:  # noqa: BLE001 - any error in the file is the file's
        raise RecipeError(f"loading {where(exc, path)} raised {first_line(exc)}") from None
    recipes = getattr(module, "RECIPES", None)
    if not isinstance(recipes, dict):
        raise RecipeError(f"{path}: defines no RECIPES dict (op name -> recipe)")
    return recipes


def validate(op: str, recipe, path: str) -> str | None:
    """What is wrong with one recipe's shape, or None."""
    if not isinstance(recipe, dict):
        return f"{path}: RECIPES[{op!r}] is {type(recipe).__name__}, expected a dict"
    unknown = sorted(set(recipe) - FIELDS)
    if unknown:
        return (f"{path}: RECIPES[{op!r}] has unknown field(s) {', '.join(unknown)} "
                f"(known: {', '.join(sorted(FIELDS))})")
    if not callable(recipe.get("inputs")):
        return f"{path}: RECIPES[{op!r}] needs 'inputs', a function (dtype) -> list of arguments"
    skip = recipe.get("skip") or {}
    if not isinstance(skip, dict) or set(skip) - set(CHECKS):
        return (f"{path}: RECIPES[{op!r}]['skip'] maps checks ({', '.join(CHECKS)}) to the "
                "reason they do not apply")
    for name in ("grad", "autocast", "mutates", "outputs"):
        value = recipe.get(name)
        if value is not None and not (isinstance(value, (list, tuple))
                                      and all(isinstance(i, int) for i in value)):
            return f"{path}: RECIPES[{op!r}][{name!r}] must be a list of argument indices"
    return None
