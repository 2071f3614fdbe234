"""``opforge bench``: time a wheel's ops against their references, where users run them."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from datetime import datetime, timezone
from pathlib import Path

from opforge.cli.smoke import _csv, add_target_arguments
from opforge.errors import UsageError
from opforge.files import check_writable, write_atomic

_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}\Z")
# every workload of every op on every device, large ones included, on a slow machine: the
# smoke probe's 900 s is too short (measured: six ops with large workloads on a loaded 2-core CPU took longer)
BENCH_TIMEOUT_S = 3 * 3600
# a row's timing budget: rounds stop once it is spent (at least 5 rounds)
DEFAULT_BUDGET_S = 0.3


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value < 3600:
        raise argparse.ArgumentTypeError(f"{text!r}: a positive number of seconds below 3600")
    return value


def _positive_ratio(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: a positive, finite ratio (0.1 = ten "
                                         "times slower than the reference)")
    return value


def _baseline_name(text: str) -> str:
    if not _NAME.match(text):
        raise argparse.ArgumentTypeError(f"{text!r}: a baseline name is letters, digits, "
                                         "'.', '_' and '-' (at most 64)")
    return text


def _factor(text: str) -> float:
    value = _positive_ratio(text)
    if value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a factor greater than 1 (1.5 = half as "
                                         "fast again)")
    return value


def baseline_dir() -> Path:
    from opforge.paths import cache_dir

    return cache_dir() / "bench"


# ----------------------------------------------------------------- baseline files: all I/O here


def read_baseline(path: Path, label: str) -> tuple[dict, str | None]:
    """(the saved run's rows by key, the machine it ran on) of the baseline at ``path``."""
    from opforge import baselines
    from opforge.files import read_json
    from opforge.smoke.benchreport import baseline_rows, machine

    doc = read_json(path, what=label)
    if isinstance(doc, dict) and isinstance(doc.get("rows"), list):
        # 1e999, a string, a list as a key: one line, before any row is used
        baselines.check_rows([r for r in doc["rows"] if isinstance(r, dict)], label)
    return baseline_rows(doc, label), machine(doc)


def write_baseline(path: Path, doc: dict) -> None:
    """Store a run as a baseline: whole or not at all, one writer at a time."""
    from opforge import baselines

    baselines.save(path, doc)


# -----------------------------------------------------------------


def load_baseline(text: str) -> tuple[str, dict, str | None]:
    """(the name shown, the saved rows by key, the machine it ran on) of ``--against
    NAME|FILE`` (UsageError if there is none)."""
    saved = baseline_dir() / f"{text}.json"
    if _NAME.match(text) and saved.is_file():
        return (text, *read_baseline(saved, f"baseline {text}"))
    if text.endswith(".json"):
        return (text, *read_baseline(Path(text), f"--against {text}"))
    known = sorted(p.stem for p in baseline_dir().glob("*.json")) if baseline_dir().is_dir() \
        else []
    raise UsageError(f"--against {text!r}: no such baseline (saved: "
                     f"{', '.join(known) or 'none'}; a baseline is saved with --save NAME, "
                     "or give an earlier run's --json FILE)")


def baseline_target(text: str) -> tuple[str, Path]:
    """(the name shown, the file) of ``--baseline NAME|FILE``: a path (it ends in .json or
    names a folder) as given, else a name under the baseline folder."""
    if text.endswith(".json") or "/" in text or os.sep in text:
        return text, Path(text)
    if not _NAME.match(text):
        raise UsageError(f"--baseline {text!r}: a baseline name is letters, digits, '.', '_' "
                         "and '-' (at most 64), or a path ending in .json")
    return text, baseline_dir() / f"{text}.json"


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "bench", help="time the recipes' workloads against their references in a fresh env",
        description="Install the wheel in a fresh virtual environment as `opforge smoke` does, "
                    "then time every workload of the recipes file on every present device, "
                    "forward and backward, against its reference (another library's function, "
                    "or the op's own CPU kernel): torch.utils.benchmark, the sides in "
                    "alternation, the median of paired ratios, a noise estimate (ours against "
                    "itself). Each row first checks that the sides agree. Exit 0 pass, 1 a row "
                    "failed (disagreement, error), 2 usage.")
    add_target_arguments(p)
    p.add_argument("--with", dest="extras", action="append", default=[], metavar="REQ",
                   help="also install this requirement (e.g. torchvision, for the references); "
                        "repeatable")
    p.add_argument("--ops", type=_csv, metavar="OP1,OP2", help="bench only these ops")
    p.add_argument("--workloads", type=_csv, metavar="NAME,...",
                   help="only these workloads (e.g. small,medium)")
    p.add_argument("--reference", choices=("recipe", "cpu"), default="recipe",
                   help="recipe: each workload's reference (default); cpu: the op's own CPU "
                        "kernel")
    p.add_argument("--min-speedup", type=_positive_ratio, default=None, metavar="X",
                   help="fail a row slower than the reference by more than 1/X beyond its "
                        "noise (default 0.1: ten times slower; an op matrix.yaml gives its own "
                        "max_slowdown, slower by design, takes 1/max_slowdown instead)")
    p.add_argument("--forward-only", action="store_true", help="skip the backward rows")
    p.add_argument("--budget", type=_positive_seconds, default=DEFAULT_BUDGET_S, metavar="S",
                   help=f"seconds of timing per row (default {DEFAULT_BUDGET_S}; at least 5 "
                        "rounds)")
    p.add_argument("--device-checks", choices=("auto", "skip"), default="auto",
                   help="auto: every present device; skip: CPU only")
    p.add_argument("--json", type=Path, metavar="PATH", help="write the JSON document here")
    p.add_argument("--summary", type=Path, metavar="PATH",
                   help="write the Markdown summary (table and speed-up charts) here "
                        "(also appended to $GITHUB_STEP_SUMMARY when set)")
    p.add_argument("--save", metavar="NAME", type=_baseline_name,
                   help="store this run as baseline NAME (under $OPFORGE_CACHE_DIR/bench)")
    p.add_argument("--against", metavar="NAME|FILE",
                   help="compare with baseline NAME (or a --json FILE of an earlier run): "
                        "fail a row whose speed-up fell by more than --regression beyond noise")
    p.add_argument("--baseline", metavar="NAME|FILE",
                   help="compare with this baseline as --against does when it exists; when it "
                        "does not, record this run as it if the run passes (a canary's first "
                        "green run); a failing run never replaces it")
    p.add_argument("--against-label", metavar="TEXT",
                   help="how the report names the --against / --baseline baseline (e.g. the "
                        "run it came from); an empty --against means there is none yet")
    p.add_argument("--regression", type=_factor, default=1.5, metavar="X",
                   help="with --against: the slowdown a row may show (default 1.5)")
    # smoke's options that bench does not take
    p.set_defaults(func=run, expect_keys=None, internal_ops=None, junit=None, speed_check="skip")


