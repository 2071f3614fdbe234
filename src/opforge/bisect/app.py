"""The bisect application: ``opforge bisect``'s arguments checked, the run set up and driven.

``opforge.cli.bisect`` parses the command line and calls ``run``; this module checks what was
asked (before the state, the log or an environment is touched), builds the ``Params``, the
environment cache and the ``Session``, and runs a full bisect, a ``--resume``, or one round of
a fanned-out one (``--plan`` / ``--probe``), writing the report.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shutil
import stat
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

from opforge.errors import Interrupted, OpforgeError, UsageError
from opforge.files import lookup

# options that define a bisect: on --resume they must agree with the stored ones if given
_DEFINING = ("good", "bad", "variant", "python", "index", "wheel", "match", "regress",
             "retries", "timeout", "timeout_skip", "release_index", "companions",
             "slower_than")


def python_for(spec: str | None) -> tuple[str, str]:
    """(interpreter, "X.Y") for --python: a version or a path."""
    if spec is None or spec == f"{sys.version_info[0]}.{sys.version_info[1]}":
        return sys.executable, f"{sys.version_info[0]}.{sys.version_info[1]}"
    if re.fullmatch(r"\d+\.\d+", spec):
        found = shutil.which(f"python{spec}")
        if found is None:
            raise UsageError(f"--python {spec}: no python{spec} on PATH; pass an interpreter path")
        exe = found
    else:
        exe = spec
        if lookup(exe, what="--python") is None and shutil.which(exe) is None:
            raise UsageError(f"--python {spec}: no such interpreter")
    try:
        out = subprocess.run([exe, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UsageError(f"--python {spec}: cannot run it ({exc})") from None
    if out.returncode != 0:
        raise UsageError(f"--python {spec}: cannot run it")
    return exe, out.stdout.strip()


def _params(args: argparse.Namespace):
    from opforge.bisect.index import DEFAULT_INDEX, variant_index
    from opforge.bisect.params import Params, check_endpoints, endpoint, release_version
    from opforge.bisect.releases import PYPI, release_index

    command = list(args.command or [])
    if command:
        if command[0] != "--":
            raise UsageError(f"unexpected argument {command[0]!r}: put the test command after --")
        command = command[1:]
        if not command:
            raise UsageError("-- must be followed by a command")
    variant = args.variant or "cpu"
    if not re.fullmatch(r"[a-z][a-z0-9_]*", variant):
        raise UsageError(f"--variant {variant!r}: expected a name like cpu, cu126, mps")
    good, good_note = endpoint(args.good, "good")
    bad, bad_note = endpoint(args.bad, "bad")
    tomorrow = (datetime.now(timezone.utc) + timedelta(days=1)).date().isoformat()
    check_endpoints(good, bad)
    for option, day in (("--good", good), ("--bad", bad)):
        if day is not None and "-" in day and day > tomorrow:
            raise UsageError(f"{option} {day}: that date is in the future; no nightly exists yet")
    from opforge.bisect.params import MAX_RETRIES

    if args.retries is not None and not 0 <= args.retries <= MAX_RETRIES:
        raise UsageError(f"--retries {args.retries}: expected 0 to {MAX_RETRIES}")
    if args.timeout is not None and not (0 < args.timeout < math.inf):
        raise UsageError(f"--timeout {args.timeout:g}: must be a positive number of seconds")
    if args.timeout_skip and args.timeout is None:
        raise UsageError("--timeout-skip needs --timeout")
    if args.match == "":
        args.match = None  # an empty workflow input: no signature
    if args.match:
        try:
            re.compile(args.match)
        except re.error as exc:
            raise UsageError(f"--match {args.match!r}: not a regular expression ({exc})") from None
    wheel = None
    if args.wheel:
        path = Path(args.wheel).expanduser()
        info = lookup(path, what="--wheel")
        if info is None or not stat.S_ISREG(info.st_mode) or path.suffix != ".whl":
            raise UsageError(f"--wheel {args.wheel}: no such wheel file")
        wheel = str(path.resolve())
    index = _local_index(args.index or variant_index(DEFAULT_INDEX, variant), "--index")
    releases = None
    if args.release_index or (good and release_version(good) is not None):
        releases = args.release_index or release_index(None, variant)
        if releases != PYPI:
            releases = _local_index(releases, "--release-index")
    if not command:
        _check_variant(variant)
    if args.slower_than is not None:
        _check_speed(args, command, good)
    _, version = python_for(args.python)
    return Params(good=good, bad=bad, variant=variant, python=args.python or version,
                  index=index, command=command, wheel=wheel, match=args.match,
                  regress=args.regress or "failure", retries=args.retries or 0,
                  timeout=args.timeout, timeout_skip=bool(args.timeout_skip),
                  cwd=str(Path.cwd()), notes=[n for n in (good_note, bad_note) if n],
                  release_index=releases, releases_only=bool(args.releases_only),
                  companions=_companions(args.companions), slower_than=args.slower_than)


def _companions(names: list[str] | None) -> list[str]:
    out = []
    for name in names or []:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name) or name.lower() == "torch":
            raise UsageError(f"--with {name!r}: expected a package name like torchvision")
        out.append(name.lower().replace("_", "-"))
    return sorted(set(out))


def _local_index(index: str, option: str) -> str:
    """A local index as an absolute path (a URL unchanged); a missing directory is bad input."""
    from opforge.bisect.index import is_local

    if is_local(index) and not index.startswith("file://"):
        local = Path(index).expanduser()
        info = lookup(local, what=option)
        if info is None or not stat.S_ISDIR(info.st_mode):
            raise UsageError(f"{option} {index}: no such directory")
        return str(local.resolve())
    return index


def _check_speed(args: argparse.Namespace, command: list[str], good: str | None) -> None:
    """--slower-than times the extension's workloads: no test command, a known good end."""
    from opforge.bisect.speed import workloads_of

    if command:
        raise UsageError("--slower-than times the recipes' workloads of the extension; it "
                         "takes no test command (leave out -- CMD)")
    if good is None:
        raise UsageError("--slower-than needs --good: every nightly is timed against it")
    for option, given in (("--match", args.match), ("--regress", args.regress),
                          ("--retries", args.retries)):
        if given:
            raise UsageError(f"--slower-than decides by timing, so {option} does not apply")
    workloads_of(str(Path(args.wheel).expanduser()) if args.wheel else None)


