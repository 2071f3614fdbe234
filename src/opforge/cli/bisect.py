"""``opforge bisect``: find the PyTorch nightly, and the commit range, where a regression appeared."""

from __future__ import annotations

import argparse

DESCRIPTION = """\
Test PyTorch nightlies between a good and a bad date by halving, like git bisect, and report
the last good and first bad nightly with their commits. The test is, by default, building the
extension from this checkout against the nightly and running the smoke test; --wheel PATH
installs a prebuilt wheel beside each nightly instead; `-- CMD ...` runs any command in the
nightly's environment (exit 0 good, 125 skip, 1-127 bad, 128 and above abort). Builds go
through the compiler cache, as `opforge build`'s do (a nightly never reuses another torch's
objects; a rerun of one reuses its own); OPFORGE_COMPILER_CACHE=off compiles everything.
"""

EPILOG = """\
examples:
  opforge bisect --good 2024-06-01 --bad 2024-06-10
  opforge bisect --bad 2024-06-10 --wheel dist/cpu/my_ops-1.0+cpu-*.whl
  opforge bisect --good 2024-06-01 --bad 2024-06-10 --match 'does not exist' -- \\
      python -c 'import torch, my_ops; torch.ops.my_ops.my_op'
  opforge bisect --good 2024-06-01 --wheel my_ops.whl -- python -m pytest tests/test_ops.py
  opforge bisect --resume

With --wheel and a command, the command tests the wheel; the command runs with the nightly's
environment activated (PATH, VIRTUAL_ENV; PYTHONPATH removed) in the current directory.
"""