def run(args: argparse.Namespace) -> int:
    from opforge.cli.smoke import resolve
    from opforge.smoke import benchreport
    from opforge.smoke.runner import cleanup, prepare_environment, run_probe
    from opforge.torchsource import pip_index_args
    from opforge.venv import install

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
    if args.save:
        check_writable(baseline_dir() / f"{args.save}.json", what="--save")
    target, request, _variant = resolve(args)
    if request.recipes is None:
        raise UsageError("no recipes file: name one in matrix.yaml (extension.recipes) or "
                         "pass --recipes FILE (its workloads are what bench times)")
    options = {"ops": list(args.ops or ()), "workloads": list(args.workloads or ()),
               "reference": args.reference, "budget_s": args.budget,
               "min_speedup": args.min_speedup if args.min_speedup is not None else 0.1,
               # the ops matrix.yaml declares slower than their reference by design
               "op_min_speedup": {op: 1 / factor for op, factor
                                  in (request.speed.get("op_factors") or {}).items()},
               "directions": ["forward"] if args.forward_only else ["forward", "backward"]}
    print(f"opforge bench: {target.describe()}"
          + (f" with {', '.join(args.extras)}" if args.extras else ""), file=sys.stderr,
          flush=True)
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
                            extra_argv=("--bench", json.dumps(options)))
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
    if baseline:
        benchreport.compare_to_baseline(doc, baseline[1], baseline[0], args.regression,
                                        base_machine=baseline[2])
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
    from opforge.smoke import benchreport

    if benchreport.exit_code(doc) == 0:
        write_baseline(path, doc)
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
