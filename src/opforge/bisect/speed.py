"""Bisect by speed: ``opforge bisect --slower-than RATIO``.

A nightly is bad when one of the recipes' workloads runs RATIO times slower there than on the
good endpoint, measured in the same run: both environments keep a workload server running
(``probe.pyz serve``), and each round of ``speed.paired`` alternates a block on the good side
with a block on the candidate's, so a machine that slows down for a while slows both sides of
a round alike. The verdict is the median of the rounds' ratios, held against the good side's
own noise (the good nightly timed against itself): clearly slower is bad, clearly not is good,
and a ratio within the noise of the threshold is measured again, then skipped if it stays
there. Once the search has its boundary, both of its nightlies are measured again (a verdict
that flips in two of three measurements reopens the search), and the last good and first bad
are timed against each other for the report.
"""

from __future__ import annotations

import json
import math
import os
import select
import shutil
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from opforge.errors import OpforgeError, UsageError
from opforge.matrix import find_matrix, load_matrix
from opforge.processes import stop_child
from opforge.smoke.archive import probe_archive
from opforge.smoke.probe.speed import paired, seconds

from .extension import wheel_package
from .index import Nightly
from .search import Found, Outcome
from .state import StepRecord

START_TIMEOUT_S = 900.0   # importing torch and building the workloads
BLOCK_TIMEOUT_S = 300.0   # one block of calls
BUDGET_S = 0.3            # timing per row and measurement (at least 5 rounds)
REMEASURES = 2            # more measurements of a row within noise of the threshold


@dataclass(frozen=True)
class Workloads:
    """Whose workloads are timed: the extension's package, op namespace and recipes file."""

    package: str
    namespace: str
    recipes: Path


def workloads_of(wheel: str | None, matrix_path: str | None = None) -> Workloads:
    """The workloads of the checkout's extension (its matrix: ``matrix_path``, --file's, else
    the one ``find_matrix`` finds), or of ``--wheel``'s package."""
    matrix = load_matrix(matrix_path or find_matrix())
    ext = matrix.extension
    package = (wheel_package(Path(wheel)) if wheel else None) or ext.package
    if package != ext.package:
        raise UsageError(f"--slower-than times the workloads of {matrix.path.name}'s extension "
                         f"({ext.package}); --wheel installs {package}")
    if not ext.recipes:
        raise UsageError(f"{matrix.path.name}: extension.recipes names no recipes file; "
                         "--slower-than times its workloads")
    recipes = matrix.path.parent / ext.recipes
    if not recipes.is_file():
        raise UsageError(f"{matrix.path.name}: extension.recipes {ext.recipes!r}: no such file")
    return Workloads(ext.package, ext.namespace, recipes.resolve())


# -- one environment's server ---------------------------------------------------------------


class ServerError(Exception):
    def __init__(self, message: str, recipe_error: bool = False):
        super().__init__(message)
        self.recipe_error = recipe_error


