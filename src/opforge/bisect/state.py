"""The bisect's state on disk, rewritten atomically after every step, and its JSON-lines log.

The state holds the parameters, the nightlies the index listed when the bisect began (so a
resumed bisect sees the same candidates even if the index has moved on) and every finished
step. ``--resume`` reloads it and repeats no finished step.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from opforge.errors import UsageError
from opforge.files import read_json, write_file
from opforge.locks import FileLock, LockHeld

from .index import Nightly
from .params import Params
from .releases import Candidate, Release, candidate_from_json
from .search import Outcome

SCHEMA = 1
STOPPED = ("interrupted", "error")


@dataclass
class StepRecord:
    """One finished probe of one nightly."""

    nightly: Candidate    # a Nightly, or a Release at the release level
    outcome: Outcome
    reason: str
    exit_code: int | None
    attempts: int
    duration_s: float
    sha256: str | None
    git_version: str | None
    reused_env: bool
    output_tail: str = ""

    def to_json(self) -> dict:
        return {"nightly": self.nightly.to_json(), "outcome": self.outcome.value,
                "reason": self.reason, "exit_code": self.exit_code, "attempts": self.attempts,
                "duration_s": round(self.duration_s, 3), "sha256": self.sha256,
                "git_version": self.git_version, "reused_env": self.reused_env,
                "output_tail": self.output_tail}

    @classmethod
    def from_json(cls, data: dict) -> StepRecord:
        for key, types in (("reason", str), ("exit_code", (int, type(None))),
                           ("attempts", int), ("duration_s", (int, float)),
                           ("sha256", (str, type(None))), ("git_version", (str, type(None))),
                           ("reused_env", bool), ("output_tail", str)):
            if key in data or key != "output_tail":
                if not isinstance(data[key], types):
                    raise TypeError(f"a step's {key} is {type(data[key]).__name__}")
        return cls(candidate_from_json(data["nightly"]), Outcome(data["outcome"]), data["reason"],
                   data["exit_code"], data["attempts"], data["duration_s"], data["sha256"],
                   data["git_version"], data["reused_env"], data.get("output_tail", ""))


@dataclass
class BisectState:
    params: dict
    listed: list[Nightly]
    steps: dict[str, StepRecord] = field(default_factory=dict)   # date -> record
    result: dict | None = None
    looked_up: list[str] = field(default_factory=list)  # unlisted days already searched by URL
    stopped: str | None = None  # "interrupted" (a signal) or "error"; None while running
    releases: list[Release] = field(default_factory=list)  # what the release index listed

    @property
    def unfinished(self) -> bool:
        """Work a new bisect must not discard silently: steps done, no result, not an error."""
        return bool(self.steps) and self.result is None and self.stopped != "error"

    @property
    def index_oldest(self):
        """The oldest date the index itself listed (older ones were found by URL)."""
        dates = [n.date for n in self.listed if n.day not in self.looked_up]
        return min(dates) if dates else None

    def record(self, step: StepRecord) -> None:
        self.steps[step.nightly.key] = step

    def to_json(self) -> dict:
        return {"schema": SCHEMA, "params": self.params,
                "listed": [n.to_json() for n in self.listed],
                "steps": [s.to_json() for s in self.steps.values()], "result": self.result,
                "looked_up": self.looked_up, "stopped": self.stopped,
                "releases": [r.to_json() for r in self.releases]}

    @classmethod
    def from_json(cls, data: dict) -> BisectState:
        if not isinstance(data["listed"], list) or not isinstance(data["steps"], list):
            raise TypeError("listed and steps must be lists")
        state = cls(data["params"], [Nightly.from_json(n) for n in data["listed"]])
        for step in data["steps"]:
            state.record(StepRecord.from_json(step))
        state.result = data.get("result")
        state.releases = [Release.from_json(r) for r in data.get("releases", [])]
        state.looked_up = [str(day) for day in data.get("looked_up", [])]
        state.stopped = data.get("stopped") if data.get("stopped") in STOPPED else None
        if not isinstance(state.result, (dict, type(None))):
            raise TypeError("result must be an object")
        Params.from_json(state.params)  # checks every field's type
        return state


def lock_path(path: Path) -> Path:
    """The run's lock beside the state: held while a bisect, a --plan or a --probe writes it."""
    return path.with_name(f".{path.name}.lock")


def _write_lock_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.write-lock")


def _held_message(path: Path, holder: str, shared: bool) -> str:
    what = "a full bisect or a --plan" if shared else "another bisect"
    return (f"--state {path}: in use by {what} ({holder}); wait for it to finish, or pass "
            "another --state")


def check_free(path: Path, *, shared: bool = False) -> None:
    """Refuse now, before anything runs, when another run holds the state; creates nothing.

    A full bisect, ``--plan`` and ``--resume`` need the state alone; ``--probe`` runs (shared)
    may run side by side, each adding its step.
    """
    lock = FileLock(lock_path(path), what=f"--state {path}")
    try:
        if not lock.busy(shared=shared):
            return
    except UsageError:
        return  # an unusable lock file: claim() says so when it matters
    raise LockHeld(_held_message(path, lock.holder(), shared))


def claim(path: Path, *, shared: bool = False) -> FileLock:
    """Hold the state for this run (until the process ends); refused in one line, naming the
    holder, when another run holds it."""
    lock = FileLock(lock_path(path), what=f"--state {path}")
    try:
        return lock.acquire(shared=shared, wait=0)
    except LockHeld:
        raise LockHeld(_held_message(path, lock.holder(), shared)) from None


def save(state: BisectState, path: Path, *, merge: bool = False) -> None:
    """Write the state so that a kill at any instant leaves the old or the new file whole.

    ``merge`` (--probe runs sharing one state): the steps another run saved meanwhile are
    kept, read and rewritten under a lock, so two probes started together both land.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(_write_lock_path(path), what=f"--state {path}").acquire(wait=120):
        if merge:
            try:
                saved = load(path) if path.exists() else None
            except UsageError:
                saved = None
            if saved is not None and saved.params == state.params:
                for key, step in saved.steps.items():
                    state.steps.setdefault(key, step)
                state.looked_up.extend(d for d in saved.looked_up if d not in state.looked_up)
        write_file(path, json.dumps(state.to_json(), indent=1), what="--state", fsync=True)


def load(path: Path) -> BisectState:
    """The saved state; a missing, unreadable or malformed file is a UsageError naming it."""
    if not path.exists() and not path.is_symlink():
        raise UsageError(f"--resume: no bisect state at {path}; start a bisect without --resume")
    try:
        data = read_json(path, what="--state")
    except UsageError as exc:
        raise UsageError(f"{exc}; start over with --restart") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise UsageError(f"--state {path}: not a bisect state of this opforge version; "
                         "start over with --restart")
    try:
        return BisectState.from_json(data)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        raise UsageError(f"--state {path}: damaged ({type(exc).__name__}: {exc}); start over "
                         "with --restart") from None


class StepLog:
    """Append-only JSON lines: one object per event, flushed as it happens."""

    def __init__(self, path: Path):
        self.path = path

    def write(self, event: str, **fields) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                           "event": event, **fields})
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