def _check_variant(variant: str) -> None:
    # the default and --wheel modes build / smoke-test with the variant of this checkout's matrix
    from opforge.matrix import MatrixError, find_matrix, load_matrix

    try:
        path = find_matrix()
    except MatrixError:
        raise UsageError(f"no matrix.yaml in {Path.cwd()} or above it: without -- CMD, bisect "
                         "builds and smoke-tests the extension of this checkout; run it in the "
                         "repository, pass --file PATH, or give the test command after --"
                         ) from None
    load_matrix(path).variant(variant)


def _resumed_params(args: argparse.Namespace, stored: dict):
    from opforge.bisect.params import Params, endpoint

    params = Params.from_json(stored)
    for name in _DEFINING:
        given = getattr(args, name)
        if given is None:
            continue
        have = getattr(params, name)
        if name == "wheel":
            given = str(Path(given).expanduser().resolve())
        if name in ("index", "release_index") and "://" not in given and given != "pypi":
            given = str(Path(given).expanduser().resolve())
        if name == "companions":
            given = _companions(given)
        if name in ("good", "bad"):
            given = endpoint(given, name)[0]
            if given is None:
                continue
        if given != have:
            raise UsageError(f"--resume: --{name.replace('_', '-')} {given} differs from the "
                             f"interrupted bisect's {have}; leave it out, or start over "
                             "with --restart")
    if args.command and args.command[1:] != params.command:
        raise UsageError("--resume: the test command differs from the interrupted bisect's")
    return params


def _destinations(args: argparse.Namespace, state_path: Path, log_path: Path) -> None:
    """Every file the bisect will write, checked before anything runs."""
    from opforge.files import check_writable

    check_writable(state_path, what="--state")
    check_writable(log_path, what="--log", append=True)
    for option, target in (("--json", args.json), ("--markdown", args.markdown)):
        if target and target != "-":
            check_writable(target, what=option)
    if args.json == "-" and args.markdown == "-":
        raise UsageError("--json and --markdown cannot both go to stdout; give one a PATH")


