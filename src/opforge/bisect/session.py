"""One bisect run: endpoints, walk-back, the halving loop, each step saved as it finishes.

The pure search (search.py) decides; this module does the I/O around it: it resolves the
endpoints against the index, makes each nightly's environment, runs the test, records the
step in the state file and the JSON-lines log, and shows progress.
"""

from __future__ import annotations

import re
import time
from datetime import date, timedelta
from pathlib import Path

from opforge.errors import OpforgeError, UsageError

from . import extension
from . import state as state_mod
from .envs import EnvCache, NightlyEnv, Prefetcher
from .index import Nightly, NightlyIndex, find_unlisted, with_unlisted
from .levels import Level, Levels, Outcomes
from .params import Params, parse_day
from .probe import Abort, Attempt, CannotStart, classify, run_command
from .releases import Candidate, Release, ReleaseIndex
from .search import EndpointError, Found, Outcome, Probe, next_step, walkback_dates
from .state import BisectState, StepLog, StepRecord


class Session(Levels):
    def __init__(self, params: Params, state: BisectState, state_path: Path, log: StepLog,
                 envs: EnvCache, display, on_start=None, on_ready=None, prefetch: bool = True,
                 matrix: str | None = None):
        """``on_start`` runs once, when the first step has finished: before it, nothing is
        written (a mistaken command never touches the saved state or the log). ``matrix``:
        --file's matrix (None: found as ``find_matrix`` finds it), what the build and the
        smoke run use and every command run in an environment gets as $OPFORGE_MATRIX."""
        self.params = params
        self.matrix = matrix
        self.state = state
        self.state_path = state_path
        self.log = log
        self.envs = envs
        self.prefetcher = Prefetcher(envs, prefetch)
        self.display = display
        self.listing = NightlyIndex(params.index, tuple(state.listed))
        self.releases = ReleaseIndex(params.release_index or "", tuple(state.releases))
        self.level_notes: list[str] = []
        self.match = re.compile(params.match, re.MULTILINE) if params.match else None
        self.probed_now = 0
        # a bisect writes its state and log only once its endpoints checked out and its first
        # step finished, so a mistaken command never replaces the state of an interrupted one
        self.started = False
        self.on_start = on_start
        self.on_ready = on_ready  # runs once the endpoints checked out, before any probe
        self.speed = None  # a speed.SpeedJudge: --slower-than's verdicts instead of the test's
        self.shared_state = False  # --probe: other probes may add steps to the same state
        self.lock = None  # the state's lock (state.claim), taken at the first write

    def claim(self) -> None:
        """Hold the state file from here on; refused (one line naming the holder) when another
        bisect holds it. Taken at the first write, so a refused command creates nothing."""
        if self.lock is None:
            self.lock = state_mod.claim(self.state_path, shared=self.shared_state)

    def close(self) -> None:
        """Let go of the state and the environments (the process exiting does it too)."""
        if self.lock is not None:
            self.lock.release()
            self.lock = None
        self.envs.close()

    def save(self) -> None:
        if self.started:
            self.claim()
            state_mod.save(self.state, self.state_path, merge=self.shared_state)

    def begin(self) -> None:
        if not self.started:
            self.claim()
            self.started = True
            if self.on_start is not None:
                self.on_start()
            self.save()

    # -- endpoints ------------------------------------------------------------------------------

    def resolve(self, text: str, which: str) -> Nightly:
        day = parse_day(text, f"--{which}")
        found = self.listing.by_date(day)
        oldest = self.state.index_oldest  # None: the index listed nothing
        if found is None and oldest is not None and day < oldest:
            self.display.note(f"{day} is older than the index lists; looking for its wheel by URL")
            found = find_unlisted(self.listing, day)
            if found is not None:
                self._remember(found)
        if found is None:
            raise UsageError(f"--{which} {day}: no nightly for that date in {self.params.index}"
                             f" ({self._neighbours(day)})")
        return found

    def _neighbours(self, day: date) -> str:
        older = [n.day for n in self.listing.nightlies if n.date < day][-1:]
        newer = [n.day for n in self.listing.nightlies if n.date > day][:1]
        parts = [f"nearest before: {older[0]}" if older else "none before it",
                 f"nearest after: {newer[0]}" if newer else "none after it"]
        return "; ".join(parts)

    def _remember(self, *nightlies: Nightly) -> None:
        self.listing = with_unlisted(self.listing, nightlies)
        self.state.looked_up.extend(n.day for n in nightlies if n.day not in self.state.looked_up)
        self.state.listed = list(self.listing.nightlies)
        self.save()

    # -- the run --------------------------------------------------------------------------------

    def run(self) -> Outcomes:
        if self.params.level == "release":
            return self.run_releases()
        if not self.listing.nightlies:
            raise UsageError(f"{self.params.index}: no torch nightly for Python "
                             f"{self.params.python} on this platform")
        bad = (self.resolve(self.params.bad, "bad") if self.params.bad
               else self.listing.nightlies[-1])
        walked: list[str] = []
        good = self.resolve(self.params.good, "good") if self.params.good else None
        if good is not None and good.date >= bad.date:
            raise UsageError(f"--good {good.day} must be older than --bad {bad.day}")
        self._ready()
        if good is None:
            if not self.params.bad:
                self.display.note(f"no --bad given: using the newest nightly, {bad.day}")
            self._check_endpoint(self.probe(bad), "bad")
            good, bad, walked = self.walk_back(bad)
        self._fill_unlisted(good.date, bad.date)
        candidates = sorted({n.date: n for n in [*self.listing.between(good.date, bad.date),
                                                 good, bad]}.values(), key=lambda n: n.date)
        level = self._search(candidates, "nightly")
        assert isinstance(level, Level)
        return self._outcomes([level], walked)

    def _ready(self) -> None:
        for note in self.params.notes:  # said once the inputs are known to be usable
            self.display.note(note)
        if self.on_ready is not None:
            self.on_ready()

    def _outcomes(self, levels: list[Level], walked: list[str]) -> Outcomes:
        last = levels[-1]
        return Outcomes(self.params, last.last_good, last.first_bad, last.skipped,
                        last.candidates, len(self.state.steps), walked, levels, self.level_notes)

    def _search(self, candidates: list[Candidate], name: str,
                strict: bool = True) -> Level | EndpointError:
        """Halve ``candidates`` (oldest first) down to a boundary; an endpoint that does not
        behave as claimed stops the bisect (``strict``) or is returned."""
        if self.speed is not None:  # every candidate is timed against this level's good end
            self.speed.begin(self, candidates[0])
        while True:
            results = {i: self.state.steps[c.key].outcome for i, c in enumerate(candidates)
                       if c.key in self.state.steps}
            step = next_step(len(candidates), results)
            if isinstance(step, Probe):
                self.display.left(self._left(candidates, results))
                self.prefetcher.want(self._next_probes(candidates, results, step.index))
                self.probe(candidates[step.index])
                continue
            if isinstance(step, EndpointError):
                if not strict:
                    return step
                which = candidates[0] if step.which == "good" else candidates[-1]
                self._check_endpoint(self.state.steps[which.key], step.which)
            assert isinstance(step, Found)
            if self.speed is not None and self.speed.recheck(self, candidates, step):
                continue  # a boundary candidate measured again changed its verdict
            record = [self.state.steps.get(c.key) for c in candidates]
            return Level(name, record[step.last_good], record[step.first_bad],
                         [record[i] for i in step.skipped], len(candidates))

    def _level_note(self, text: str) -> None:
        self.level_notes.append(text)
        self.display.note(text)

    @staticmethod
    def _next_probes(candidates: list[Candidate], results: dict[int, Outcome],
                     index: int) -> list[Candidate]:
        """What the search probes next if ``index`` turns out good, or bad (search.py decides)."""
        out = []
        for outcome in (Outcome.BAD, Outcome.GOOD):
            step = next_step(len(candidates), {**results, index: outcome})
            if isinstance(step, Probe) and candidates[step.index] not in out:
                out.append(candidates[step.index])
        return out

    def _left(self, candidates: list[Nightly], results: dict[int, Outcome]) -> int:
        bads = [i for i, o in results.items() if o is Outcome.BAD]
        hi = min(bads) if bads else len(candidates) - 1
        goods = [i for i, o in results.items() if o is Outcome.GOOD and i < hi]
        lo = max(goods) if goods else 0
        untested = sum(1 for i in range(lo + 1, hi) if i not in results)
        return max(1, untested.bit_length())

    def _fill_unlisted(self, good: date, bad: date) -> None:
        """Days older than the index lists are candidates too: find them by direct URL."""
        oldest = self.state.index_oldest
        known = {n.date for n in self.listing.nightlies}
        days = [good + timedelta(days=k) for k in range(1, (min(bad, oldest) - good).days)]
        days = [d for d in days if d not in known and d.isoformat() not in self.state.looked_up]
        if not days:
            return
        self.display.note(f"looking up {len(days)} days older than the index lists "
                          f"({days[0]}..{days[-1]}) by their direct URLs")
        found = [n for n in (find_unlisted(self.listing, d) for d in days) if n is not None]
        self.state.looked_up.extend(d.isoformat() for d in days)
        self._remember(*found)

    def _unlisted_near(self, day: date) -> Nightly | None:
        """The newest nightly in the week up to ``day``, found by direct URL."""
        for k in range(7):
            found = self.listing.by_date(day - timedelta(days=k)) or find_unlisted(
                self.listing, day - timedelta(days=k))
            if found is not None:
                return found
        return None

    def _check_endpoint(self, record: StepRecord, which: str) -> None:
        expected = Outcome.BAD if which == "bad" else Outcome.GOOD
        if record.outcome is expected:
            return
        n = record.nightly
        what = (f"the {which} release {n.key}" if isinstance(n, Release)
                else f"the {which} nightly {n.day} ({n.version})")
        flip = self.params.regress == "failure"
        if record.outcome is Outcome.SKIP:
            raise OpforgeError(f"{what} could not be tested ({record.reason}); pick another --{which}")
        if which == "bad":
            hint = " (looking for where it started to pass? use --regress success)" if flip else ""
            state = "passes" if flip else "fails"
            raise OpforgeError(f"{what} {state} the test ({record.reason}), so it is not bad: "
                               f"nothing to bisect{hint}")
        state = "fails" if flip else "passes"
        raise OpforgeError(f"{what} already {state} the test ({record.reason}): the change is "
                           f"older; pick an earlier --good, or leave --good out to walk back")

    def walk_back(self, bad: Nightly) -> tuple[Nightly, Nightly, list[str]]:
        walked: list[str] = []
        oldest = self.state.index_oldest
        misses = 0
        for day in walkback_dates(bad.date):
            nightly = self.listing.on_or_before(day) if day >= oldest else None
            if nightly is None:
                nightly = self._unlisted_near(day)
                if nightly is None:
                    misses += 1
                    if misses >= 3:
                        break
                    continue
                self._remember(nightly)
            if nightly.date >= bad.date or nightly.day in walked:
                continue
            walked.append(nightly.day)
            record = self.probe(nightly)
            if record.outcome is Outcome.GOOD:
                self.display.note(f"no --good given: walked back from {bad.day}; "
                                  f"{nightly.day} is good")
                return nightly, bad, walked
            if record.outcome is Outcome.BAD:
                bad = nightly
        raise OpforgeError(f"no good nightly found walking back from {bad.day} (tried "
                           f"{', '.join(walked) or 'nothing'}); pass --good with a date that passes")

    # -- one step -------------------------------------------------------------------------------

    def probe(self, nightly: Candidate) -> StepRecord:
        done = self.state.steps.get(nightly.key)
        if done is not None:
            return done
        self.display.start(nightly)
        t0 = time.monotonic()
        missing = self._missing_companions(nightly)
        if missing:
            return self._finish(StepRecord(
                nightly, Outcome.SKIP, f"no {' or '.join(missing)} nightly for {nightly.key} on "
                "the index (--with): skipped", None, 0, 0.0, None, None, False), [])
        try:
            env = self.prefetcher.get(nightly)
        except OpforgeError as exc:
            return self._finish(StepRecord(nightly, Outcome.SKIP, f"cannot install: {exc}", None,
                                           0, time.monotonic() - t0, None, None, False), [])
        self.display.step(nightly, "installed" if env.actions else "environment reused")
        try:
            cmd, run_env = self._prepare(env, nightly)
        except OpforgeError as exc:
            if self.speed is not None:  # nothing to time: neither faster nor slower
                return self._finish(StepRecord(nightly, Outcome.SKIP, str(exc).splitlines()[0],
                                               None, 1, time.monotonic() - t0, env.sha256,
                                               env.git_version, env.reused), env.actions)
            # the extension no longer builds against this nightly: a failure, like a test's
            attempt = Attempt(1, time.monotonic() - t0, str(exc))
            return self._verdict(nightly, env, [attempt], ["opforge", "build"], t0,
                                 what=str(exc).splitlines()[0][:300])
        if self.speed is not None:
            return self._finish(self.speed.judge(self, nightly, env, t0), env.actions, cmd)
        attempts: list[Attempt] = []
        for k in range(self.params.retries + 1):
            if k:
                self.display.step(nightly, f"retry {k} of {self.params.retries}")
            else:
                self.display.step(nightly, "testing")
            try:
                attempt = run_command(cmd, run_env, self.params.timeout, Path(self.params.cwd))
            except CannotStart as exc:
                raise UsageError(f"the test command {exc}") from None
            attempts.append(attempt)
            try:
                verdict = classify(attempt, match=self.match, regress=self.params.regress,
                                   timeout_skip=self.params.timeout_skip)
            except Abort as exc:
                self.log.write("abort", date=nightly.key, exit_code=attempt.exit_code,
                               output_tail=attempt.tail, message=str(exc))
                raise OpforgeError(f"{nightly.key}: {exc}; the finished steps are saved, "
                                   "fix the command and rerun with --resume") from None
            if verdict.passed is not False:
                break
        return self._verdict(nightly, env, attempts, cmd, t0)

    def _missing_companions(self, candidate: Candidate) -> list[str]:
        if not isinstance(candidate, Nightly) or not self.params.companions:
            return []
        have = {c.project.lower().replace("_", "-") for c in candidate.companions}
        return [name for name in self.params.companions if name.replace("-", "_") not in
                {h.replace("-", "_") for h in have}]

    def _verdict(self, nightly: Nightly, env: NightlyEnv, attempts: list[Attempt],
                 cmd: list[str], t0: float, what: str | None = None) -> StepRecord:
        last = attempts[-1]
        verdict = classify(last, match=self.match, regress=self.params.regress,
                           timeout_skip=self.params.timeout_skip)
        reason = verdict.reason + (f" (after {len(attempts)} attempts)" if len(attempts) > 1 else "")
        if what:
            reason = f"{what} [{reason}]"
        record = StepRecord(nightly, verdict.outcome, reason, last.exit_code, len(attempts),
                            time.monotonic() - t0, env.sha256, env.git_version, env.reused,
                            last.tail)
        return self._finish(record, env.actions, cmd, attempts)

    def _finish(self, record: StepRecord, actions: list[str], cmd: list[str] | None = None,
                attempts: list[Attempt] | None = None) -> StepRecord:
        self.state.record(record)
        self.begin()
        self.save()
        self.probed_now += 1
        self.log.write("probe", date=record.nightly.key, version=record.nightly.version,
                       url=record.nightly.url, sha256=record.sha256, commit=record.git_version,
                       outcome=record.outcome.value, reason=record.reason,
                       exit_code=record.exit_code, duration_s=round(record.duration_s, 3),
                       attempts=[{"exit_code": a.exit_code, "duration_s": round(a.duration_s, 3)}
                                 for a in attempts or []],
                       command=cmd, reused_env=record.reused_env, actions=actions,
                       output_tail=record.output_tail)
        self.display.done(record)
        return record

    def _prepare(self, env: NightlyEnv, nightly: Nightly) -> tuple[list[str], dict | None]:
        """The command to run in ``env`` and its environment, per mode."""
        wheel = Path(self.params.wheel) if self.params.wheel else None
        if self.params.mode == "build":
            rev = extension.checkout_revision(extension.checkout_root(self.matrix))
            builds = self.envs.root / "builds" / f"{env.path.name}-{rev}"
            built = sorted(builds.glob("*.whl"))
            if not built or rev.endswith("-dirty"):
                self.display.step(nightly, "building the extension")
                with self.display.paused():
                    # a release's distribution version (2.12.0): its version.py may add a
                    # local part (2.12.0+cu130) that no index serves
                    torch = nightly.version if isinstance(nightly, Release) else env.torch_version
                    built = [extension.build_against(
                        self.params.variant, env.python, torch, builds,
                        builds / "work", log=lambda line: None, matrix=self.matrix)]
            wheel = built[-1]
        if wheel is not None:
            self.envs.add_wheel(env, wheel, nightly)
        if self.params.command:
            return list(self.params.command), env.run_env(self.matrix)
        package = extension.wheel_package(wheel) if self.params.wheel and wheel else None
        return extension.smoke_command(env.python, self.params.variant, package,
                                       matrix=self.matrix), extension.smoke_env(self.matrix)


__all__ = ["Outcomes", "Session"]
