"""From nightlies to PyTorch commits.

A nightly's ``torch.version.git_version`` is a commit on PyTorch's ``nightly`` branch whose
subject reads ``YYYY-MM-DD nightly release (<main commit>)``. With a local clone the two ends
map to main-branch commits and the first-parent commits between them are the suspects;
without one, the nightly commits and GitHub's compare view are what we can give.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from opforge.errors import UsageError

GITHUB = "https://github.com/pytorch/pytorch"
PR_NUMBER = re.compile(r"\(#(\d+)\)\s*$")  # how pytorch's merge bot ends a subject
SUBJECT = re.compile(r"^(\d{4}-\d{2}-\d{2}) nightly release \(([0-9a-f]{7,40})\)\s*$")
MAX_LISTED = 500


@dataclass
class CommitRange:
    good_nightly: str | None
    bad_nightly: str | None
    good_main: str | None = None
    bad_main: str | None = None
    commits: list[tuple[str, str]] = field(default_factory=list)  # (sha, subject), newest first
    truncated: bool = False
    note: str | None = None   # why the mapping is incomplete
    repo: str | None = None   # the local clone they were read from

    @property
    def compare_url(self) -> str | None:
        base, head = (self.good_main, self.bad_main) if self.good_main and self.bad_main else (
            self.good_nightly, self.bad_nightly)
        if not base or not head:
            return None
        return f"{GITHUB}/compare/{base}...{head}"

    def to_json(self) -> dict:
        return {"good_nightly_commit": self.good_nightly, "bad_nightly_commit": self.bad_nightly,
                "good_main_commit": self.good_main, "bad_main_commit": self.bad_main,
                "compare_url": self.compare_url,
                "commits": [_commit_json(s, t) for s, t in self.commits],
                "truncated": self.truncated, "note": self.note}


def _commit_json(sha: str, subject: str) -> dict:
    found = PR_NUMBER.search(subject)
    pr = int(found.group(1)) if found else None
    return {"sha": sha, "subject": subject, "pr": pr,
            "pr_url": f"{GITHUB}/pull/{pr}" if pr else None}


def _git(repo: Path, *args: str) -> str | None:
    result = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    return result.stdout if result.returncode == 0 else None


def check_repo(repo: Path) -> Path:
    repo = repo.expanduser()
    if _git(repo, "rev-parse", "--git-dir") is None:
        raise UsageError(f"--pytorch-repo {repo}: not a git repository (clone "
                         f"{GITHUB} and fetch its nightly branch)")
    return repo


def main_commit(repo: Path, nightly_sha: str) -> tuple[str | None, str | None]:
    """(main commit, problem) for a nightly-branch commit."""
    subject = _git(repo, "log", "-1", "--format=%s", nightly_sha)
    if subject is None:
        return None, (f"{nightly_sha[:12]} is not in {repo}; fetch the nightly branch "
                      "(git fetch origin nightly)")
    found = SUBJECT.match(subject.strip())
    if not found:
        return None, f"{nightly_sha[:12]}'s subject {subject.strip()!r} is not a nightly release"
    full = _git(repo, "rev-parse", "--verify", "--quiet", f"{found.group(2)}^{{commit}}")
    return (full.strip() if full else found.group(2)), None


def commit_range(good_nightly: str | None, bad_nightly: str | None,
                 repo: Path | None) -> CommitRange:
    out = CommitRange(good_nightly, bad_nightly, repo=str(repo) if repo else None)
    if repo is None:
        return out
    if not good_nightly or not bad_nightly:
        out.note = "a nightly carries no torch.version.git_version"
        return out
    out.good_main, problem_good = main_commit(repo, good_nightly)
    out.bad_main, problem_bad = main_commit(repo, bad_nightly)
    if problem_good or problem_bad:
        out.note = "; ".join(p for p in (problem_good, problem_bad) if p)
        return out
    text = _git(repo, "log", "--first-parent", f"--max-count={MAX_LISTED + 1}",
                "--format=%H%x09%s", f"{out.good_main}..{out.bad_main}")
    if text is None:
        out.note = f"main commits {out.good_main[:12]}..{out.bad_main[:12]} not in {repo}"
        return out
    lines = [line.split("\t", 1) for line in text.splitlines() if line]
    out.commits = [(sha, subject) for sha, subject in lines[:MAX_LISTED]]
    out.truncated = len(lines) > MAX_LISTED
    return out
