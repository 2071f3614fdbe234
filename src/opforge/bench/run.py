"""``opforge bench``'s application: the baseline chosen, the wheel installed where users run,
the recipes' workloads timed there (``opforge.bench.target``), the report, the baseline saved.

``opforge.cli.bench`` parses the command line into ``BenchOptions`` and calls ``run``; the
target, matrix and probe request are the smoke's ``Plan`` (``opforge.smoke.plan``), made once
bench's own options are checked.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement

from opforge.bench import report as benchreport
from opforge.bench import selection
from opforge.bench.baselines import (
    baseline_dir,
    baseline_target,
    load_baseline,
    read_baseline,
    save,
)
from opforge.bench.compare import DEFAULT_REGRESSION, compare_to_baseline
from opforge.errors import UsageError
from opforge.files import check_writable, write_atomic
from opforge.smoke.plan import Options, make_plan
from opforge.smoke.runner import cleanup, prepare_environment, run_probe
from opforge.torchsource import pip_index_args
from opforge.venv import install

# every workload of every op on every device, large ones included, on a slow machine: the
# smoke probe's 900 s is too short (measured: six ops with large workloads on a loaded 2-core CPU took longer)
BENCH_TIMEOUT_S = 3 * 3600


@dataclass(frozen=True)
class BenchOptions:
    """What the command line said: the target's options (shared with ``opforge smoke``; its
    ``ops`` are also bench's selection, its ``json`` bench's document) and bench's own."""

    target: Options
    budget: float  # a row's timing budget, seconds (opforge.cli.bench.DEFAULT_BUDGET_S)
    extras: tuple[str, ...] = ()
    workloads: tuple[str, ...] | None = None
    reference: str = "recipe"
    min_speedup: float | None = None
    forward_only: bool = False
    threads: tuple[int, ...] | None = None
    contended: bool = False
    max_thread_cost: float | None = None
    summary: Path | None = None
    save: str | None = None
    against: str | None = None
    baseline: str | None = None
    against_label: str | None = None
    regression: float | None = None

    # the target's options bench reads as its own
    @property
    def ops(self) -> tuple[str, ...] | None:
        return self.target.ops

    @property
    def json(self) -> Path | None:
        return self.target.json

    @property
    def python(self) -> Path | None:
        return self.target.python

    @property
    def keep_env(self) -> bool:
        return self.target.keep_env


def run(given: BenchOptions) -> int:
    """``opforge bench`` with its options: the exit code (0 pass, 1 a row failed)."""
    if given.summary is not None:
        check_writable(given.summary, what="--summary")
    for extra in given.extras:
        _requirement(extra)
    if given.python is not None and given.extras:
        raise UsageError("--with installs into a fresh environment, not --python")
    if given.baseline is not None and given.against is not None:
        raise UsageError("--baseline and --against both name a baseline: give one")
    if given.baseline is not None and not given.baseline.strip():
        raise UsageError("--baseline '': name a baseline (NAME, or a FILE ending in .json)")
    baseline, record, kept, threshold = _baselines(given)
    if given.save:
        check_writable(baseline_dir() / f"{given.save}.json", what="--save")
    threads = list(given.threads or ())
    max_thread_cost = given.max_thread_cost
    if max_thread_cost is not None and len(threads) < 2:
        raise UsageError("--max-thread-cost compares thread counts: give --threads with two or "
                         "more, e.g. --threads 1,2")
    plan = make_plan(given.target)
    target, request = plan.target, plan.request
    if request.recipes is None:
        raise UsageError("no recipes file: name one in matrix.yaml (extension.recipes) or "
                         "pass --recipes FILE (its workloads are what bench times)")
    # the names the recipes file writes as literals; the rest are checked in the target
    selection.check(request.recipes, given.ops, given.workloads)
    options = _options(given, request, threads, max_thread_cost)
    print(f"opforge bench: {target.describe()}"
          + (f" with {', '.join(given.extras)}" if given.extras else ""), file=sys.stderr,
          flush=True)
    doc = _measure(given, target, request, options)
    refused = next((c for c in doc.get("checks", []) if c.get("usage")), None)
    if refused is not None:  # a name only the recipes file's code makes, found unknown there
        raise UsageError(refused["message"])
    return _finish(given, doc, baseline, record, kept, threshold)


def _baselines(given: BenchOptions):
    """The baseline compared with and its threshold, checked before anything runs:
    (baseline, record: the --baseline this run becomes, kept: the one no run replaces,
    threshold)."""
    compared = given.against is not None or given.baseline is not None
    for option, value in (("--regression", given.regression),
                          ("--against-label", given.against_label)):
        if value is not None and not compared:
            raise UsageError(f"{option} applies to a comparison with a baseline: give "
                             "--against NAME|FILE or --baseline NAME|FILE with it")
    threshold = given.regression if given.regression is not None else DEFAULT_REGRESSION
    # an empty --against (a workflow's first run: no last good one yet) compares nothing
    baseline = load_baseline(given.against) if given.against else None
    record = None  # (name, file) of the --baseline this run becomes if it passes
    kept = None    # the --baseline file compared with, which no run replaces
    if given.baseline:
        name, path = baseline_target(given.baseline)
        if path.is_file():
            baseline = (name, *read_baseline(path, f"--baseline {given.baseline}"))
            kept = path
        else:
            check_writable(path, what="--baseline")
            record = (name, path)
    if baseline and given.against_label:
        baseline = (given.against_label, *baseline[1:])
    return baseline, record, kept, threshold


