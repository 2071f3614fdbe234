"""The levels above and below a nightly bisect, as a part of ``Session``: releases first,
the nightlies between the boundary releases, the commits under the nightly boundary
(``--by-commit``), and the rounds of a fanned-out bisect (``--plan`` / ``--probe``).

A mixin: ``Session`` (session.py) holds the state, the probe and the halving loop these use.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from opforge.errors import OpforgeError, UsageError

from .index import NightlyIndex, load_index
from .overlay import suspects
from .params import Params, release_version
from .releases import Candidate, Release, nightlies_between
from .search import EndpointError, Found, Outcome, plan
from .state import StepRecord


@dataclass
class Level:
    """The boundary found at one level: "release" or "nightly"."""

    name: str
    last_good: StepRecord
    first_bad: StepRecord
    skipped: list[StepRecord]
    candidates: int


@dataclass
class Outcomes:
    """The finished bisect, as the report needs it: the deepest level's boundary first."""

    params: Params
    last_good: StepRecord
    first_bad: StepRecord
    skipped: list[StepRecord]
    candidates: int
    probes: int
    walked_back: list[str] = field(default_factory=list)
    levels: list[Level] = field(default_factory=list)  # release, then nightly
    level_notes: list[str] = field(default_factory=list)  # why a level below was not bisected


