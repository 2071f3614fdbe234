"""``opforge bench`` inside the environment under test: time the recipes' workloads.

Every workload of every op runs on every present device (the ones its ``devices`` allow),
forward and, where ``grad`` names arguments, forward + backward, against its reference (the
recipe's: another library's function, or the op's own CPU kernel). A row first checks that the
two sides agree (so a fast wrong kernel cannot pass), then times them with
``torch.utils.benchmark`` in alternating blocks: the speed-up is the median of the per-round
ratios reference / ours, and the noise is the same measurement of ours against itself (and
of the reference against itself: ``reference_noise``, so a comparison with a baseline can tell
which side moved). A row
whose reference is the op's own CPU kernel, on the CPU, has nothing else to pair with: it is
timed alone, paired with a fixed plain-Python yardstick (its pace: yardstick time / ours),
which ``--against`` compares with a saved run's.

On the CPU a row can be timed at several thread counts (``threads``: each count is a row of
its own, and a count's ``thread_cost`` is its time over the first count's: above 1, the op
waited on a thread instead of gaining from it), while busy processes hold every core the
process may use (``contended``: a busy machine, as a CI runner or a data-loading process is).
A workload may also name a ``plain`` function, a plain op doing comparable work on the same
arguments (conv2d beside a deformable convolution): its forward rows time it too, and
``max_vs_plain`` bounds ours / its time.
Standard library and torch only, like the rest of the probe; one JSON document out.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import os
import platform
import sys
import time
import traceback
import warnings

from ...smoke.probe import recipes as recipes_file
from ...smoke.probe.checks import skippable
from ...smoke.probe.common import DEVICES, first_line
from ...smoke.probe.speed import paired, synchronizer, yardstick
from ...smoke.probe.values import compare, outputs_of, to_device
from . import selection
from .cores import busy_cores, cpu_model, thread_count

SCHEMA = 1
ALONE_BLOCK_S = 0.002  # a block of an op timed alone, and of its yardstick


def parse_args(argv):
    p = argparse.ArgumentParser(description="opforge bench (runs in the environment under test)")
    p.add_argument("--package", required=True)
    p.add_argument("--namespace", required=True)
    p.add_argument("--spec", type=lambda path: json.load(open(path, encoding="utf-8")),
                   default={})
    p.add_argument("--device-checks", choices=("auto", "skip"), default="auto")
    p.add_argument("--out", required=True)
    # bench's own: {ops, workloads, reference ("recipe" | "cpu"), budget_s, directions,
    # min_speedup, op_min_speedup: {op: floor} (the ops matrix.yaml declares slower by design),
    # threads: [counts] (CPU rows), contended: bool, max_thread_cost: float | None}
    p.add_argument("--bench", type=json.loads, default={})
    return p.parse_args(argv)


class Row(dict):
    """One op x workload x direction x device; ``status`` pass | fail | skip."""


class Bench:
    def __init__(self, torch_mod, namespace: str, recipes: dict, path: str, options: dict):
        self.t, self.ns, self.recipes, self.path = torch_mod, namespace, recipes, path
        self.ops = options.get("ops") or None
        self.workloads = options.get("workloads") or None
        self.force_cpu_reference = options.get("reference") == "cpu"
        self.budget_s = float(options.get("budget_s", 0.3))
        self.min_speedup = float(options.get("min_speedup", 0.1))
        self.op_min_speedup = {op: float(floor) for op, floor
                               in (options.get("op_min_speedup") or {}).items()}
        self.directions = options.get("directions") or ["forward", "backward"]
        self.threads = [int(n) for n in options.get("threads") or ()] or [None]
        self.contended = bool(options.get("contended"))
        self.max_thread_cost = options.get("max_thread_cost")
        self.rows: list[Row] = []
        self.planned: list[tuple[str, str, str]] = []  # (op, workload, row id)
        self.finished: set[tuple[str, str]] = set()    # (op, workload) with every row done
        self.checkpoint = lambda: None
        self.started = 0  # rows whose timing began: the progress the host shows

    # ----------------------------------------------------------------- plumbing

    def devices(self, device_checks: str) -> list[str]:
        t = self.t
        present = ["cpu"]
        if device_checks != "skip":
            if t.cuda.is_available():
                present.append("cuda")
            mps = getattr(t.backends, "mps", None)
            if mps is not None and mps.is_available():
                present.append("mps")
        return [d for d in DEVICES if d in present]

    def reference_of(self, recipe: dict, load: dict):
        if self.force_cpu_reference:
            return "cpu"
        return recipes_file.resolve_reference(load.get("reference", recipe.get("reference")))

    def call_maker(self, fn, cpu_args, device, grad):
        """A zero-argument call (forward, or forward + backward of ``grad``'s arguments) and
        a function returning what it computed, for the agreement check."""
        t = self.t
        args = [to_device(t, a, device) for a in cpu_args]
        leaves = []
        for i in grad:
            if i >= len(args) or not isinstance(args[i], t.Tensor) or \
                    not args[i].is_floating_point():
                raise recipes_file.RecipeError(f"workload grad names argument {i}, which is "
                                               "not a floating-point tensor")
            args[i] = args[i].detach().requires_grad_(True)
            leaves.append(args[i])
        sync = synchronizer(t, device)

        def run():
            out = outputs_of(fn(*args))
            if not leaves:
                return out
            floats = [o for o in out if isinstance(o, t.Tensor) and o.requires_grad]
            return list(t.autograd.grad(sum(o.sum() for o in floats), leaves,
                                        allow_unused=True))

        def call():
            run()
            sync()
        return call, run

    # ----------------------------------------------------------------- rows

    def selected(self):
        """(op, recipe, fn, workload name, workload) for every selected workload; a recipe
        that is malformed or an op that does not exist becomes a failed row instead."""
        for op, recipe in self.recipes.items():
            if self.ops and op not in self.ops:
                continue
            if not isinstance(recipe, dict) or not recipe.get("workloads"):
                continue
            problem = recipes_file.validate(op, recipe, self.path, skippable())
            if problem:
                self.rows.append(Row(op=op, status="fail", message=problem, recipe_error=True))
                continue
            try:
                fn = getattr(getattr(getattr(self.t.ops, self.ns), op),
                             recipe.get("overload") or "default")
            except (AttributeError, RuntimeError) as exc:
                self.rows.append(Row(op=op, status="fail",
                                     message=f"torch.ops.{self.ns}.{op}: {first_line(exc)}"))
                continue
            for name, load in recipe["workloads"].items():
                if not self.workloads or name in self.workloads:
                    yield op, recipe, fn, name, load

    def run(self, device_list: list[str], checkpoint=lambda: None) -> list[Row]:
        """Every selected workload's rows; ``checkpoint()`` runs after each row, so a report
        written there holds every finished row and names the rest (``missing``)."""
        self.checkpoint = checkpoint
        selected = list(self.selected())
        self.planned = [(op, name, row_id(op, name, direction, device, count))
                        for op, recipe, fn, name, load in selected
                        for device in device_list
                        if load.get("devices") is None or device in load["devices"]
                        for direction in self.directions_of(recipe, load)[1]
                        for count in self.counts(device)]
        checkpoint()
        for op, recipe, fn, name, load in selected:
            self.workload(op, recipe, fn, name, load, device_list)
            self.finished.add((op, name))
            checkpoint()
        return self.rows

    def missing(self) -> list[str]:
        """The planned rows not measured yet (a finished workload has none left)."""
        done = {row_id(r.get("op"), r.get("workload"), r.get("direction"), r.get("device"),
                       r.get("threads")) for r in self.rows if "status" in r}
        return [key for op, name, key in self.planned
                if key not in done and (op, name) not in self.finished]

    def counts(self, device: str) -> list:
        """The thread counts a device's rows are timed at (None: as the process is set)."""
        return self.threads if device == "cpu" else [None]

    def directions_of(self, recipe, load) -> tuple[list[int], list[str]]:
        """(the arguments that get a gradient, the directions timed: backward only with grad)."""
        grad = list(load.get("grad", recipe.get("grad")) or [])
        return grad, [d for d in self.directions if d == "forward" or grad]

    def inputs_of(self, op, name, load) -> list | Row:
        """The workload's CPU arguments, or the failed row saying where the recipe raised."""
        try:
            return list(load["inputs"](self.t.float32))
        except Exception as exc:  # noqa: BLE001 - the recipe's bug, with its file:line
            return Row(op=op, workload=name, status="fail", recipe_error=True, message=(
                f"workload {op}/{name} inputs raised {first_line(exc)} at "
                f"{recipes_file.where(exc, self.path)}"))

    def workload(self, op, recipe, fn, name, load, device_list):
        grad, directions = self.directions_of(recipe, load)
        base = {"op": op, "workload": name}
        try:
            reference = self.reference_of(recipe, load)
        except recipes_file.RecipeError as exc:
            for device in device_list:
                self.rows.append(Row(base, device=device, status="skip", reason="no-reference",
                                     message=str(exc)))
            return
        cpu_args = self.inputs_of(op, name, load)
        if isinstance(cpu_args, Row):
            self.rows.append(cpu_args)
            return
        ref_name = reference if isinstance(reference, str) else \
            getattr(reference, "__name__", None) or repr(reference)
        try:
            plain = recipes_file.resolve_reference(load["plain"]) if "plain" in load else None
        except recipes_file.RecipeError as exc:
            self.rows.append(Row(base, status="fail", recipe_error=True,
                                 message=f"workload {op}/{name} plain: {exc}"))
            return
        for device in device_list:
            if load.get("devices") is not None and device not in load["devices"]:
                continue
            with busy_cores(self.contended and device == "cpu"):
                for direction in directions:
                    first = None  # the row of the first thread count, which the others divide
                    for count in self.counts(device):
                        row = Row(base, device=device, direction=direction, reference=ref_name)
                        if count is not None:
                            row["threads"] = count
                        self.rows.append(row)
                        announce(self.started, len(self.planned),
                                 row_id(op, name, direction, device, count))
                        self.started += 1
                        self.time_row(row, fn, reference, plain, load, cpu_args, device,
                                      grad if direction == "backward" else [], recipe, count)
                        if first is None:
                            first = row
                        else:
                            self.judge_thread_cost(row, first)
                        self.checkpoint()

    def time_row(self, row, fn, reference, plain, load, cpu_args, device, grad, recipe, count):
        op, name, direction = row["op"], row["workload"], row["direction"]
        try:
            with thread_count(self.t, count):
                if reference == "cpu" and device == "cpu":
                    # nothing to pair it with: its own time, which --against compares
                    self.measure_alone(row, fn, cpu_args, grad)
                else:
                    self.measure(row, fn, reference, cpu_args, device, grad, recipe)
                if plain is not None and not grad and "ours_s" in row:
                    self.measure_plain(row, fn, plain, cpu_args, device, load)
        except Exception as exc:  # noqa: BLE001 - one row's failure, reported there
            where = f"{op}/{name} {direction} on {device}" + \
                (f" with {count} threads" if count is not None else "")
            row.update(status="fail", message=f"{where}: {first_line(exc)}")

    def judge_thread_cost(self, row, first):
        """A thread count's time over the first count's (both medians of their rows); above
        --max-thread-cost beyond both rows' noise, the row fails."""
        if "ours_s" not in row or "ours_s" not in first:
            return
        cost = row["ours_s"] / max(first["ours_s"], 1e-12)
        row["thread_cost"] = cost
        row["thread_cost_of"] = first["threads"]
        limit = self.max_thread_cost
        noise = float(row.get("noise") or 0) + float(first.get("noise") or 0)
        if limit is not None and row.get("status") == "pass" and cost > limit * (1 + noise):
            row.update(status="fail", message=(
                f"{row['threads']} threads take {cost:.2f}x the time of {first['threads']} "
                f"(at most {limit:g}x allowed, beyond noise ±{noise * 100:.0f}%)"
                + (" while busy processes hold every core" if self.contended else "")))

    def measure(self, row, fn, reference, cpu_args, device, grad, recipe):
        ours, ours_run = self.call_maker(fn, cpu_args, device, grad)
        if reference == "cpu":
            ref, ref_run = self.call_maker(fn, cpu_args, "cpu", grad)
        else:
            ref, ref_run = self.call_maker(reference, cpu_args, device, grad)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                want = ref_run()
            except ImportError as exc:
                row.update(status="skip", reason="no-reference",
                           message=f"reference {row['reference']}: {first_line(exc)}")
                return
            got = ours_run()
            keep = recipe.get("outputs") if not grad else None
            if keep is not None:
                want, got = [want[i] for i in keep], [got[i] for i in keep]
            atol = recipe.get("grad_atol" if grad else "atol", 1e-3 if grad else 1e-4)
            rtol = recipe.get("grad_rtol" if grad else "rtol", 1e-3)
            problem = compare(self.t, want, got, atol, rtol)
            if problem:
                row.update(status="fail", message=f"ours and the reference disagree: "
                           f"{problem.replace('the CPU', 'the reference').replace('CPU', 'reference')}")
                return
            ours_block, ref_block = _block(self.t, ours), _block(self.t, ref)
            speed = paired(ours_block, ref_block, budget_s=self.budget_s)
            noise = paired(ours_block, ours_block, budget_s=self.budget_s / 2)
            # the reference's noise, measured the same way: --against tells which side moved
            ref_noise = paired(ref_block, ref_block, budget_s=self.budget_s / 2)
        # an A/A run: how far ours against itself strays from 1 (its spread is reported apart)
        noise_level = abs(noise["ratio"] - 1)
        floor = self.op_min_speedup.get(row["op"], self.min_speedup)
        declared = row["op"] in self.op_min_speedup
        # slower than the floor even after granting ours its own measured noise
        slow = speed["ratio"] * (1 + noise_level) < floor
        why = f"matrix.yaml declares {row['op']} up to {1 / floor:g}x slower" if declared \
            else ""
        message = f"{speed['ratio']:.3g}x the reference's speed"
        if slow:
            message += f": slower than the {floor:g}x allowed" + (f" ({why})" if why else "")
        elif declared and speed["ratio"] < self.min_speedup:
            message += f": slower than {self.min_speedup:g}x, as declared ({why})"
        row.update(status="fail" if slow else "pass", ours_s=speed["a_s"],
                   reference_s=speed["b_s"], speedup=speed["ratio"], spread=speed["spread"],
                   rounds=speed["rounds"], noise=noise_level,
                   reference_noise=abs(ref_noise["ratio"] - 1), min_speedup=floor,
                   message=message)
        if declared:
            row["declared_slower"] = True

    def measure_plain(self, row, fn, plain, cpu_args, device, load):
        """Ours beside the workload's plain function on the same arguments, paired the same
        way: ``vs_plain`` = ours / its time, at most ``max_vs_plain`` when the workload says."""
        ours, _ = self.call_maker(fn, cpu_args, device, [])
        base, base_run = self.call_maker(plain, cpu_args, device, [])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            base_run()
            speed = paired(_block(self.t, ours), _block(self.t, base), budget_s=self.budget_s)
        row.update(plain=getattr(plain, "__name__", None) or repr(plain), plain_s=speed["b_s"],
                   vs_plain=1 / max(speed["ratio"], 1e-12))
        judge_vs_plain(row, load.get("max_vs_plain"))

    def measure_alone(self, row, fn, cpu_args, grad):
        """The op on the CPU against its own CPU kernel (on a machine with only a CPU, the
        only reference there is): no speed-up to take, so it is paired with a fixed
        plain-Python yardstick instead, and its pace (yardstick time / its time) is what
        --against compares with a saved run's; its time is reported beside it."""
        ours, ours_run = self.call_maker(fn, cpu_args, "cpu", grad)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ours_run()  # it runs at all (agreement needs a reference: smoke checks answers)
            # short blocks, five of each side a round: on a busy CPU the fastest block of each
            # side is one no other process interrupted (20 ms blocks moved the pace 4x at a
            # load of 11 on 2 cores; 2 ms blocks kept it within 5%)
            ours_block = _block(self.t, ours, ALONE_BLOCK_S)
            stick_block = _block(self.t, yardstick, ALONE_BLOCK_S)
            pace = paired(ours_block, stick_block, budget_s=self.budget_s, inner=5)
            noise = paired(ours_block, ours_block, budget_s=self.budget_s / 2, inner=5)
            stick_noise = paired(stick_block, stick_block, budget_s=self.budget_s / 2, inner=5)
        row.update(status="pass", alone=True, ours_s=pace["a_s"], yardstick_s=pace["b_s"],
                   pace=pace["ratio"], spread=pace["spread"], rounds=pace["rounds"],
                   noise=abs(noise["ratio"] - 1), yardstick_noise=abs(stick_noise["ratio"] - 1),
                   message="timed alone (the reference is this op's own CPU kernel): its pace "
                           "against a fixed yardstick is compared with a saved run's by "
                           "--against")


def judge_vs_plain(row, limit) -> None:
    """A row's time against its plain op (``vs_plain``) above ``limit`` beyond its noise:
    the row fails, naming the plain op and the factor (no limit: only reported)."""
    if limit is None:
        return
    row["max_vs_plain"] = limit
    vs, noise = row["vs_plain"], float(row.get("noise") or 0)
    if vs > limit * (1 + noise) and row.get("status") == "pass":
        row.update(status="fail", message=(
            f"{vs:.2f}x the time of {row['plain']} on the same arguments (at most "
            f"{limit:g}x allowed, beyond noise ±{noise * 100:.0f}%)"))


# a line on stderr the host reads as progress (opforge.smoke.runner), not as an error's words
PROGRESS_PREFIX = "opforge-progress: "


def announce(done: int, total: int, current: str) -> None:
    print(PROGRESS_PREFIX + json.dumps({"done": done, "total": total, "current": current}),
          file=sys.stderr, flush=True)


def row_id(op, workload, direction, device, threads=None) -> str:
    return f"{op}/{workload}/{direction}/{device}" + (f"@{threads}t" if threads else "")


def _block(t, call, target_s: float = 0.02):
    """Seconds per call of one block, timed by torch.utils.benchmark (calls per block fixed
    once, so every round of a row does the same work)."""
    # torch (~1 s): in the target only; the host imports this module (PROGRESS_PREFIX) without it
    from torch.utils.benchmark import Timer

    # at the thread count the process is set to (Timer's own default is one thread, which
    # would time every row on one thread whatever the report says)
    timer = Timer(stmt="call()", globals={"call": call}, num_threads=t.get_num_threads())
    once = min(timer.timeit(1).mean for _ in range(3))  # a stall must not set the block size
    number = max(1, min(10_000, int(target_s / max(once, 1e-7))))
    return lambda: timer.timeit(number).mean


def new_document(args) -> dict:
    return {"schema": SCHEMA, "kind": "bench", "package": args.package,
            "namespace": args.namespace, "rows": [], "checks": [], "complete": False,
            "missing": []}


def bench(args, doc: dict, save) -> None:
    """Fill ``doc``; ``save()`` writes it whole after every row (an interrupted or crashed run
    leaves a valid report of the rows it finished and the ones it did not)."""
    started = time.monotonic()
    # torch (~1 s): in the target only; the host imports this module (PROGRESS_PREFIX) without it
    try:
        import torch
    except BaseException as exc:  # noqa: BLE001
        doc["checks"].append({"id": "import-torch", "category": "import", "status": "fail",
                              "message": f"import torch fails: {first_line(exc)}"})
        return
    doc["environment"] = {"python": platform.python_version(), "executable": sys.executable,
                          "platform": platform.platform(), "torch_version": torch.__version__,
                          "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available()
                          else None, "threads": torch.get_num_threads(),
                          "cpu": cpu_model(), "cpus": os.cpu_count()}
    if args.bench.get("threads"):
        doc["environment"]["thread_counts"] = list(args.bench["threads"])
    if args.bench.get("contended"):
        doc["environment"]["contended"] = True
    try:
        module = importlib.import_module(args.package)
        doc["import"] = {"file": getattr(module, "__file__", None)}
    except BaseException as exc:  # noqa: BLE001
        doc["checks"].append({"id": "import", "category": "import", "status": "fail",
                              "message": f"import {args.package}: {first_line(exc)}"})
        return
    path = args.spec.get("recipes")
    try:
        recipes = recipes_file.load(path) if path else {}
    except recipes_file.RecipeError as exc:
        doc["checks"].append({"id": "recipes", "category": "run", "status": "fail",
                              "message": f"recipes file: {exc}", "recipe_error": True})
        return
    runner = Bench(torch, args.namespace, recipes, path or "recipes", args.bench)
    # --ops / --workloads names the host could not read from the file (made by its code)
    said = selection.problem(selection.names_of(recipes), runner.ops, runner.workloads,
                             os.path.basename(path) if path else "the recipes file")
    if said:
        doc["checks"].append({"id": "selection", "category": "usage", "status": "fail",
                              "message": said, "usage": True})
        return
    devices = runner.devices(args.device_checks)
    doc["devices"] = devices

    def checkpoint() -> None:
        doc["rows"] = [r for r in runner.rows if "status" in r]
        doc["missing"] = runner.missing()
        doc["duration_s"] = round(time.monotonic() - started, 2)
        save()

    runner.run(devices, checkpoint)


def write_document(path: str, doc: dict) -> None:
    """The whole document or nothing: a scratch file beside it, then a rename."""
    scratch = f"{path}.partial"
    with open(scratch, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=1, default=str)
    os.replace(scratch, path)


def main(argv=None) -> int:
    args = parse_args(argv)
    captured = io.StringIO()
    doc = new_document(args)
    with contextlib.redirect_stdout(captured):
        try:
            bench(args, doc, lambda: write_document(args.out, doc))
        except BaseException:  # noqa: BLE001 - the document is always written
            doc["probe_error"] = traceback.format_exc()
    doc["stdout"] = captured.getvalue()[-4000:]
    doc["complete"] = not doc.get("probe_error") and not doc["missing"]
    failed = doc.get("probe_error") or any(r.get("status") == "fail" for r in doc["rows"]) or \
        any(c["status"] == "fail" for c in doc["checks"])
    doc["summary"] = {"status": "fail" if failed else "pass"}
    write_document(args.out, doc)
    return 1 if failed else 0