def slower_than(text: str) -> float:
    """``--slower-than``'s argument: a finite factor greater than 1."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number (a slowdown factor such "
                                         "as 1.5)") from None
    if not 1 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: a slowdown factor greater than 1 (2 = "
                                         "twice as slow as on the good nightly)")
    return value


def register(subparsers) -> argparse.ArgumentParser:
    # Long by design: one add_argument per option with its help, read top to bottom as the
    # command's reference; split, one command's options would be scattered.
    p = subparsers.add_parser("bisect", help="find the nightly where a regression appeared",
                              description=DESCRIPTION, epilog=EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--good", metavar="DATE|VERSION",
                   help="a nightly that passes (YYYY-MM-DD, a nightly version, or an `opforge "
                        "smoke --json` report naming it), or a release (2.10.0); left out: walk "
                        "back from --bad (2 days, a week, then two weeks at a time) until one "
                        "passes")
    p.add_argument("--bad", metavar="DATE|VERSION",
                   help="a nightly that fails (the same forms, or latest: the default, the "
                        "newest nightly), or a release (2.14.1; left out with a release --good: "
                        "the newest release). Between two releases the bisect finds the first "
                        "bad release, then goes on into the nightlies between it and the last "
                        "good one when --index lists them")
    p.add_argument("--with", dest="companions", action="append", metavar="NAME",
                   help="install a companion package (torchvision, torchaudio, triton, ...) built "
                        "for the same nightly date or release beside torch; a date without one is "
                        "skipped, and said so (repeatable)")
    p.add_argument("--release-index", metavar="URL|DIR|pypi",
                   help="where releases are listed and installed from (default "
                        "https://download.pytorch.org/whl/<variant>; release candidates are on "
                        ".../whl/test/<variant>; pypi: the index pip is configured with)")
    p.add_argument("--releases-only", action="store_true", default=None,
                   help="stop at the release boundary; do not go on into the nightlies")
    p.add_argument("--variant", help="the variant whose nightly index is used and, by default, "
                                     "built (cpu, cu126, ..., mps; default cpu)")
    p.add_argument("--python", help="Python version (3.11) or interpreter path for the "
                                    "nightly environments (default: this interpreter)")
    p.add_argument("--index", metavar="URL|DIR",
                   help="the variant's nightly index: https URL (PEP 503/691), file:// URL or "
                        "directory (default https://download.pytorch.org/whl/nightly/<variant>)")
    p.add_argument("--file", metavar="PATH",
                   help="matrix file of the extension built and smoke-tested without -- CMD "
                        "(default: $OPFORGE_MATRIX, else matrix.yaml from the working "
                        "directory up)")
    p.add_argument("--wheel", metavar="PATH", help="install this prebuilt wheel beside each "
                                                   "nightly instead of building the extension")
    p.add_argument("--match", metavar="REGEX", help="count a failure as bad only when its output "
                                                    "matches; other failures are skipped")
    p.add_argument("--regress", choices=("failure", "success"),
                   help="what the newer nightlies do: failure (default) or success (find where "
                        "something started to work)")
    p.add_argument("--retries", type=int, metavar="N", help="rerun a failing probe up to N "
                                                           "times (flaky tests; default 0)")
    p.add_argument("--timeout", type=float, metavar="SECONDS",
                   help="bound each probe; a timeout counts as a failure")
    p.add_argument("--timeout-skip", action="store_true", default=None,
                   help="count a timeout as a skip instead")
    p.add_argument("--no-prefetch", action="store_true",
                   help="do not make the environments the next step may need while a probe "
                        "runs (by default they are made in the background, one at a time)")
    p.add_argument("--plan", type=int, metavar="K",
                   help="probe nothing: record the --verdicts given, then print (JSON) the next "
                        "K candidates to test side by side, one machine each (`--probe KEY` on "
                        "each); status done: `--resume` writes the report. The state file is "
                        "the one a local run uses, so either can continue the other")
    p.add_argument("--probe", metavar="KEY",
                   help="test one candidate (a date or a release from a --plan) and record it "
                        "in --state; --json PATH gets its verdict")
    p.add_argument("--verdicts", nargs="+", metavar="STATE|DIR",
                   help="with --plan: state files written by --probe runs (or by any run of "
                        "this bisect), or directories of them, whose steps are merged in first")
    p.add_argument("--slower-than", type=slower_than, metavar="RATIO",
                   help="bisect by speed: a candidate is bad when a workload of the recipes "
                        "runs RATIO times slower than on --good (timed in the same run, paired "
                        "rounds against the good end's environment); needs --good, not with "
                        "-- CMD, --plan, --probe or --by-commit")
    p.add_argument("--resume", action="store_true",
                   help="continue the interrupted bisect without repeating finished steps")
    p.add_argument("--restart", action="store_true",
                   help="start a new bisect even though the state file holds an interrupted "
                        "one (it is replaced once the new bisect's endpoints check out)")
    p.add_argument("--pytorch-repo", metavar="PATH",
                   help="a local pytorch clone (with its nightly branch): map the nightlies to "
                        "main-branch commits and list the commits in between")
    p.add_argument("--by-commit", action="store_true",
                   help="with --pytorch-repo: after the nightly boundary, bisect the main-branch "
                        "commits between the two nightlies by overlaying each commit's Python "
                        "files on the bad nightly's binaries; commits that change compiled code "
                        "are skipped and named")
    p.add_argument("--json", nargs="?", const="-", metavar="PATH",
                   help="write the report as JSON (to stdout, or to PATH)")
    p.add_argument("--markdown", nargs="?", const="-", metavar="PATH",
                   help="write the report as Markdown for an issue (to stdout, or to PATH)")
    p.add_argument("--log", metavar="PATH", help="JSON-lines log of every step "
                                                 "(default: beside the state file)")
    p.add_argument("--state", metavar="PATH", help="the state file (default: "
                                                   "<cache>/bisect/state.json)")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ...",
                   help="the test command, run in each nightly's environment")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    # the application, imported when the command runs: not at startup (~15 ms)
    from opforge.bisect.app import run as run_bisect
    from opforge.bisect.request import request_from

    return run_bisect(request_from(args))
