"""The bisect application: ``opforge bisect``'s request run, from set-up to the report.

``opforge.cli.bisect`` parses the command line, makes it a ``BisectRequest`` (request.py: the
options checked, before the state, the log or an environment is touched) and calls ``run``;
this module builds the ``Params`` (checked too, before anything is written), the environment
cache and the ``Session``, and runs a full bisect, a ``--resume``, or one round of a
fanned-out one (``--plan`` / ``--probe``), writing the report.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import stat
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

from opforge.bisect import state as state_mod
from opforge.bisect.commits import commit_range
from opforge.bisect.envs import EnvCache
from opforge.bisect.index import DEFAULT_INDEX, is_local, load_index, variant_index
from opforge.bisect.params import MAX_RETRIES, Params, check_endpoints, endpoint, release_version
from opforge.bisect.releases import PYPI, load_releases, release_index
from opforge.bisect.report import Display, emit, emit_error, result_json, write_output
from opforge.bisect.session import Session
from opforge.errors import Interrupted, OpforgeError, UsageError
from opforge.files import lookup
from opforge.matrix import MatrixError, find_matrix, load_matrix

from .request import BisectRequest

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


def _params(request: BisectRequest):
    command = list(request.command)
    if command:
        if command[0] != "--":
            raise UsageError(f"unexpected argument {command[0]!r}: put the test command after --")
        command = command[1:]
        if not command:
            raise UsageError("-- must be followed by a command")
    variant = request.variant or "cpu"
    if not re.fullmatch(r"[a-z][a-z0-9_]*", variant):
        raise UsageError(f"--variant {variant!r}: expected a name like cpu, cu126, mps")
    good, good_note = endpoint(request.good, "good")
    bad, bad_note = endpoint(request.bad, "bad")
    tomorrow = (datetime.now(timezone.utc) + timedelta(days=1)).date().isoformat()
    check_endpoints(good, bad)
    for option, day in (("--good", good), ("--bad", bad)):
        if day is not None and "-" in day and day > tomorrow:
            raise UsageError(f"{option} {day}: that date is in the future; no nightly exists yet")

    if request.retries is not None and not 0 <= request.retries <= MAX_RETRIES:
        raise UsageError(f"--retries {request.retries}: expected 0 to {MAX_RETRIES}")
    if request.timeout is not None and not (0 < request.timeout < math.inf):
        raise UsageError(f"--timeout {request.timeout:g}: must be a positive number of seconds")
    if request.timeout_skip and request.timeout is None:
        raise UsageError("--timeout-skip needs --timeout")
    if request.match:  # "" (an empty workflow input) is None in the request: no signature
        try:
            re.compile(request.match)
        except re.error as exc:
            raise UsageError(f"--match {request.match!r}: not a regular expression "
                             f"({exc})") from None
    wheel = None
    if request.wheel:
        path = Path(request.wheel).expanduser()
        info = lookup(path, what="--wheel")
        if info is None or not stat.S_ISREG(info.st_mode) or path.suffix != ".whl":
            raise UsageError(f"--wheel {request.wheel}: no such wheel file")
        wheel = str(path.resolve())
    index = _local_index(request.index or variant_index(DEFAULT_INDEX, variant), "--index")
    releases = None
    if request.release_index or (good and release_version(good) is not None):
        releases = request.release_index or release_index(None, variant)
        if releases != PYPI:
            releases = _local_index(releases, "--release-index")
    if not command:
        _check_variant(variant, request.matrix)
    if request.slower_than is not None:
        _check_speed(request, command, good)
    _, version = python_for(request.python)
    return Params(good=good, bad=bad, variant=variant, python=request.python or version,
                  index=index, command=command, wheel=wheel, match=request.match,
                  regress=request.regress or "failure", retries=request.retries or 0,
                  timeout=request.timeout, timeout_skip=bool(request.timeout_skip),
                  cwd=str(Path.cwd()), notes=[n for n in (good_note, bad_note) if n],
                  release_index=releases, releases_only=bool(request.releases_only),
                  companions=_companions(request.companions),
                  slower_than=request.slower_than)


def _companions(names: tuple[str, ...] | list[str] | None) -> list[str]:
    out = []
    for name in names or []:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name) or name.lower() == "torch":
            raise UsageError(f"--with {name!r}: expected a package name like torchvision")
        out.append(name.lower().replace("_", "-"))
    return sorted(set(out))


def _local_index(index: str, option: str) -> str:
    """A local index as an absolute path (a URL unchanged); a missing directory is bad input."""
    if is_local(index) and not index.startswith("file://"):
        local = Path(index).expanduser()
        info = lookup(local, what=option)
        if info is None or not stat.S_ISDIR(info.st_mode):
            raise UsageError(f"{option} {index}: no such directory")
        return str(local.resolve())
    return index


def _check_speed(request: BisectRequest, command: list[str], good: str | None) -> None:
    """--slower-than times the extension's workloads: no test command, a known good end."""
    # bisect by speed only (--slower-than): its module is not needed otherwise
    from opforge.bisect.speed import workloads_of

    if command:
        raise UsageError("--slower-than times the recipes' workloads of the extension; it "
                         "takes no test command (leave out -- CMD)")
    if good is None:
        raise UsageError("--slower-than needs --good: every nightly is timed against it")
    for option, given in (("--match", request.match), ("--regress", request.regress),
                          ("--retries", request.retries)):
        if given:
            raise UsageError(f"--slower-than decides by timing, so {option} does not apply")
    workloads_of(str(Path(request.wheel).expanduser()) if request.wheel else None,
                 request.matrix)


