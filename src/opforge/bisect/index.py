"""The nightly index: which torch nightlies exist for a platform and Python, and their wheels.

Reads a PEP 503 (HTML) or PEP 691 (JSON) project page over https, from a ``file://`` URL or
a local directory (a PEP 503 tree, or a flat directory of wheels). Versions are parsed with
``packaging`` (``2.5.0.dev20240610+cpu``: the date is the dev number; the X.Y part jumps at
each branch cut, so nothing assumes it); wheels are matched to the interpreter with
``packaging.tags``. The index lists only the newest nightlies, so an older date is looked
for by its direct wheel URL (``wheel_for_date``) before it is declared missing.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import date
from html.parser import HTMLParser
from pathlib import Path

from packaging import tags
from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import Version

from opforge.errors import OpforgeError, UsageError
from opforge.files import MAX_TEXT_BYTES, decode_utf8, lookup, parse_json, read_text
from opforge.progress import transfer

DEFAULT_INDEX = "https://download.pytorch.org/whl/nightly"
PROJECT = "torch"
_ACCEPT = "application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.1"
_TIMEOUT = 60


@dataclass(frozen=True)
class Nightly:
    """One nightly wheel: the build chosen for its date."""

    date: date
    version: str          # e.g. "2.5.0.dev20240610+cpu"
    filename: str
    url: str
    sha256: str | None = None  # from the index when it gives one; nightly pages usually do not
    companions: tuple[Nightly, ...] = ()  # --with: torchvision etc. of the same date

    @property
    def day(self) -> str:
        return self.date.isoformat()

    @property
    def key(self) -> str:
        """How the state, the log and the report name it (a release's key is its version)."""
        return self.day

    def to_json(self) -> dict:
        data = {"date": self.day, "version": self.version, "filename": self.filename,
                "url": self.url, "sha256": self.sha256}
        if self.companions:
            data["companions"] = [c.to_json() for c in self.companions]
        return data

    @classmethod
    def from_json(cls, data: dict) -> Nightly:
        fields = [data["date"], data["version"], data["filename"], data["url"]]
        sha = data.get("sha256")
        if not all(isinstance(f, str) for f in fields) or not isinstance(sha, (str, type(None))):
            raise TypeError("a nightly's date, version, filename, url and sha256 are strings")
        companions = data.get("companions", [])
        if not isinstance(companions, list):
            raise TypeError("a nightly's companions are a list")
        return cls(date.fromisoformat(fields[0]), *fields[1:], sha,
                   tuple(cls.from_json(c) for c in companions))

    @property
    def project(self) -> str:
        return self.filename.split("-", 1)[0]


def nightly_date(version: Version) -> date | None:
    """The date of a nightly version (``X.Y.Z.devYYYYMMDD``), None for anything else."""
    if version.dev is None or version.pre is not None or version.post is not None:
        return None
    text = str(version.dev)
    if len(text) != 8:
        return None
    try:
        return date(int(text[:4]), int(text[4:6]), int(text[6:]))
    except ValueError:
        return None


def target_tags(python: str, platforms: Sequence[str] | None = None) -> list[tags.Tag]:
    """Wheel tags a CPython ``python`` ("3.11") accepts on this machine's platform, best first."""
    try:
        version = tuple(int(p) for p in python.split(".")[:2])
    except ValueError:
        raise UsageError(f"--python: expected a version like 3.11, got {python!r}") from None
    plats = list(platforms) if platforms else list(tags.platform_tags())
    return [*tags.cpython_tags(version, platforms=plats),
            *tags.compatible_tags(version, f"cp{version[0]}{version[1]}", plats)]


def variant_index(base: str, variant: str) -> str:
    """The per-variant nightly index: macOS arm64 wheels (mps) live under ``cpu``."""
    return f"{base.rstrip('/')}/{'cpu' if variant == 'mps' else variant}"


# -- reading an index --------------------------------------------------------------------------

@dataclass(frozen=True)
class _Link:
    filename: str
    url: str
    sha256: str | None


class _Anchors(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []
        self.base: str | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "a" and attrs.get("href"):
            self.hrefs.append(attrs["href"])
        elif tag == "base" and attrs.get("href"):
            self.base = attrs["href"]


def is_local(index: str) -> bool:
    """A directory or a file:// URL (read from disk), not a server."""
    return "://" not in index or index.startswith("file://")


def local_path(location: str) -> Path:
    """The path a local index location (a directory or a file:// URL) names."""
    if location.startswith("file://"):
        return Path(urllib.request.url2pathname(urllib.parse.urlparse(location).path))
    return Path(location).expanduser()


def _split_fragment(url: str) -> tuple[str, str | None]:
    url, _, fragment = url.partition("#")
    key, _, value = fragment.partition("=")
    return url, (value.lower() if key == "sha256" and value else None)


def _links_from_html(text: str, page_url: str) -> list[_Link]:
    parser = _Anchors()
    parser.feed(text)
    base = urllib.parse.urljoin(page_url, parser.base) if parser.base else page_url
    links = []
    for href in parser.hrefs:
        url, sha = _split_fragment(urllib.parse.urljoin(base, href))
        name = urllib.parse.unquote(url.rstrip("/").rsplit("/", 1)[-1])
        links.append(_Link(name, url, sha))
    return links


def _links_from_json(text: str, page_url: str) -> list[_Link]:
    try:
        data = parse_json(text, page_url)
        files = data["files"]
        links = []
        for entry in files:
            url, sha = _split_fragment(urllib.parse.urljoin(page_url, entry["url"]))
            sha = (entry.get("hashes") or {}).get("sha256", sha)
            links.append(_Link(entry["filename"], url, sha))
        return links
    except (ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"{page_url}: not a PEP 691 project page ({exc})") from None


def _read_local(root: Path, project_name: str = PROJECT) -> list[_Link]:
    info = lookup(root, what="--index")
    if info is None or not stat.S_ISDIR(info.st_mode):
        raise UsageError(f"--index {root}: no such directory")
    project = root / project_name
    for page, reader in ((project / "index.json", _links_from_json),
                         (project / "index.html", _links_from_html),
                         (root / "index.html", _links_from_html)):
        if page.exists():
            return reader(read_text(page, what="--index page"), page.as_uri())
    folder = project if project.is_dir() else root  # find-links style: a folder of wheels
    return [_Link(p.name, p.resolve().as_uri(), None) for p in sorted(folder.glob("*.whl"))]


def _read_remote(index: str, project: str = PROJECT) -> list[_Link]:
    page_url = f"{index.rstrip('/')}/{project}/"
    request = urllib.request.Request(page_url, headers={"Accept": _ACCEPT})
    try:
        with urllib.request.urlopen(request, timeout=_TIMEOUT) as response:
            content_type = response.headers.get("Content-Type", "")
            body = response.read(MAX_TEXT_BYTES + 1)
            page_url = response.geturl()
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise OpforgeError(f"cannot read the nightly index {page_url}: {reason}; "
                           "pass --index with a reachable index (a URL, file:// or a directory)"
                           ) from None
    if len(body) > MAX_TEXT_BYTES:
        raise UsageError(f"{page_url}: the index page is larger than {MAX_TEXT_BYTES} bytes")
    text = decode_utf8(body, page_url)
    if "json" in content_type:
        return _links_from_json(text, page_url)
    return _links_from_html(text, page_url)


def read_links(index: str, project: str = PROJECT) -> list[_Link]:
    if is_local(index):
        return _read_local(local_path(index), project)
    return _read_remote(index, project)


# -- choosing wheels ---------------------------------------------------------------------------

@dataclass(frozen=True)
class NightlyIndex:
    """The nightlies an index offers for one interpreter, one (the last build) per date."""

    index: str
    nightlies: tuple[Nightly, ...]    # oldest first

    def by_date(self, day: date) -> Nightly | None:
        for nightly in self.nightlies:
            if nightly.date == day:
                return nightly
        return None

    def between(self, good: date, bad: date) -> list[Nightly]:
        return [n for n in self.nightlies if good <= n.date <= bad]

    def on_or_before(self, day: date) -> Nightly | None:
        older = [n for n in self.nightlies if n.date <= day]
        return older[-1] if older else None


def installable_wheels(links: Iterable, accepted: Sequence[tags.Tag], project: str):
    """(link, version, build, rank) of each of ``project``'s wheels this target can install;
    rank 0 is the most specific accepted tag. Other files, names and platforms are passed over."""
    rank = {tag: i for i, tag in enumerate(accepted)}
    for link in links:
        if not link.filename.endswith(".whl"):
            continue
        try:
            name, version, build, wheel_tags = parse_wheel_filename(link.filename)
        except InvalidWheelFilename:
            continue
        ranks = [rank[t] for t in wheel_tags if t in rank]
        if name == project and ranks:
            yield link, version, build, min(ranks)


def choose_nightlies(links: Iterable[_Link], accepted: Sequence[tags.Tag],
                     project: str = PROJECT) -> list[Nightly]:
    """The best-tagged wheel of the last build of each date, oldest date first."""
    best: dict[date, tuple[tuple, Nightly]] = {}
    for link, version, build, rank in installable_wheels(links, accepted, project):
        day = nightly_date(version)
        if day is None:
            continue
        # Several builds on one date (a branch cut, a rebuild): the last one wins.
        key = (version, build, -rank)
        nightly = Nightly(day, str(version), link.filename, link.url, link.sha256)
        if day not in best or key > best[day][0]:
            best[day] = (key, nightly)
    return [best[d][1] for d in sorted(best)]


def load_index(index: str, python: str, platforms: Sequence[str] | None = None,
               companions: Sequence[str] = ()) -> NightlyIndex:
    """The index's nightlies; with ``companions`` (--with torchvision), each nightly carries
    the companions' wheels of its date (a date without one carries fewer: it is skipped)."""
    accepted = target_tags(python, platforms)
    nightlies = choose_nightlies(read_links(index), accepted)
    for name in companions:
        try:
            found = {n.date: n for n in choose_nightlies(read_links(index, name), accepted, name)}
        except OpforgeError:
            found = {}  # an index without that project: every date lacks it
        nightlies = [replace(n, companions=(*n.companions, found[n.date])) if n.date in found
                     else n for n in nightlies]
    return NightlyIndex(index, tuple(nightlies))


def _exists(url: str) -> bool:
    if url.startswith("file://"):
        return local_path(url).is_file()
    request = urllib.request.Request(url, method="HEAD")
    try:
        with urllib.request.urlopen(request, timeout=_TIMEOUT) as response:
            return 200 <= response.status < 300
    except (urllib.error.URLError, OSError):
        return False


def direct_url_guesses(listed: NightlyIndex, day: date, minors_back: int = 3) -> list[Nightly]:
    """Wheels that would exist for ``day`` if the index still listed it.

    The version of an unlisted date is unknown (X.Y jumps at branch cuts): guess the oldest
    listed X.Y and a few minors before it, with the oldest listed wheel's tags and local part,
    in the same directory as its URL.
    """
    if not listed.nightlies:
        return []
    template = listed.nightlies[0]
    version = Version(template.version)
    tag_text = template.filename[:-4].rsplit("-", 3)[1:]  # python-abi-platform, as published
    local = f"+{version.local}" if version.local else ""
    directory = template.url.rsplit("/", 1)[0]
    major, minor = version.release[0], version.release[1]
    guesses = []
    for back in range(0, minors_back + 1):
        if minor - back < 0:
            break
        text = f"{major}.{minor - back}.0.dev{day:%Y%m%d}{local}"
        filename = f"{PROJECT}-{text}-{'-'.join(tag_text)}.whl"
        url = f"{directory}/{urllib.parse.quote(filename)}"
        guesses.append(Nightly(day, text, filename, url, None))
    return guesses


def find_unlisted(listed: NightlyIndex, day: date) -> Nightly | None:
    """Look for ``day``'s wheel by direct URL (dates older than the index lists)."""
    for guess in direct_url_guesses(listed, day):
        if _exists(guess.url):
            return guess
    return None


def with_unlisted(listed: NightlyIndex, extra: Iterable[Nightly]) -> NightlyIndex:
    merged = {n.date: n for n in listed.nightlies}
    for nightly in extra:
        merged.setdefault(nightly.date, nightly)
    return replace(listed, nightlies=tuple(merged[d] for d in sorted(merged)))


# -- downloading -------------------------------------------------------------------------------

def _copy_with_progress(response, out, name: str) -> None:
    length = response.headers.get("Content-Length")
    total = int(length) if length and length.isdigit() else None
    with transfer(f"downloaded {name}", total) as advance:
        while chunk := response.read(1 << 20):
            out.write(chunk)
            advance(len(chunk))


def download(nightly: Nightly, dest_dir: Path) -> tuple[Path, str]:
    """Fetch the wheel into ``dest_dir`` (kept across runs); return its path and sha256.

    Nightly links usually carry no hash, so the sha256 is computed here and recorded; when
    the index does give one, a mismatch is an error.
    """
    dest_dir.mkdir(parents=True, exist_ok=True)
    dest = dest_dir / nightly.filename
    if not dest.is_file():
        fd, tmp_name = tempfile.mkstemp(dir=dest_dir, prefix=".part-")
        try:
            with os.fdopen(fd, "wb") as out:
                if nightly.url.startswith("file://"):
                    with open(local_path(nightly.url), "rb") as src:
                        shutil.copyfileobj(src, out)
                else:
                    with urllib.request.urlopen(nightly.url, timeout=_TIMEOUT) as response:
                        _copy_with_progress(response, out, nightly.filename)
            os.replace(tmp_name, dest)
        except (urllib.error.URLError, OSError) as exc:
            Path(tmp_name).unlink(missing_ok=True)
            raise OpforgeError(f"cannot download {nightly.url}: {getattr(exc, 'reason', exc)}"
                               ) from None
    digest = sha256_of(dest)
    if nightly.sha256 and nightly.sha256 != digest:
        dest.unlink()
        raise OpforgeError(f"{nightly.filename}: sha256 {digest} does not match the index's "
                           f"{nightly.sha256}; the download was removed, run again")
    return dest, digest


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