def _replaceable(state_path: Path, restart: bool) -> None:
    """Refuse to start over on an interrupted bisect's state unless --restart says so."""
    from opforge.bisect import state as state_mod

    if restart or not (state_path.exists() or state_path.is_symlink()):
        return
    try:
        old = state_mod.load(state_path)
    except UsageError:
        raise UsageError(f"--state {state_path}: exists and is not a bisect state this opforge "
                         "can read; pass another --state, or --restart to replace it") from None
    if old.unfinished:
        p = old.params
        raise UsageError(f"--state {state_path} holds an interrupted bisect ({len(old.steps)} "
                         f"steps done, --good {p.get('good') or '(walk back)'} --bad "
                         f"{p.get('bad') or 'latest'}): continue it with `opforge bisect "
                         "--resume`, or start over with --restart")


def _state_files(path: Path) -> list[Path]:
    """A --verdicts argument: a state file, or a directory of them (possibly empty)."""
    if path.is_dir():
        return sorted(p for p in path.glob("*.json") if p.is_file())
    return [path]


def _verdict_file(path: Path):
    """A state file of this bisect's probes (from --probe, or any run): read, or bad input."""
    from opforge.bisect import state as state_mod

    if lookup(path, what="--verdicts") is None:
        raise UsageError(f"--verdicts {path}: no such file or directory (give the state files "
                         "of the --probe runs, or a directory of them)")
    try:
        return path, state_mod.load(path)
    except UsageError as exc:
        raise UsageError(f"--verdicts {path}: {str(exc).split(': ', 1)[-1]}") from None


_SAME_BISECT = ("good", "bad", "variant", "python", "index", "release_index", "command",
                "wheel", "match", "regress")


def _round(args, session, state, verdicts, display) -> int:
    """--plan (merge the verdicts, print the next round) and --probe (test one candidate)."""
    import json

    from opforge.bisect.report import write_output

    for path, other in verdicts:
        for name in _SAME_BISECT:
            if other.params.get(name) != state.params.get(name):
                raise UsageError(f"--verdicts {path}: another bisect's ({name} "
                                 f"{other.params.get(name)!r}, here {state.params.get(name)!r})")
        known = {c.key for c in (*state.listed, *state.releases)}
        for key, step in other.steps.items():
            if key not in known:
                raise UsageError(f"--verdicts {path}: a step for {key}, which is not a "
                                 "candidate of this bisect (its index listed no such nightly "
                                 "or release)")
            state.steps.setdefault(key, step)
    with display:
        if args.probe:
            record = session.probe_key(args.probe)
            out = {"schema": 1, "status": "probed", "step": record.to_json()}
        else:
            out = session.plan(args.plan)
            session.begin()
            session.save()
    text = json.dumps(out, indent=2) + "\n"
    write_output(args.json or "-", text)
    output = os.environ.get("GITHUB_OUTPUT")
    if output and args.plan is not None:  # a workflow's next job fans out over these keys
        keys = json.dumps([p["key"] for p in out["probes"]])
        try:
            with open(output, "a", encoding="utf-8") as f:
                f.write(f"probes={keys}\nstatus={out['status']}\n")
        except OSError as exc:
            raise OpforgeError(f"$GITHUB_OUTPUT {output}: cannot write: "
                               f"{exc.strerror or exc}") from None
    return 0