def _check_variant(variant: str, matrix: str | None) -> None:
    # the default and --wheel modes build / smoke-test with the variant of this checkout's matrix
    try:
        path = Path(matrix) if matrix else find_matrix()
    except MatrixError:
        raise UsageError(f"no matrix.yaml in {Path.cwd()} or above it: without -- CMD, bisect "
                         "builds and smoke-tests the extension of this checkout; run it in the "
                         "repository, pass --file PATH, or give the test command after --"
                         ) from None
    load_matrix(path).variant(variant)


def _resumed_params(request: BisectRequest, stored: dict):
    params = Params.from_json(stored)
    for name in _DEFINING:
        given = getattr(request, name)
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
    if request.command and list(request.command[1:]) != params.command:
        raise UsageError("--resume: the test command differs from the interrupted bisect's")
    return params


def _replaceable(state_path: Path, restart: bool) -> None:
    """Refuse to start over on an interrupted bisect's state unless --restart says so."""
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


def _verdict_file(path: Path):
    """A state file of this bisect's probes (from --probe, or any run): read, or bad input."""
    if lookup(path, what="--verdicts") is None:
        raise UsageError(f"--verdicts {path}: no such file or directory (give the state files "
                         "of the --probe runs, or a directory of them)")
    try:
        return path, state_mod.load(path)
    except UsageError as exc:
        raise UsageError(f"--verdicts {path}: {str(exc).split(': ', 1)[-1]}") from None


_SAME_BISECT = ("good", "bad", "variant", "python", "index", "release_index", "command",
                "wheel", "match", "regress")


def _round(request: BisectRequest, session, verdicts) -> int:
    """--plan (merge the verdicts, print the next round) and --probe (test one candidate)."""
    state, display = session.state, session.display
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
        if request.probe:
            record = session.probe_key(request.probe)
            out = {"schema": 1, "status": "probed", "step": record.to_json()}
        else:
            out = session.plan(request.plan)
            session.begin()
            session.save()
    text = json.dumps(out, indent=2) + "\n"
    write_output(request.json or "-", text)
    output = request.github_output
    if output and request.plan is not None:  # a workflow's next job fans out over these keys
        keys = json.dumps([p["key"] for p in out["probes"]])
        try:
            with open(output, "a", encoding="utf-8") as f:
                f.write(f"probes={keys}\nstatus={out['status']}\n")
        except OSError as exc:
            raise OpforgeError(f"$GITHUB_OUTPUT {output}: cannot write: "
                               f"{exc.strerror or exc}") from None
    return 0


def run(request: BisectRequest) -> int:
    """Run the bisect ``request`` asks for: a whole one (or its --resume), or one round."""
    session, verdicts = _set_up(request)
    try:
        if request.fan_out:
            return _round(request, session, verdicts)
        return _linear(request, session)
    finally:  # an in-process caller (tests, an embedding tool) may run another bisect
        session.close()


