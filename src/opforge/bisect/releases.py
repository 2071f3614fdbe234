"""Released torch versions (and release candidates) on an index: the level above nightlies.

A release bisect walks the versions an index lists between two releases, oldest first, with
the same search, cache, resume and report as a nightly bisect; its candidates are keyed by
version instead of date. The variant's release index is PyTorch's
(``https://download.pytorch.org/whl/<variant>``; release candidates live on the test channel,
``.../whl/test/<variant>``), or ``pypi``: the default index pip is configured with.

A remote release is installed by requirement (``torch==X.Y.Z`` from its index), so pip's or
uv's own cache serves a release that any other environment on the machine already fetched;
a release on a local index is installed from its wheel file, as a nightly is.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from packaging import tags
from packaging.version import Version

from opforge.errors import OpforgeError, UsageError
from opforge.pipconfig import read_pip_config

from .index import PROJECT, Nightly, installable_wheels, is_local, read_links, target_tags
from .overlay import Commit

DEFAULT_RELEASE_INDEX = "https://download.pytorch.org/whl"
PYPI = "pypi"
PYPI_SIMPLE = "https://pypi.org/simple"


@dataclass(frozen=True)
class Release:
    """One released torch (or a release candidate): the wheel chosen for this interpreter."""

    version: str          # e.g. "2.12.0", "2.13.0rc2", "2.13.0+cpu"
    filename: str
    url: str
    sha256: str | None = None
    index: str | None = None  # the index to install it from; None: pip's configured default

    @property
    def key(self) -> str:
        """How the state, the log and the report name it."""
        return str(Version(self.version))

    @property
    def parsed(self) -> Version:
        return Version(self.version)

    @property
    def by_requirement(self) -> bool:
        """Installed as ``torch==VERSION`` from its index (remote), not from its file."""
        return not self.url.startswith("file://")

    def to_json(self) -> dict:
        return {"kind": "release", "version": self.version, "filename": self.filename,
                "url": self.url, "sha256": self.sha256, "index": self.index}

    @classmethod
    def from_json(cls, data: dict) -> Release:
        fields = [data["version"], data["filename"], data["url"]]
        optional = [data.get("sha256"), data.get("index")]
        if not all(isinstance(f, str) for f in fields) or not all(
                isinstance(f, (str, type(None))) for f in optional):
            raise TypeError("a release's version, filename, url, sha256 and index are strings")
        Version(fields[0])
        return cls(*fields, *optional)


Candidate = Nightly | Release


def order_key(candidate: Candidate) -> tuple:
    """Releases (by version) before nightlies (by date): the order a report lists probes in."""
    if isinstance(candidate, Release):
        return (0, candidate.parsed, "")
    if isinstance(candidate, Nightly):
        return (1, Version("0"), candidate.day)
    return (2, Version("0"), "")  # commits: in the order they were probed


def candidate_from_json(data: dict) -> Candidate:
    """A nightly or a release, as the state file stores it."""
    if not isinstance(data, dict):
        raise TypeError("a candidate must be an object")
    if data.get("kind") == "release":
        return Release.from_json(data)
    if data.get("kind") == "commit":
        return Commit.from_json(data)
    return Nightly.from_json(data)


def release_index(given: str | None, variant: str) -> str:
    """The index releases are read from: ``pypi`` names pip's configured default index."""
    if given is None:
        return f"{DEFAULT_RELEASE_INDEX}/{'cpu' if variant == 'mps' else variant}"
    return given


def _listing_url(index: str) -> str:
    if index != PYPI:
        return index

    return read_pip_config().index_url or PYPI_SIMPLE


def choose_releases(links: Iterable, accepted: Sequence[tags.Tag], index: str) -> list[Release]:
    """The best-tagged wheel of each released version (highest build tag), oldest first."""
    best: dict[Version, tuple[tuple, Release]] = {}
    for link, version, build, rank in installable_wheels(links, accepted, PROJECT):
        if version.is_devrelease or version.is_postrelease:
            continue
        key = (build, -rank)
        release = Release(str(version), link.filename, link.url, link.sha256,
                          None if index == PYPI else index)
        if version not in best or key > best[version][0]:
            best[version] = (key, release)
    return [best[v][1] for v in sorted(best)]


@dataclass(frozen=True)
class ReleaseIndex:
    index: str
    releases: tuple[Release, ...]   # oldest first

    def find(self, version: Version) -> Release | None:
        for release in self.releases:
            if release.parsed == version or (release.parsed.public == str(version)
                                             and not version.local):
                return release
        return None

    def between(self, good: Release, bad: Release) -> list[Release]:
        return [r for r in self.releases if good.parsed <= r.parsed <= bad.parsed]

    def neighbours(self, version: Version) -> str:
        older = [r.key for r in self.releases if r.parsed < version][-1:]
        newer = [r.key for r in self.releases if r.parsed > version][:1]
        return "; ".join([f"nearest before: {older[0]}" if older else "none before it",
                          f"nearest after: {newer[0]}" if newer else "none after it"])


def load_releases(index: str, python: str, platforms: Sequence[str] | None = None) -> ReleaseIndex:
    """The releases ``index`` lists for this interpreter; an unreachable index is bad input."""
    url = _listing_url(index)
    try:
        links = read_links(url)
    except UsageError:
        raise
    except OpforgeError as exc:
        raise UsageError(str(exc).replace("nightly index", "release index").replace(
            "--index", "--release-index")) from None
    releases = choose_releases(links, target_tags(python, platforms), index)
    if not releases:
        where = url if is_local(url) else f"{url} ({index})"
        raise UsageError(f"--release-index {where}: no torch release for Python {python} on "
                         "this platform")
    return ReleaseIndex(index, tuple(releases))


def nightlies_between(nightlies: Iterable[Nightly], good: Release, bad: Release) -> list[Nightly]:
    """The nightlies built from main between two releases' branch cuts, oldest first.

    Nightlies after release X.Y's branch cut carry the next version (X.Y+1.0.devDATE), so the
    main-branch changes that reached ``bad`` but not ``good`` are in the nightlies whose base
    version is above ``good``'s minor and at most ``bad``'s. Two releases of one branch (2.12.0
    and 2.12.1) differ by cherry-picks that no nightly isolates: none.
    """
    lo, hi = good.parsed.release[:2], bad.parsed.release[:2]
    out = []
    for nightly in nightlies:
        base = Version(nightly.version).release[:2]
        if lo < base <= hi:
            out.append(nightly)
    return sorted(out, key=lambda n: n.date)
