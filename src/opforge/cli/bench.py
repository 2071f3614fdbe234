"""``opforge bench``: time a wheel's ops against their references, where users run them."""

from __future__ import annotations

import argparse
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING

from opforge.bench.baselines import NAME
from opforge.bench.compare import DEFAULT_REGRESSION
from opforge.cli.args import comma_list
from opforge.cli.smoke import add_target_arguments, options_of

if TYPE_CHECKING:
    from opforge.bench.run import BenchOptions

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
    if not NAME.match(text):
        raise argparse.ArgumentTypeError(f"{text!r}: a baseline name is letters, digits, "
                                         "'.', '_' and '-' (at most 64)")
    return text


def _factor(text: str) -> float:
    value = _positive_ratio(text)
    if value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a factor greater than 1 (1.5 = half as "
                                         "fast again)")
    return value


def _thread_counts(text: str) -> list[int]:
    try:
        counts = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: thread counts such as 1,2") from None
    if not counts or counts[0] < 1 or counts[-1] > 1024:
        raise argparse.ArgumentTypeError(f"{text!r}: thread counts between 1 and 1024, "
                                         "such as 1,2")
    return counts


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
    p.add_argument("--ops", type=comma_list, metavar="OP1,OP2",
                   help="bench only these ops (each an op of the recipes file with workloads: "
                        "another name exits 2)")
    p.add_argument("--workloads", type=comma_list, metavar="NAME,...",
                   help="only these workloads (e.g. small,medium; each a workload of a chosen "
                        "op: another name exits 2)")
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
    p.add_argument("--threads", type=_thread_counts, metavar="N,M",
                   help="time every CPU row at each of these torch thread counts (e.g. 1,2); "
                        "each later count's row reports its time over the first count's "
                        "(thread cost)")
    p.add_argument("--contended", action="store_true",
                   help="time the CPU rows while busy processes hold every core this process "
                        "may use (a busy CI runner): a row that waits on a thread shows a "
                        "thread cost above 1")
    p.add_argument("--max-thread-cost", type=_positive_ratio, metavar="X",
                   help="with --threads N,M,...: fail a row whose time at a later count is more "
                        "than X times its time at the first count, beyond noise (e.g. 1.2)")
    p.add_argument("--json", type=Path, metavar="PATH", help="write the JSON document here")
    p.add_argument("--summary", type=Path, metavar="PATH",
                   help="write the Markdown summary (table and speed-up charts) here "
                        "(also appended to $GITHUB_STEP_SUMMARY when set)")
    p.add_argument("--save", metavar="NAME", type=_baseline_name,
                   help="store this run as baseline NAME (under $OPFORGE_CACHE_DIR/bench)")
    p.add_argument("--against", metavar="NAME|FILE",
                   help="compare with baseline NAME (or a --json FILE of an earlier run): "
                        "fail a row whose own time grew by more than --regression beyond noise while "
                        "its reference did not (a reference that moved alone warns)")
    p.add_argument("--baseline", metavar="NAME|FILE",
                   help="compare with this baseline as --against does when it exists; when it "
                        "does not, record this run as it if the run passes (a canary's first "
                        "green run); a failing run never replaces it")
    p.add_argument("--against-label", metavar="TEXT",
                   help="how the report names the --against / --baseline baseline (e.g. the "
                        "run it came from); an empty --against means there is none yet")
    p.add_argument("--regression", type=_factor, default=None, metavar="X",
                   help="with --against or --baseline: the slowdown of our own time a row may "
                        f"show (default {DEFAULT_REGRESSION})")
    # smoke's options that bench does not take
    p.set_defaults(func=run, expect_keys=None, internal_ops=None, junit=None, speed_check="skip")


def bench_options_of(args: argparse.Namespace) -> BenchOptions:
    """The parsed arguments as bench's options: the target's (``options_of``, shared with
    `opforge smoke`) and bench's own (a list becomes a tuple)."""
    # the application's module, imported when the command runs: not at startup (~6 ms)
    from opforge.bench.run import BenchOptions

    own = {f.name: getattr(args, f.name) for f in fields(BenchOptions) if f.name != "target"}
    return BenchOptions(target=options_of(args),
                        **{name: tuple(value) if isinstance(value, list) else value
                           for name, value in own.items()})


def run(args: argparse.Namespace) -> int:
    # the application, imported when the command runs: not at startup (~6 ms)
    from opforge.bench.run import run as run_bench

    return run_bench(bench_options_of(args))