def _set_up(request: BisectRequest):
    """The session of this run (its params, state, log, environments), and the verdicts
    of --verdicts, read; still nothing written."""
    display = Display()
    log = state_mod.StepLog(request.log_path)
    verdicts = [_verdict_file(f) for f in request.verdicts]
    params, state, on_start = _begin(request, log, display)
    exe, _ = python_for(params.python)

    def on_ready() -> None:
        if request.resume:
            display.note(f"resuming: {len(state.steps)} steps already done "
                         f"({request.state_path})")
    pip_index = [] if is_local(params.index) else ["--index-url", params.index]
    envs = EnvCache(request.cache, exe, pip_index, with_pip=params.mode == "build",
                    companions=params.companions)
    # bisect by speed times while nothing else of its own runs: no environments made ahead
    session = Session(params, state, request.state_path, log, envs, display,
                      on_start=on_start, on_ready=on_ready,
                      prefetch=not request.no_prefetch and not params.slower_than,
                      matrix=request.matrix)
    session.shared_state = bool(request.probe)
    if params.slower_than:
        # bisect by speed only: its module is not needed otherwise
        from opforge.bisect.speed import SpeedJudge, workloads_of

        session.speed = SpeedJudge(params.slower_than,
                                   workloads_of(params.wheel, request.matrix),
                                   timeout=params.timeout)
    return session, verdicts


def _begin(request: BisectRequest, log, display):
    """(params, state, on_start): the saved bisect continued, or a new one with its
    candidates listed; ``on_start`` logs it once its first step is done."""
    state_path = request.state_path
    if request.resume:
        saved = state_mod.load(state_path)
        params = _resumed_params(request, saved.params)
        state = saved
        state.stopped = None
        done = len(state.steps)

        def on_start() -> None:
            log.write("resume", state=str(state_path), steps_done=done)
        return params, state, on_start
    params = _params(request)
    _replaceable(state_path, request.restart)
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
    return params, state, on_start


def _linear(request: BisectRequest, session) -> int:
    """A whole bisect (or the rest of one): the search, the commits, the report."""
    state, display = session.state, session.display
    try:
        with display:
            try:
                outcome = session.run()
            finally:
                if session.speed is not None:
                    session.speed.close()
            commits = commit_range(outcome.last_good.git_version, outcome.first_bad.git_version,
                                   request.pytorch_repo)
            if request.by_commit:
                outcome = session.bisect_commits(outcome, commits)
    except KeyboardInterrupt as exc:
        if not session.started:
            raise
        signame = exc.name if isinstance(exc, Interrupted) else "SIGINT"
        state.stopped = "interrupted"
        session.save()
        display.note(f"interrupted ({signame}) after {len(state.steps)} finished steps; "
                     "`opforge bisect --resume` continues without repeating them")
        session.log.write("interrupted", signal=signame, steps_done=len(state.steps))
        raise
    except UsageError:
        raise  # bad input or an unusable saved state: exit 2, nothing is written
    except OpforgeError as exc:
        if not session.started:  # nothing was tested: nothing is written
            raise
        # CI attaches the report wherever the bisect ends: say what was tested and why it stopped
        state.stopped = "error"
        session.save()
        session.log.write("error", message=str(exc), steps_done=len(state.steps))
        emit_error(str(exc), list(state.steps.values()), json_to=request.json,
                   markdown_to=request.markdown)
        raise
    return _finish(request, session, outcome, commits)


def _finish(request: BisectRequest, session, outcome, commits) -> int:
    """The result: saved in the state, logged, and written as the report."""
    params, state = session.params, session.state
    exe = session.envs.base_python  # the interpreter the environments were made with
    data = result_json(outcome, commits, f"python{params.python}"
                       if re.fullmatch(r"\d+\.\d+", params.python) else exe, session.envs,
                       list(state.steps.values()))
    data["probes_this_run"] = session.probed_now
    if session.speed is not None:
        data["speed"] = session.speed.report()
    state.result = data
    session.claim()
    state_mod.save(state, request.state_path)
    session.log.write("done", result=data)
    emit(data, json_to=request.json, markdown_to=request.markdown)
    return 0
