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
  skip       {check: reason}: checks that do not apply (run, backward, fake, compile, autocast:
             the skippable rows of checks.CHECKS)
  overload   the overload to call (default "default")
  workloads  {name: {inputs, grad?, devices?, reference?, plain?, max_vs_plain?}}: benchmark
             shapes (small, medium, large) for `opforge bench`; the smoke speed check times
             the first one. plain: a plain op on the same arguments timed beside the forward
             (conv2d beside a deformable convolution); max_vs_plain: ours / its time at most
  stub       True in a recipe `opforge init` wrote from the op's schema (reported until edited)
  reference  what bench compares against: a callable taking the op's arguments, a dotted name
             of one ("torchvision.ops.nms"), or "cpu" (the op's own CPU kernel, the default)

A recipe that raises is reported as that recipe's failure with its file:line.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import traceback

from .common import first_line

FIELDS = {"inputs", "dtypes", "expected", "check", "grad", "autocast", "mutates", "outputs",
          "atol", "rtol", "grad_atol", "grad_rtol", "autocast_atol", "skip", "overload",
          "workloads", "reference", "stub", "derived"}
WORKLOAD_FIELDS = {"inputs", "grad", "devices", "reference", "plain", "max_vs_plain"}


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


def validate(op: str, recipe, path: str, skippable: tuple[str, ...]) -> str | None:
    """What is wrong with one recipe's shape, or None. ``skippable``: the checks its ``skip``
    may name (``checks.skippable()``, from the check table, which imports this module)."""
    if not isinstance(recipe, dict):
        return f"{path}: RECIPES[{op!r}] is {type(recipe).__name__}, expected a dict"
    problem = check_fields(f"{path}: RECIPES[{op!r}]", recipe, FIELDS)
    if problem:
        return problem
    skip = recipe.get("skip") or {}
    if not isinstance(skip, dict) or set(skip) - set(skippable):
        return (f"{path}: RECIPES[{op!r}]['skip'] maps checks ({', '.join(skippable)}) to the "
                "reason they do not apply")
    for name in ("grad", "autocast", "mutates", "outputs"):
        value = recipe.get(name)
        if not _indices(value):
            return f"{path}: RECIPES[{op!r}][{name!r}] must be a list of argument indices"
    return _validate_reference(f"{path}: RECIPES[{op!r}]", recipe.get("reference")) or \
        _validate_workloads(op, recipe.get("workloads"), path)


def check_fields(where_: str, mapping: dict, known: set[str]) -> str | None:
    """Unknown fields, or no callable 'inputs', in a recipe or a workload (or None)."""
    unknown = sorted(set(mapping) - known)
    if unknown:
        return (f"{where_} has unknown field(s) {', '.join(unknown)} "
                f"(known: {', '.join(sorted(known))})")
    if not callable(mapping.get("inputs")):
        return f"{where_} needs 'inputs', a function (dtype) -> list of arguments"
    return None


def _indices(value) -> bool:
    """None, or a list of argument indices."""
    return value is None or (isinstance(value, (list, tuple))
                             and all(isinstance(i, int) for i in value))


def _validate_reference(where_: str, reference) -> str | None:
    if reference is None or callable(reference) or (isinstance(reference, str) and reference):
        return None
    return (f"{where_}['reference'] must be a callable, a dotted name of one "
            "(\"torchvision.ops.nms\") or \"cpu\"")


def _validate_workloads(op: str, workloads, path: str) -> str | None:
    if workloads is None:
        return None
    where_ = f"{path}: RECIPES[{op!r}]['workloads']"
    if not isinstance(workloads, dict) or not workloads:
        return f"{where_} must be a non-empty dict: shape name -> {{'inputs': (dtype) -> list}}"
    for name, load in workloads.items():
        if not isinstance(name, str) or not isinstance(load, dict):
            return f"{where_} maps a shape name to a dict, got {name!r}: {type(load).__name__}"
        problem = check_fields(f"{where_}[{name!r}]", load, WORKLOAD_FIELDS)
        if problem:
            return problem
        if not _indices(load.get("grad")):
            return f"{where_}[{name!r}]['grad'] must be a list of argument indices"
        devices = load.get("devices")
        if devices is not None and not (isinstance(devices, (list, tuple))
                                        and all(isinstance(d, str) for d in devices)):
            return f"{where_}[{name!r}]['devices'] must be a list of device names (cpu, cuda, mps)"
        problem = _validate_reference(f"{where_}[{name!r}]", load.get("reference")) or \
            _validate_plain(f"{where_}[{name!r}]", load)
        if problem:
            return problem
    return None


def _validate_plain(where_: str, load: dict) -> str | None:
    """A workload's ``plain`` (a plain op on the same arguments) and its ``max_vs_plain``."""
    plain, limit = load.get("plain"), load.get("max_vs_plain")
    if plain is not None and not (callable(plain) or (isinstance(plain, str) and plain
                                                      and plain != "cpu")):
        return (f"{where_}['plain'] must be a callable taking the workload's arguments, or a "
                "dotted name of one")
    if limit is not None:
        if plain is None:
            return f"{where_}['max_vs_plain'] bounds the time against 'plain', which is not given"
        if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not 0 < limit < 1e9:
            return (f"{where_}['max_vs_plain'] must be a positive number (1.5: at most 1.5x "
                    "the plain op's time)")
    return None


def resolve_reference(reference):
    """A workload's reference as a callable, or "cpu" (raises RecipeError naming what failed)."""
    if reference is None or reference == "cpu" or callable(reference):
        return reference or "cpu"
    parts = reference.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError as exc:
            if cut == 1:
                raise RecipeError(f"reference {reference!r}: cannot import it: "
                                  f"{first_line(exc)}") from None
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except (AttributeError, RuntimeError) as exc:
            raise RecipeError(f"reference {reference!r}: {first_line(exc)}") from None
        if not callable(obj):
            raise RecipeError(f"reference {reference!r} is not callable")
        return obj
    raise RecipeError(f"reference {reference!r}: cannot import it")
