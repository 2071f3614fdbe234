"""What ``opforge bisect`` was asked, checked once: the typed request the application runs.

``request_from`` turns the command line (an argparse Namespace) into a frozen
``BisectRequest`` and does every check that needs nothing written: the options that do not go
together, the state, log and report paths, ``$GITHUB_OUTPUT``, a state another run holds,
``--pytorch-repo``, ``--file``'s matrix. Bad input is a ``UsageError`` (exit 2) before the
state, the log or an environment is touched. Nothing here writes ``os.environ``: the matrix
of ``--file`` travels in the request, and from there to the build, the smoke run and every
command run in a nightly's environment (as their ``$OPFORGE_MATRIX``).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

from opforge.bisect import state as state_mod
from opforge.bisect.commits import check_repo
from opforge.errors import UsageError
from opforge.files import check_writable
from opforge.matrix import load_matrix
from opforge.paths import cache_dir


@dataclass(frozen=True)
class BisectRequest:
    """One ``opforge bisect`` run, as asked (the defining options as given: None = not given)."""

    cache: Path  # the cache the environments and builds live in
    state_path: Path
    log_path: Path
    # what the bisect is (checked and stored in ``Params``, compared on --resume)
    good: str | None = None
    bad: str | None = None
    variant: str | None = None
    python: str | None = None
    index: str | None = None
    wheel: str | None = None
    match: str | None = None  # "" (an empty workflow input) is None: no signature
    regress: str | None = None
    retries: int | None = None
    timeout: float | None = None
    timeout_skip: bool | None = None
    release_index: str | None = None
    releases_only: bool | None = None
    companions: tuple[str, ...] | None = None
    slower_than: float | None = None
    command: tuple[str, ...] = ()  # as typed: "--" and the test command, or nothing
    # how this run goes
    matrix: str | None = None  # --file, resolved: the extension's matrix for this run
    resume: bool = False  # --resume, or a --plan / --probe round continuing the state
    restart: bool = False
    plan: int | None = None
    probe: str | None = None
    verdicts: tuple[Path, ...] = ()  # the state files of --verdicts (directories listed)
    by_commit: bool = False
    pytorch_repo: Path | None = None  # checked: a git repository
    no_prefetch: bool = False
    # where it goes (the state, the log, the reports)
    json: str | None = None  # "-": stdout
    markdown: str | None = None
    github_output: str | None = None  # $GITHUB_OUTPUT: where a --plan hands its keys on

    @property
    def fan_out(self) -> bool:
        """One round of a fanned-out bisect (--plan or --probe), not a whole one."""
        return self.plan is not None or bool(self.probe)


def request_from(args: argparse.Namespace) -> BisectRequest:
    """The request of a parsed ``opforge bisect`` command line, every check done."""
    matrix = None
    if args.file:
        load_matrix(args.file)  # one line, exit 2, when it is missing or malformed
        # the build, the smoke run and their subprocesses all find the configuration here
        matrix = str(Path(args.file).expanduser().resolve())
    if args.resume and args.restart:
        raise UsageError("--resume continues the saved bisect, --restart replaces it: pick one")
    if args.slower_than and (args.plan is not None or args.probe or args.by_commit):
        raise UsageError("--slower-than times every candidate against --good in one run: it "
                         "does not go with --plan, --probe or --by-commit")
    if args.by_commit and not args.pytorch_repo:
        raise UsageError("--by-commit needs --pytorch-repo PATH (a local pytorch clone with its "
                         "nightly branch): the commits' Python files come from it")
    if args.plan is not None and (args.plan < 1 or args.plan > 256):
        raise UsageError(f"--plan {args.plan}: give a number of probes per round from 1 to 256")
    if args.plan is not None and args.probe:
        raise UsageError("--plan prints a round, --probe runs one of its probes: pick one")
    if args.verdicts and args.plan is None:
        raise UsageError("--verdicts goes with --plan (the verdicts of the last round)")
    fan_out = args.plan is not None or bool(args.probe)
    root = cache_dir()
    state_path = Path(args.state).expanduser() if args.state else root / "bisect" / "state.json"
    if not state_path.name or state_path.name == ".." or state_path.name.endswith("/"):
        raise UsageError(f"--state {args.state}: a directory; give a file path")
    log_path = Path(args.log).expanduser() if args.log else state_path.with_suffix(".log.jsonl")
    _destinations(args, state_path, log_path)
    github_output = os.environ.get("GITHUB_OUTPUT") or None
    if args.plan is not None and github_output:
        # checked before the state is written: a round that cannot be handed on is not taken
        check_writable(github_output, what="$GITHUB_OUTPUT", append=True, make_folders=False)
    state_mod.check_free(state_path, shared=bool(args.probe))  # another run holds it: exit 2
    repo = check_repo(Path(args.pytorch_repo)) if args.pytorch_repo else None
    verdicts = tuple(f for v in args.verdicts or [] for f in _state_files(Path(v)))
    resume = bool(args.resume)
    if fan_out and not args.resume and not args.restart and state_path.exists():
        resume = True  # the rounds share one state file: each continues it
    return BisectRequest(
        good=args.good, bad=args.bad, variant=args.variant, python=args.python,
        index=args.index, wheel=args.wheel, match=args.match or None, regress=args.regress,
        retries=args.retries, timeout=args.timeout, timeout_skip=args.timeout_skip,
        release_index=args.release_index, releases_only=args.releases_only,
        companions=tuple(args.companions) if args.companions is not None else None,
        slower_than=args.slower_than, command=tuple(args.command or ()), matrix=matrix,
        resume=resume, restart=bool(args.restart), plan=args.plan, probe=args.probe,
        verdicts=verdicts, by_commit=bool(args.by_commit), pytorch_repo=repo,
        no_prefetch=bool(args.no_prefetch), cache=root, state_path=state_path,
        log_path=log_path, json=args.json, markdown=args.markdown, github_output=github_output)


def _destinations(args: argparse.Namespace, state_path: Path, log_path: Path) -> None:
    """Every file the bisect will write, checked before anything runs."""
    check_writable(state_path, what="--state")
    check_writable(log_path, what="--log", append=True)
    for option, target in (("--json", args.json), ("--markdown", args.markdown)):
        if target and target != "-":
            check_writable(target, what=option)
    if args.json == "-" and args.markdown == "-":
        raise UsageError("--json and --markdown cannot both go to stdout; give one a PATH")


def _state_files(path: Path) -> list[Path]:
    """A --verdicts argument: a state file, or a directory of them (possibly empty)."""
    if path.is_dir():
        return sorted(p for p in path.glob("*.json") if p.is_file())
    return [path]


__all__ = ["BisectRequest", "request_from"]