class Levels:
    # -- releases, then the nightlies between them ---------------------------------------------

    def resolve_release(self, text: str, which: str) -> Release:
        version = release_version(text)
        assert version is not None
        found = self.releases.find(version)
        if found is None:
            raise UsageError(f"--{which} {text}: no such torch release in "
                             f"{self.params.release_index} for Python {self.params.python} "
                             f"({self.releases.neighbours(version)})")
        return found

    def run_releases(self) -> Outcomes:
        good = self.resolve_release(self.params.good, "good")
        bad = (self.resolve_release(self.params.bad, "bad") if self.params.bad
               else self.releases.releases[-1])
        if good.parsed >= bad.parsed:
            raise UsageError(f"--good {good.key} must be older than --bad {bad.key}")
        self._ready()
        if not self.params.bad:
            self.display.note(f"no --bad given: using the newest release, {bad.key}")
        level = self._search(self.releases.between(good, bad), "release")
        assert isinstance(level, Level)
        levels = [level]
        if not self.params.releases_only:
            nightly = self._nightlies_after(level)
            if nightly is not None:
                levels.append(nightly)
        return self._outcomes(levels, [])

    def _nightlies_after(self, releases: Level) -> Level | None:
        """The nightly level under a release boundary, when the nightly index covers it."""
        good, bad = releases.last_good.nightly, releases.first_bad.nightly
        assert isinstance(good, Release) and isinstance(bad, Release)
        if not self.state.listed:
            try:
                listed = load_index(self.params.index, self.params.python,
                                    companions=self.params.companions)
            except OpforgeError as exc:
                self._level_note(f"stopping at the release boundary: {exc}")
                return None
            self.state.listed = list(listed.nightlies)
            self.listing = listed
            self.save()
        candidates = nightlies_between(self.listing.nightlies, good, bad)
        if len(candidates) < 2:
            self._level_note(f"stopping at the release boundary: {self.params.index} lists "
                             f"{len(candidates)} nightlies between {good.key} and {bad.key}'s "
                             "branch cuts")
            return None
        self.display.note(f"releases: {good.key} good, {bad.key} bad; now the "
                          f"{len(candidates)} nightlies between them ({candidates[0].day}.."
                          f"{candidates[-1].day})")
        found = self._search(candidates, "nightly", strict=False)
        if isinstance(found, EndpointError):
            end = candidates[0] if found.which == "good" else candidates[-1]
            record = self.state.steps[end.key]
            self._level_note(
                f"stopping at the release boundary: the {found.which} end of the nightlies, "
                f"{end.day} ({end.version}), is {record.outcome.value} ({record.reason}), so "
                f"the change between {good.key} and {bad.key} is not one the nightlies isolate "
                "(a release-branch change, or a nightly window that starts too late)")
            return None
        return found

    # -- fanned out: a round of probes on several machines ------------------------------------

    def level_candidates(self) -> tuple[str, list[Candidate]]:
        """The level still open and its candidates, from the verdicts recorded so far; the
        release level's boundary (when found) opens the nightlies between its releases."""
        if self.params.level == "release":
            good = self.resolve_release(self.params.good, "good")
            bad = (self.resolve_release(self.params.bad, "bad") if self.params.bad
                   else self.releases.releases[-1])
            if good.parsed >= bad.parsed:
                raise UsageError(f"--good {good.key} must be older than --bad {bad.key}")
            candidates = self.releases.between(good, bad)
            found = plan(len(candidates), self._results(candidates), 1)
            if not isinstance(found, Found) or self.params.releases_only:
                return "release", candidates
            if not self.state.listed:
                try:
                    self.state.listed = list(load_index(
                        self.params.index, self.params.python,
                        companions=self.params.companions).nightlies)
                except OpforgeError:
                    return "release", candidates
                self.listing = NightlyIndex(self.params.index, tuple(self.state.listed))
            nightlies = nightlies_between(self.listing.nightlies, candidates[found.last_good],
                                          candidates[found.first_bad])
            return ("nightly", nightlies) if len(nightlies) >= 2 else ("release", candidates)
        if not self.params.good:
            raise UsageError("--plan and --probe need --good: the walk-back without it probes "
                             "one nightly at a time")
        good = self.resolve(self.params.good, "good")
        bad = self.resolve(self.params.bad, "bad") if self.params.bad else self.listing.nightlies[-1]
        if good.date >= bad.date:
            raise UsageError(f"--good {good.day} must be older than --bad {bad.day}")
        self._fill_unlisted(good.date, bad.date)
        return "nightly", sorted({n.date: n for n in [*self.listing.between(good.date, bad.date),
                                                      good, bad]}.values(), key=lambda n: n.date)

    def _results(self, candidates: list[Candidate]) -> dict[int, Outcome]:
        return {i: self.state.steps[c.key].outcome for i, c in enumerate(candidates)
                if c.key in self.state.steps}

    def plan(self, k: int) -> dict:
        """The next round of ``k`` probes (JSON), or that the search needs none."""
        name, candidates = self.level_candidates()
        step = plan(len(candidates), self._results(candidates), k) if len(candidates) > 1 else None
        if isinstance(step, EndpointError) and name == "release":
            which = candidates[0] if step.which == "good" else candidates[-1]
            self._check_endpoint(self.state.steps[which.key], step.which)
        probes = step if isinstance(step, list) else []
        return {"schema": 1, "status": "probe" if probes else "done", "level": name,
                "candidates": len(candidates), "recorded": len(self.state.steps),
                "probes": [{"key": candidates[i].key, "version": candidates[i].version,
                            "url": candidates[i].url} for i in probes]}

    def probe_key(self, key: str) -> StepRecord:
        """Probe one candidate of the open level by its key (a date or a version)."""
        _, candidates = self.level_candidates()
        for candidate in candidates:
            if candidate.key == key:
                return self.probe(candidate)
        raise UsageError(f"--probe {key}: not a candidate of this bisect "
                         f"({candidates[0].key} .. {candidates[-1].key})")

    # -- commits: Python-only commits over the bad nightly's binaries ---------------------------

    def bisect_commits(self, outcome: Outcomes, commits) -> Outcomes:
        """The commit level under the nightly boundary (--by-commit, overlay.py)."""
        nightly = outcome.levels[-1] if outcome.levels else None
        if nightly is None or nightly.name != "nightly" or not commits.commits:
            self._level_note("--by-commit: no main-branch commits to bisect "
                             f"({commits.note or 'the nightly boundary lists none'})")
            return outcome
        good, bad = nightly.last_good.nightly, nightly.first_bad.nightly
        listed = suspects(Path(commits.repo), commits.commits, bad, commits.bad_main)
        if listed and listed[-1].sha == commits.bad_main:
            listed = listed[:-1]  # the bad nightly's own commit: the bad end
        for commit in listed:
            if commit.compiled and commit.key not in self.state.steps:
                shown = ", ".join(commit.compiled[:3]) + (
                    f" and {len(commit.compiled) - 3} more" if len(commit.compiled) > 3 else "")
                self._finish(StepRecord(commit, Outcome.SKIP, f"changes compiled code ({shown}): "
                                        "a Python overlay cannot test it", None, 0, 0.0, None,
                                        commit.sha, False), [])
        self.display.note(f"nightlies: {good.key} good, {bad.key} bad; now the {len(listed)} "
                          f"main-branch commits between them "
                          f"({sum(1 for c in listed if c.compiled)} change compiled code)")
        found = self._search([good, *listed, bad], "commit", strict=False)
        if isinstance(found, EndpointError):
            self._level_note("--by-commit: the nightlies' verdicts changed; stopping at the "
                             "nightly boundary")
            return outcome
        levels = [*outcome.levels, found]
        return self._outcomes(levels, outcome.walked_back)