def _options(given: BenchOptions, request, threads: list, max_thread_cost) -> dict:
    """What the bench target is told: the selection, budget, limits and directions."""
    return {"ops": list(given.ops or ()), "workloads": list(given.workloads or ()),
               "reference": given.reference, "budget_s": given.budget,
               "min_speedup": given.min_speedup if given.min_speedup is not None else 0.1,
               # the ops matrix.yaml declares slower than their reference by design
               "op_min_speedup": {op: 1 / factor for op, factor
                                  in (request.speed.get("op_factors") or {}).items()},
               "directions": ["forward"] if given.forward_only else ["forward", "backward"],
               "threads": threads, "contended": given.contended,
               "max_thread_cost": max_thread_cost}


def _measure(given: BenchOptions, target, request, options: dict) -> dict:
    """The environment made (with --with's packages) and the workloads timed in it: the
    bench document; an interrupted run writes the rows finished so far to --json."""
    env = prepare_environment(target)
    try:
        if given.extras:
            env.installs.append(f"pip install {' '.join(given.extras)}")
            # from torch's index too: a library built for that torch (torchvision) lives there
            # the torch under test stays: a library's newest release may want another one
            pin = [f"torch=={env.torch_installed}"] if env.torch_installed else []
            install(env.python, *given.extras, *pin, *pip_index_args(target.torch_index),
                    what=", ".join(given.extras))
        try:
            doc = run_probe(env, request, BENCH_TIMEOUT_S, mode=("bench",),
                            extra_argv=("--bench", json.dumps(options)),
                            parts="bench: timing the workloads")
        except KeyboardInterrupt as exc:
            # the rows finished so far, and the ones not measured, in a valid document
            partial = getattr(exc, "partial_document", None)
            if given.json and partial is not None:
                partial.update(complete=False, interrupted=True)
                write_atomic(given.json, json.dumps(partial, indent=1) + "\n")
                print(f"interrupted: {len(partial.get('rows') or [])} rows written to "
                      f"{given.json}, {len(partial.get('missing') or [])} missing",
                      file=sys.stderr)
            raise
    finally:
        cleanup(env, keep=given.keep_env)
    return doc


def _finish(given: BenchOptions, doc: dict, baseline, record, kept, threshold) -> int:
    """Compared with the baseline, stored, reported (terminal, --json, --summary, the job
    summary): the exit code."""
    if baseline:
        compare_to_baseline(doc, baseline[1], baseline[0], threshold, base_machine=baseline[2])
    elif record is not None:
        doc["baseline"] = {"name": None, "note": f"{record[1]} does not exist yet: this run "
                                                 "becomes the baseline if it passes"}
    elif given.against is not None:
        doc["baseline"] = {"name": None, "note": given.against_label or "none saved yet"}
    doc["finished_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    stores = [(f"baseline {given.save}", baseline_dir() / f"{given.save}.json")] \
        if given.save else []
    if record is not None:
        stores.append((f"baseline {record[0]}" if record[1].parent == baseline_dir() else
                       "the baseline", record[1]))
    lines = [store(doc, what, path) for what, path in stores]
    if kept is not None:
        lines.append(f"kept the baseline {kept} as it was (recorded once, by the first run "
                     "that passed; a new one is recorded only where none exists).")
    if lines:
        doc["saved"] = {"line": " ".join(lines)}
    benchreport.render_terminal(doc)
    for line in lines:
        print(f"opforge bench: {line}", file=sys.stderr)
    if given.json:
        write_atomic(given.json, json.dumps(doc, indent=1) + "\n")
    summary = benchreport.markdown(doc)
    if given.summary:
        write_atomic(given.summary, summary)
    if os.environ.get("GITHUB_STEP_SUMMARY"):
        with open(os.environ["GITHUB_STEP_SUMMARY"], "a", encoding="utf-8") as fh:
            fh.write(summary)
    return benchreport.exit_code(doc)


def store(doc: dict, what: str, path: Path) -> str:
    """Save a passing run at ``path``; one line either way: saved or not, where, and why."""
    if benchreport.exit_code(doc) == 0:
        save(path, doc)
        timed = sum(1 for r in doc.get("rows", []) if "ours_s" in r)
        return f"saved this run as {what} ({path}): {timed} rows timed."
    why = benchreport.why_failed(doc)
    kept = "keeps the run saved before" if path.is_file() else "was not written"
    return f"not saved as {what}: {why}; {path} {kept}."


def _requirement(text: str) -> None:
    try:
        Requirement(text)
    except InvalidRequirement as exc:
        raise UsageError(f"--with {text!r}: not a requirement ({exc})") from None