class WorkloadServer:
    """``probe.pyz serve`` running in one nightly's environment, answering "time this row"."""

    def __init__(self, python: Path, env: dict[str, str], workloads: Workloads,
                 timeout: float | None):
        self.scratch = Path(tempfile.mkdtemp(prefix="opforge-speed-"))
        self.block_timeout = timeout or BLOCK_TIMEOUT_S
        archive = probe_archive(self.scratch / "probe.pyz")
        self.stderr = open(self.scratch / "stderr.txt", "w+b")  # noqa: SIM115 - closed in close()
        env = {**env, "PYTHONUNBUFFERED": "1", "PYTHONNOUSERSITE": "1"}
        cmd = [str(python), str(archive), "serve", "--package", workloads.package,
               "--namespace", workloads.namespace, "--recipes", str(workloads.recipes)]
        try:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=self.stderr, cwd=self.scratch, env=env,
                                         start_new_session=True)
        except OSError as exc:
            self.close()
            raise ServerError(f"cannot run {python}: {exc.strerror or exc}") from None
        self._buffer = b""
        hello = self._read(timeout or START_TIMEOUT_S)
        if "error" in hello:
            self.close()
            raise ServerError(hello["error"], bool(hello.get("recipe_error")))
        self.rows: dict[str, float] = hello["rows"]
        self.failed: dict[str, str] = hello["failed"]
        self.torch_version: str = hello.get("torch_version", "?")

    def _read(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                self.close()
                raise ServerError(f"no answer within {timeout:.0f} s")
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                code = self.proc.wait()
                tail = self._stderr_tail()
                self.close()
                raise ServerError(f"the workload server exited {code}"
                                  + (f": {tail}" if tail else ""))
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def _stderr_tail(self) -> str:
        try:
            self.stderr.seek(0)
            lines = self.stderr.read().decode("utf-8", "replace").strip().splitlines()
        except (OSError, ValueError):
            return ""
        return lines[-1][:300] if lines else ""

    def time(self, key: str) -> float:
        """Seconds per call of one block of ``key``'s calls."""
        try:
            self.proc.stdin.write((json.dumps({"time": key}) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise ServerError("the workload server is gone") from None
        answer = self._read(self.block_timeout)
        if "error" in answer:
            raise ServerError(f"{key}: {answer['error']}")
        return float(answer["s"])

    def close(self) -> None:
        stop_child(getattr(self, "proc", None))
        self.stderr.close()
        shutil.rmtree(self.scratch, ignore_errors=True)


# -- verdicts -------------------------------------------------------------------------------


@dataclass
class RowTiming:
    """One workload row: the candidate's time over the good nightly's, from paired rounds."""

    key: str
    ratio: float       # median over rounds of candidate / good
    good_s: float
    other_s: float
    spread: float      # the ratios' inter-quartile range over their median
    rounds: int
    noise: float = 0.0  # the good nightly against itself: |ratio - 1|

    @property
    def margin(self) -> float:
        return max(self.noise, self.spread)

    def state(self, threshold: float) -> str:
        """slower | fine | unsure: against ``threshold`` with the row's margin of noise."""
        if self.ratio >= threshold * (1 + self.margin):
            return "slower"
        if self.ratio * (1 + self.margin) < threshold:
            return "fine"
        return "unsure"

    def describe(self) -> str:
        return (f"{self.key} {self.ratio:.3g}x ({seconds(self.other_s)} vs "
                f"{seconds(self.good_s)}; noise ±{self.margin:.0%}, {self.rounds} rounds)")

    def to_json(self) -> dict:
        return {"workload": self.key, "ratio": round(self.ratio, 4), "good_s": self.good_s,
                "this_s": self.other_s, "spread": round(self.spread, 4),
                "noise": round(self.noise, 4), "rounds": self.rounds}


def verdict(timings: list[RowTiming], threshold: float) -> tuple[Outcome, str]:
    """good / bad / skip for one nightly from its rows (pure: the tests drive it directly)."""
    if not timings:
        return Outcome.SKIP, "no workload could be timed on both nightlies"
    slowest = max(timings, key=lambda t: t.ratio)
    slower = [t for t in timings if t.state(threshold) == "slower"]
    unsure = [t for t in timings if t.state(threshold) == "unsure"]
    if slower:
        worst = max(slower, key=lambda t: t.ratio)
        more = f" (+{len(slower) - 1} more)" if len(slower) > 1 else ""
        return Outcome.BAD, f"slower than {threshold:g}x: {worst.describe()}{more}"
    if unsure:
        return Outcome.SKIP, (f"within noise of {threshold:g}x: {unsure[0].describe()}")
    return Outcome.GOOD, f"not slower than {threshold:g}x; slowest {slowest.describe()}"


@dataclass
class SpeedJudge:
    """Times every nightly's workloads against the good endpoint's, in the same run."""

    threshold: float
    workloads: Workloads
    timeout: float | None = None
    budget_s: float = BUDGET_S
    good: Nightly | None = None
    servers: dict[str, WorkloadServer] = field(default_factory=dict)
    noise: dict[str, float] = field(default_factory=dict)
    rechecked: set[str] = field(default_factory=set)
    latest: dict[str, list[RowTiming]] = field(default_factory=dict)  # day -> its last rows
    boundary: dict | None = None

    # the session's hooks ------------------------------------------------------------------

    def begin(self, session, good: Nightly) -> None:
        """Start the good nightly's server and measure its noise: every row against itself."""
        self.good = good
        server = self._server(session, good, reference=True)
        if not server.rows:
            failed = "; ".join(f"{k}: {v}" for k, v in server.failed.items())
            raise UsageError(f"the recipes file {self.workloads.recipes} gives no workload to "
                             f"time on the good nightly {good.key}"
                             + (f" ({failed})" if failed else " (no op has 'workloads')"))
        session.display.step(good, "measuring the noise (the good nightly against itself)")
        for key in server.rows:
            same = paired(lambda k=key: server.time(k), lambda k=key: server.time(k),
                          budget_s=self.budget_s / 2)
            self.noise[key] = abs(same["ratio"] - 1)

    def judge(self, session, nightly: Nightly, env, t0: float) -> StepRecord:
        """The step record of one nightly: its rows timed against the good nightly's."""
        try:
            timings, failed = self.measure(session, nightly)
            outcome, reason = verdict(timings, self.threshold)
            for _ in range(REMEASURES):
                if outcome is not Outcome.SKIP or not timings:
                    break
                session.display.step(nightly, "within noise of the threshold: measuring again")
                timings = self._pooled(timings, self.measure(session, nightly, 2)[0])
                outcome, reason = verdict(timings, self.threshold)
            self.latest[nightly.key] = timings
            if failed:
                reason += f"; {len(failed)} workload(s) failed here ({next(iter(failed.values()))})"
            tail = "\n".join(t.describe() for t in timings)
        except ServerError as exc:
            outcome, reason, tail = Outcome.SKIP, f"cannot time the workloads: {exc}", ""
        finally:
            self._close_others(keep=())
        return StepRecord(nightly, outcome, reason, None, 1, time.monotonic() - t0,
                          env.sha256, env.git_version, env.reused, tail)

    def recheck(self, session, candidates: list[Nightly], found: Found) -> bool:
        """Measure the boundary's two nightlies again; True when a verdict flipped (the search
        goes on with the new one). Otherwise times them against each other for the report."""
        lo, hi = candidates[found.last_good], candidates[found.first_bad]
        flipped = False
        for nightly in (lo, hi):
            if nightly.key == self.good.key or nightly.key in self.rechecked:
                continue
            self.rechecked.add(nightly.key)
            stored = session.state.steps[nightly.key]
            session.display.step(nightly, "at the boundary: measuring again")
            again = self._record(session, nightly, 2)
            if again.outcome is not stored.outcome:
                session.display.step(nightly, "the verdict changed: a third measurement")
                third = self._record(session, nightly, 2)
                if third.outcome is not stored.outcome:
                    third.reason += f" (measured 3 times; was {stored.outcome.value})"
                    session.state.record(third)
                    session.save()
                    session.log.write("speed-recheck", date=nightly.key,
                                      was=stored.outcome.value, now=third.outcome.value,
                                      reason=third.reason)
                    session.display.done(third)
                    flipped = True
        self._close_others(keep=())
        if not flipped:
            self.boundary = self._boundary(session, lo, hi)
        return flipped

    def report(self) -> dict:
        return {"slower_than": self.threshold, "good": self.good.key if self.good else None,
                "workloads": str(self.workloads.recipes), "boundary": self.boundary}

    def close(self) -> None:
        for server in self.servers.values():
            server.close()
        self.servers.clear()

    # measuring ------------------------------------------------------------------------------

    def _server(self, session, nightly: Nightly, reference: bool = False) -> WorkloadServer:
        server = self.servers.get(nightly.key)
        if server is not None:
            return server
        env = session.envs.ensure(nightly)
        session._prepare(env, nightly)  # installs (or builds) the extension there
        session.display.step(nightly, "starting the workloads")
        try:
            server = WorkloadServer(env.python, env.run_env(session.matrix), self.workloads,
                                    self.timeout)
        except ServerError as exc:
            if not reference:
                raise
            if exc.recipe_error:
                raise UsageError(f"a workload's recipe raised: {exc}") from None
            raise OpforgeError(f"the good nightly {nightly.key} cannot run the workloads: "
                               f"{exc}") from None
        self.servers[nightly.key] = server
        return server

    def measure(self, session, nightly: Nightly, scale: float = 1
                ) -> tuple[list[RowTiming], dict[str, str]]:
        good = self._server(session, self.good)
        other = good if nightly.key == self.good.key else self._server(session, nightly)
        session.display.step(nightly, f"timing {len(good.rows)} workloads against "
                                      f"{self.good.key}")
        timings = []
        for key in good.rows:
            if key not in other.rows:
                continue
            pair = paired(lambda k=key: good.time(k), lambda k=key: other.time(k),
                          budget_s=self.budget_s * scale)
            timings.append(RowTiming(key, pair["ratio"], pair["a_s"], pair["b_s"],
                                     pair["spread"], pair["rounds"], self.noise.get(key, 0.0)))
        failed = {k: v for k, v in other.failed.items() if k in good.rows or k not in good.failed}
        failed.update({k: "not built here" for k in good.rows if k not in other.rows
                       and k not in other.failed})
        return timings, failed

    @staticmethod
    def _pooled(first: list[RowTiming], again: list[RowTiming]) -> list[RowTiming]:
        """Each row's measurements together: the median ratio, the rounds summed."""
        by_key = {t.key: t for t in again}
        pooled = []
        for t in first:
            a = by_key.get(t.key)
            if a is None:
                pooled.append(t)
                continue
            # the ratios' geometric mean, weighted by rounds
            ratio = math.exp((math.log(t.ratio) * t.rounds + math.log(a.ratio) * a.rounds)
                             / (t.rounds + a.rounds))
            pooled.append(RowTiming(t.key, ratio, statistics.median([t.good_s, a.good_s]),
                                    statistics.median([t.other_s, a.other_s]),
                                    min(t.spread, a.spread), t.rounds + a.rounds, t.noise))
        return pooled

    def _record(self, session, nightly: Nightly, scale: float) -> StepRecord:
        t0 = time.monotonic()
        env = session.envs.ensure(nightly)
        try:
            timings, _ = self.measure(session, nightly, scale)
            outcome, reason = verdict(timings, self.threshold)
            self.latest[nightly.key] = timings
        except ServerError as exc:
            timings, outcome, reason = [], Outcome.SKIP, f"cannot time the workloads: {exc}"
        return StepRecord(nightly, outcome, reason, None, 1, time.monotonic() - t0, env.sha256,
                          env.git_version, env.reused, "\n".join(t.describe() for t in timings))

    def _boundary(self, session, lo: Nightly, hi: Nightly) -> dict:
        """The last good and first bad nightly timed against each other, row by row."""
        session.display.step(hi, f"timing {hi.key} against {lo.key}")
        try:
            before = self._server(session, lo)
            after = self._server(session, hi)
            # the rows that made the first bad nightly bad, in its latest measurement
            latest = self.latest.get(hi.key) or self.measure(session, hi)[0]
            rows = []
            for vs_good in latest:
                key = vs_good.key
                if vs_good.state(self.threshold) != "slower" or key not in before.rows:
                    continue
                pair = paired(lambda k=key: before.time(k), lambda k=key: after.time(k),
                              budget_s=self.budget_s * 2)
                rows.append({"workload": key, "last_good_s": pair["a_s"],
                             "first_bad_s": pair["b_s"], "ratio": round(pair["ratio"], 4),
                             "spread": round(pair["spread"], 4), "rounds": pair["rounds"],
                             "first_bad_vs_good": round(vs_good.ratio, 4)})
        except ServerError as exc:
            return {"last_good": lo.key, "first_bad": hi.key, "rows": [],
                    "error": f"cannot time the boundary: {exc}"}
        finally:
            self.close()
        return {"last_good": lo.key, "first_bad": hi.key, "rows": rows}

    def _close_others(self, keep: tuple[str, ...]) -> None:
        for day in [d for d in self.servers if d != self.good.key and d not in keep]:
            self.servers.pop(day).close()


def describe_boundary(speed: dict) -> list[str]:
    """Report lines: each slowed workload's time on the last good and the first bad nightly."""
    boundary = speed.get("boundary") or {}
    lines = [f"bisect by speed: a nightly is bad when a workload runs {speed['slower_than']:g}x "
             f"slower than on {speed['good']} (timed in the same run, paired rounds)"]
    if boundary.get("error"):
        lines.append(boundary["error"])
    for row in boundary.get("rows", []):
        lines.append(f"  {row['workload']}: {seconds(row['last_good_s'])} on "
                     f"{boundary['last_good']} -> {seconds(row['first_bad_s'])} on "
                     f"{boundary['first_bad']} ({row['ratio']:.3g}x, ±{row['spread']:.0%}, "
                     f"{row['rounds']} rounds; {row['first_bad_vs_good']:.3g}x the good "
                     "nightly's)")
    return lines


__all__ = ["RowTiming", "SpeedJudge", "Workloads", "describe_boundary",
           "verdict", "workloads_of"]