def run(args: argparse.Namespace) -> int:
    from opforge.bisect import state as state_mod
    from opforge.bisect.commits import check_repo, commit_range
    from opforge.bisect.envs import EnvCache
    from opforge.bisect.index import is_local, load_index
    from opforge.bisect.releases import load_releases
    from opforge.bisect.report import Display, emit, emit_error, result_json
    from opforge.bisect.session import Session
    from opforge.paths import cache_dir

    # everything is checked before the state, the log or an environment is touched
    if args.file:
        from opforge.matrix import MATRIX_ENV, load_matrix

        load_matrix(args.file)  # one line, exit 2, when it is missing or malformed
        # the build, the smoke run and their subprocesses all find the configuration here
        os.environ[MATRIX_ENV] = str(Path(args.file).expanduser().resolve())
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
    if args.plan is not None and os.environ.get("GITHUB_OUTPUT"):
        from opforge.files import check_writable

        # checked before the state is written: a round that cannot be handed on is not taken
        check_writable(os.environ["GITHUB_OUTPUT"], what="$GITHUB_OUTPUT", append=True,
                       make_folders=False)
    state_mod.check_free(state_path, shared=bool(args.probe))  # another run holds it: exit 2
    repo = check_repo(Path(args.pytorch_repo)) if args.pytorch_repo else None
    display = Display()
    log = state_mod.StepLog(log_path)
    verdicts = [_verdict_file(f) for v in args.verdicts or [] for f in _state_files(Path(v))]
    if fan_out and not args.resume and not args.restart and state_path.exists():
        args.resume = True  # the rounds share one state file: each continues it
    if args.resume:
        saved = state_mod.load(state_path)
        params = _resumed_params(args, saved.params)
        state = saved
        state.stopped = None
        done = len(state.steps)

        def on_start() -> None:
            log.write("resume", state=str(state_path), steps_done=done)
    else:
        params = _params(args)
        _replaceable(state_path, args.restart)
        state = state_mod.BisectState(params.to_json(), [])
        if params.level == "release":
            state.releases = list(load_releases(params.release_index, params.python).releases)
        else:
            try:
                state.listed = list(load_index(params.index, params.python,
                                               companions=params.companions).nightlies)
            except UsageError:
                raise
            except OpforgeError as exc:  # an unreachable index is bad input: exit 2
                raise UsageError(str(exc)) from None

        def on_start() -> None:
            if state_path.exists():
                display.note(f"started a new bisect (replacing the state in {state_path})")
            log.write("start", params=params.to_json(), nightlies=len(state.listed),
                      releases=len(state.releases))
    exe, _ = python_for(params.python)

    def on_ready() -> None:
        if args.resume:
            display.note(f"resuming: {len(state.steps)} steps already done ({state_path})")
    pip_index = [] if is_local(params.index) else ["--index-url", params.index]
    envs = EnvCache(root, exe, pip_index, with_pip=params.mode == "build",
                    companions=params.companions)
    # bisect by speed times while nothing else of its own runs: no environments made ahead
    session = Session(params, state, state_path, log, envs, display, on_start=on_start,
                      on_ready=on_ready, prefetch=not args.no_prefetch and not params.slower_than)
    session.shared_state = bool(args.probe)
    if params.slower_than:
        from opforge.bisect.speed import SpeedJudge, workloads_of

        session.speed = SpeedJudge(params.slower_than, workloads_of(params.wheel),
                                   timeout=params.timeout)
    try:
        if fan_out:
            return _round(args, session, state, verdicts, display)
        try:
            with display:
                try:
                    outcome = session.run()
                finally:
                    if session.speed is not None:
                        session.speed.close()
                commits = commit_range(outcome.last_good.git_version, outcome.first_bad.git_version,
                                       repo)
                if args.by_commit:
                    outcome = session.bisect_commits(outcome, commits)
        except KeyboardInterrupt as exc:
            if not session.started:
                raise
            signame = exc.name if isinstance(exc, Interrupted) else "SIGINT"
            state.stopped = "interrupted"
            session.save()
            display.note(f"interrupted ({signame}) after {len(state.steps)} finished steps; "
                         "`opforge bisect --resume` continues without repeating them")
            log.write("interrupted", signal=signame, steps_done=len(state.steps))
            raise
        except UsageError:
            raise  # bad input or an unusable saved state: exit 2, nothing is written
        except OpforgeError as exc:
            if not session.started:  # nothing was tested: nothing is written
                raise
            # CI attaches the report wherever the bisect ends: say what was tested and why it stopped
            state.stopped = "error"
            session.save()
            log.write("error", message=str(exc), steps_done=len(state.steps))
            emit_error(str(exc), list(state.steps.values()), json_to=args.json,
                       markdown_to=args.markdown)
            raise
        data = result_json(outcome, commits, f"python{params.python}"
                           if re.fullmatch(r"\d+\.\d+", params.python) else exe, envs,
                           list(state.steps.values()))
        data["probes_this_run"] = session.probed_now
        if session.speed is not None:
            data["speed"] = session.speed.report()
        state.result = data
        session.claim()
        state_mod.save(state, state_path)
        log.write("done", result=data)
        emit(data, json_to=args.json, markdown_to=args.markdown)
        return 0
    finally:  # an in-process caller (tests, an embedding tool) may run another bisect
        session.close()
