"""``probe.pyz serve``: hold the recipes' workloads ready and time one block on request.

Bisect by speed compares two environments (two torch builds) in one run. Each environment
runs this server; the caller alternates its requests between them, so the two sides of every
round are timed moments apart while the other side waits idle on its pipe (the pairing of
``speed.paired``, across processes). The workloads are built as ``opforge bench`` builds them
(``bench.Bench``: the same selection, inputs, devices and forward + backward calls).

Protocol, one JSON object per line: the server first writes ``{"ready": true, "rows": {key:
seconds per call of one warm call}, "failed": {key: message}, "torch_version": ...}``, or
``{"error": message, "recipe_error": bool}`` and exits; then it answers each request
``{"time": key}`` with ``{"s": seconds per call}`` (one block of calls, fixed at start) until
its input closes. Anything else the extension prints goes to stderr. Standard library and
torch only, like the rest of the probe.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import warnings

from ...smoke.probe import recipes as recipes_file
from ...smoke.probe.common import first_line, own_stdout
from ...smoke.probe.speed import block_timer, calls_per_block
from .bench import Bench, Row

# calls per block: about this long, so a block outlasts the request's round trip many times
BLOCK_S = 0.01


def parse_args(argv):
    p = argparse.ArgumentParser(description="opforge workload server (bisect by speed)")
    p.add_argument("--package", required=True)
    p.add_argument("--namespace", required=True)
    p.add_argument("--recipes", required=True)
    p.add_argument("--device-checks", choices=("auto", "skip"), default="auto")
    # {ops, workloads, directions}, as bench takes them
    p.add_argument("--options", type=json.loads, default={})
    return p.parse_args(argv)


def prepare(args) -> tuple[dict, dict]:
    """(the ready message, key -> (call, calls per block)); raises SystemExit via ``fail``."""
    # torch (~1 s): imported by the server once it starts, not with the archive's modules
    import torch

    importlib.import_module(args.package)
    try:
        recipes = recipes_file.load(args.recipes)
    except recipes_file.RecipeError as exc:
        raise Failed(f"recipes file: {exc}", recipe_error=True) from None
    bench = Bench(torch, args.namespace, recipes, args.recipes, args.options)
    devices = bench.devices(args.device_checks)
    rows, failed, calls = {}, {}, {}
    for op, recipe, fn, name, load in bench.selected():
        grad, directions = bench.directions_of(recipe, load)
        cpu_args = bench.inputs_of(op, name, load)
        if isinstance(cpu_args, Row):
            raise Failed(cpu_args["message"], recipe_error=True)
        for device in devices:
            if load.get("devices") is not None and device not in load["devices"]:
                continue
            for direction in directions:
                key = f"{op}/{name}/{direction}/{device}"
                try:
                    call, _ = bench.call_maker(fn, cpu_args, device,
                                               grad if direction == "backward" else [])
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        number = calls_per_block(call, lambda: None, BLOCK_S)
                        rows[key] = block_timer(call, lambda: None, 1)
                except Exception as exc:  # noqa: BLE001 - this row cannot be timed here
                    failed[key] = first_line(exc)
                    continue
                calls[key] = (call, number)
    for row in bench.rows:  # malformed recipes, missing ops
        if row.get("recipe_error"):
            raise Failed(row["message"], recipe_error=True)
        failed[row["op"]] = row["message"]
    ready = {"ready": True, "rows": rows, "failed": failed, "torch_version": torch.__version__,
             "devices": devices}
    return ready, calls


class Failed(Exception):
    def __init__(self, message: str, recipe_error: bool = False):
        super().__init__(message)
        self.recipe_error = recipe_error


def main(argv=None) -> int:
    args = parse_args(argv)
    say = own_stdout()  # the protocol owns the real stdout; the extension's prints go to stderr

    try:
        ready, calls = prepare(args)
    except Failed as exc:
        say({"error": str(exc), "recipe_error": exc.recipe_error})
        return 1
    except BaseException as exc:  # noqa: BLE001 - the import of torch or the package failed
        say({"error": f"{type(exc).__name__}: {first_line(exc)}", "recipe_error": False})
        return 1
    say(ready)
    for line in sys.stdin:
        try:
            key = json.loads(line)["time"]
            call, number = calls[key]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                say({"s": block_timer(call, lambda: None, number)})
        except Exception as exc:  # noqa: BLE001 - a bad request or a call that now raises
            say({"error": f"{type(exc).__name__}: {first_line(exc)}"})
    return 0
