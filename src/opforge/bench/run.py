"""``opforge bench``'s application: the baseline chosen, the wheel installed where users run,
the recipes' workloads timed there (``opforge.bench.target``), the report, the baseline saved.

``opforge.cli.bench`` parses the command line and calls ``run``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

from opforge.bench import selection
from opforge.bench.baselines import (
    baseline_dir,
    baseline_target,
    load_baseline,
    read_baseline,
    save,
)
from opforge.bench.compare import DEFAULT_REGRESSION
from opforge.errors import UsageError
from opforge.files import check_writable, write_atomic

# every workload of every op on every device, large ones included, on a slow machine: the
# smoke probe's 900 s is too short (measured: six ops with large workloads on a loaded 2-core CPU took longer)
BENCH_TIMEOUT_S = 3 * 3600


def run(args: argparse.Namespace) -> int:
    """``opforge bench`` with its parsed arguments: the exit code (0 pass, 1 a row failed)."""
    from opforge.smoke.plan import resolve

    if args.summary is not None:
        check_writable(args.summary, what="--summary")
    for extra in args.extras:
        _requirement(extra)
    if args.python is not None and args.extras:
        raise UsageError("--with installs into a fresh environment, not --python")
    if args.baseline is not None and args.against is not None:
        raise UsageError("--baseline and --against both name a baseline: give one")
    if args.baseline is not None and not args.baseline.strip():
        raise UsageError("--baseline '': name a baseline (NAME, or a FILE ending in .json)")
    baseline, record, kept, threshold = _baselines(args)
    if args.save:
        check_writable(baseline_dir() / f"{args.save}.json", what="--save")
    threads = list(getattr(args, "threads", None) or ())
    max_thread_cost = getattr(args, "max_thread_cost", None)
    if max_thread_cost is not None and len(threads) < 2:
        raise UsageError("--max-thread-cost compares thread counts: give --threads with two or "
                         "more, e.g. --threads 1,2")
    target, request, _variant = resolve(args)
    if request.recipes is None:
        raise UsageError("no recipes file: name one in matrix.yaml (extension.recipes) or "
                         "pass --recipes FILE (its workloads are what bench times)")
    # the names the recipes file writes as literals; the rest are checked in the target
    selection.check(request.recipes, args.ops, args.workloads)
    options = _options(args, request, threads, max_thread_cost)
    print(f"opforge bench: {target.describe()}"
          + (f" with {', '.join(args.extras)}" if args.extras else ""), file=sys.stderr,
          flush=True)
    doc = _measure(args, target, request, options)
    refused = next((c for c in doc.get("checks", []) if c.get("usage")), None)
    if refused is not None:  # a name only the recipes file's code makes, found unknown there
        raise UsageError(refused["message"])
    return _finish(args, doc, baseline, record, kept, threshold)


def _baselines(args: argparse.Namespace):
    """The baseline compared with and its threshold, checked before anything runs:
    (baseline, record: the --baseline this run becomes, kept: the one no run replaces,
    threshold)."""
    compared = args.against is not None or args.baseline is not None
    for option, value in (("--regression", args.regression),
                          ("--against-label", args.against_label)):
        if value is not None and not compared:
            raise UsageError(f"{option} applies to a comparison with a baseline: give "
                             "--against NAME|FILE or --baseline NAME|FILE with it")
    threshold = args.regression if args.regression is not None else DEFAULT_REGRESSION
    # an empty --against (a workflow's first run: no last good one yet) compares nothing
    baseline = load_baseline(args.against) if args.against else None
    record = None  # (name, file) of the --baseline this run becomes if it passes
    kept = None    # the --baseline file compared with, which no run replaces
    if args.baseline:
        name, path = baseline_target(args.baseline)
        if path.is_file():
            baseline = (name, *read_baseline(path, f"--baseline {args.baseline}"))
            kept = path
        else:
            check_writable(path, what="--baseline")
            record = (name, path)
    if baseline and args.against_label:
        baseline = (args.against_label, *baseline[1:])
    return baseline, record, kept, threshold


def _options(args: argparse.Namespace, request, threads: list, max_thread_cost) -> dict:
    """What the bench target is told: the selection, budget, limits and directions."""
    return {"ops": list(args.ops or ()), "workloads": list(args.workloads or ()),
               "reference": args.reference, "budget_s": args.budget,
               "min_speedup": args.min_speedup if args.min_speedup is not None else 0.1,
               # the ops matrix.yaml declares slower than their reference by design
               "op_min_speedup": {op: 1 / factor for op, factor
                                  in (request.speed.get("op_factors") or {}).items()},
               "directions": ["forward"] if args.forward_only else ["forward", "backward"],
               "threads": threads, "contended": bool(getattr(args, "contended", False)),
               "max_thread_cost": max_thread_cost}


def _measure(args: argparse.Namespace, target, request, options: dict) -> dict:
    """The environment made (with --with's packages) and the workloads timed in it: the
    bench document; an interrupted run writes the rows finished so far to --json."""
    from opforge.smoke.runner import cleanup, prepare_environment, run_probe
    from opforge.torchsource import pip_index_args
    from opforge.venv import install

    env = prepare_environment(target)
    try:
        if args.extras:
            env.installs.append(f"pip install {' '.join(args.extras)}")
            # from torch's index too: a library built for that torch (torchvision) lives there
            # the torch under test stays: a library's newest release may want another one
            pin = [f"torch=={env.torch_installed}"] if env.torch_installed else []
            install(env.python, *args.extras, *pin, *pip_index_args(target.torch_index),
                    what=", ".join(args.extras))
        try:
            doc = run_probe(env, request, BENCH_TIMEOUT_S, mode=("bench",),
                            extra_argv=("--bench", json.dumps(options)),
                            parts="bench: timing the workloads")
        except KeyboardInterrupt as exc:
            # the rows finished so far, and the ones not measured, in a valid document
            partial = getattr(exc, "partial_document", None)
            if args.json and partial is not None:
                partial.update(complete=False, interrupted=True)
                write_atomic(args.json, json.dumps(partial, indent=1) + "\n")
                print(f"interrupted: {len(partial.get('rows') or [])} rows written to "
                      f"{args.json}, {len(partial.get('missing') or [])} missing",
                      file=sys.stderr)
            raise
    finally:
        cleanup(env, keep=args.keep_env)
    return doc


def _finish(args: argparse.Namespace, doc: dict, baseline, record, kept, threshold) -> int:
    """Compared with the baseline, stored, reported (terminal, --json, --summary, the job
    summary): the exit code."""
    from opforge.bench import report as benchreport
    from opforge.bench.compare import compare_to_baseline

    if baseline:
        compare_to_baseline(doc, baseline[1], baseline[0], threshold, base_machine=baseline[2])
    elif record is not None:
        doc["baseline"] = {"name": None, "note": f"{record[1]} does not exist yet: this run "
                                                 "becomes the baseline if it passes"}
    elif args.against is not None:
        doc["baseline"] = {"name": None, "note": args.against_label or "none saved yet"}
    doc["finished_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    stores = [(f"baseline {args.save}", baseline_dir() / f"{args.save}.json")] \
        if args.save else []
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
    if args.json:
        write_atomic(args.json, json.dumps(doc, indent=1) + "\n")
    summary = benchreport.markdown(doc)
    if args.summary:
        write_atomic(args.summary, summary)
    if os.environ.get("GITHUB_STEP_SUMMARY"):
        with open(os.environ["GITHUB_STEP_SUMMARY"], "a", encoding="utf-8") as fh:
            fh.write(summary)
    return benchreport.exit_code(doc)


def store(doc: dict, what: str, path: Path) -> str:
    """Save a passing run at ``path``; one line either way: saved or not, where, and why."""
    from opforge.bench import report as benchreport

    if benchreport.exit_code(doc) == 0:
        save(path, doc)
        timed = sum(1 for r in doc.get("rows", []) if "ours_s" in r)
        return f"saved this run as {what} ({path}): {timed} rows timed."
    why = benchreport.why_failed(doc)
    kept = "keeps the run saved before" if path.is_file() else "was not written"
    return f"not saved as {what}: {why}; {path} {kept}."


def _requirement(text: str) -> None:
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        Requirement(text)
    except InvalidRequirement as exc:
        raise UsageError(f"--with {text!r}: not a requirement ({exc})") from None
