"""A static package index per variant, built from ``dist/<variant>/`` wheels (``opforge index``).

The tree it writes (served as is by GitHub Pages, a bucket or ``python -m http.server``)::

    index.html                              the variants, and the find-links pages
    <variant>/index.html                    PEP 503 root: every project of that variant
    <variant>/<project>/index.html          PEP 503 project page: one anchor per wheel
    <variant>/<project>/<wheel>             the wheel
    <variant>/<project>/<wheel>.metadata    its METADATA (PEP 658 / 714)
    torch-<version>+<variant>.html          find-links page: the wheels built for that torch

so ``pip install NAME --index-url <base>/cu130/ --extra-index-url <torch's cu130 index>`` and
``pip install NAME -f <base>/torch-2.14.1+cu130.html`` both work, as with torch's ``/whl/cu130``
and PyG's per-torch pages. Each anchor carries ``#sha256=``, ``data-requires-python`` and the
metadata file's hash (``data-dist-info-metadata`` and ``data-core-metadata``).

The tree is its own state: every wheel already published under it is kept, and its pages are
written anew from the union of what is there and what is added. A wheel whose file name is
published with other bytes is refused (a file name is a promise pip caches on) before anything
is written; files go through temporary names renamed into place, wheels and metadata first,
then project pages, then the roots, so a reader never meets a link to a missing file. The
output depends only on the wheels: the same wheels give the same bytes.
"""

from __future__ import annotations

import hashlib
import html
import json
import os
import re
import stat
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from dataclasses import dataclass
from email.parser import Parser
from html.parser import HTMLParser
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import (
    InvalidWheelFilename,
    canonicalize_name,
    parse_wheel_filename,
)

from opforge.errors import OpforgeError, UsageError
from opforge.files import check_writable, lookup, open_regular
from opforge.stamp import RECORD_NAME

MAX_METADATA = 16 << 20
VARIANT_SITE_DIR = "wheel-variants"  # opforge.variant_index's pages: no variant's name (a dash)
_VARIANT = re.compile(r"[a-z0-9][a-z0-9_.]*\Z")


class IndexConflict(OpforgeError):
    """A published file name would change bytes: exit 1, nothing written."""

    exit_code = 1


@dataclass(frozen=True)
class Entry:
    """One wheel of the index: where it comes from and what its pages say about it."""

    variant: str
    project: str          # PEP 503 normalized name
    filename: str
    source: Path          # the file to copy (for a published wheel: itself)
    sha256: str
    metadata: bytes       # the wheel's .dist-info/METADATA
    requires_python: str | None
    torch: str | None     # the torch requirement's version part: "2.14.1", ">=2.10"
    published: bool

    @property
    def path(self) -> str:
        return f"{self.variant}/{self.project}/{self.filename}"

    @property
    def metadata_sha256(self) -> str:
        return hashlib.sha256(self.metadata).hexdigest()

    @property
    def find_links_page(self) -> str | None:
        """``torch-2.14.1+cu130.html`` for a pinned torch, ``torch-2.10-up+cpu_stable.html``
        for a floor; None for a wheel that asks for no torch."""
        if not self.torch:
            return None
        if self.torch.startswith("=="):
            return f"torch-{self.torch[2:]}+{self.variant}.html"
        if self.torch.startswith(">="):
            return f"torch-{self.torch[2:]}-up+{self.variant}.html"
        return None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open_regular(path, what="wheel") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _read_wheel(path: Path) -> tuple[bytes, dict | None]:
    """METADATA and the opforge build record (None: not stamped) of a wheel."""
    try:
        with open_regular(path, what="wheel") as fh, zipfile.ZipFile(fh) as archive:
            names = archive.namelist()
            meta = [n for n in names if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)]
            if len(meta) != 1:
                raise UsageError(f"{path}: not a valid wheel (no single .dist-info/METADATA)")
            info = archive.getinfo(meta[0])
            if info.file_size > MAX_METADATA:
                raise UsageError(f"{path}: METADATA is {info.file_size} bytes, more than "
                                 f"{MAX_METADATA}")
            metadata = archive.read(info)
            record = None
            records = [n for n in names
                       if re.fullmatch(r"[^/]+\.dist-info/" + re.escape(RECORD_NAME), n)]
            if records and archive.getinfo(records[0]).file_size <= MAX_METADATA:
                try:
                    record = json.loads(archive.read(records[0]))
                except ValueError:
                    record = None
            return metadata, record if isinstance(record, dict) else None
    except (zipfile.BadZipFile, OSError, EOFError, NotImplementedError) as exc:
        raise UsageError(f"{path}: not a valid wheel ({exc})") from None


def _torch_of(metadata: Parser) -> str | None:
    for text in metadata.get_all("Requires-Dist") or []:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if canonicalize_name(req.name) == "torch" and req.marker is None:
            specs = list(req.specifier)
            if len(specs) == 1 and specs[0].operator in ("==", ">="):
                return f"{specs[0].operator}{specs[0].version}"
            return str(req.specifier) or None
    return None


def read_entry(path: Path, variant: str, *, published: bool) -> Entry:
    try:
        name, _version, _build, _tags = parse_wheel_filename(path.name)
    except InvalidWheelFilename as exc:
        raise UsageError(f"{path}: not a wheel file name ({exc})") from None
    metadata, record = _read_wheel(path)
    if record and record.get("variant") and record["variant"] != variant and not published:
        raise UsageError(f"{path}: its build record says variant {record['variant']!r}, but it "
                         f"is under {variant}/: move it to dist/{record['variant']}/")
    parsed = Parser().parsestr(metadata.decode("utf-8", "replace"), headersonly=True)
    if canonicalize_name(parsed.get("Name") or "") != canonicalize_name(str(name)):
        raise UsageError(f"{path}: METADATA names {parsed.get('Name')!r}, the file name "
                         f"{name!r}")
    return Entry(variant=variant, project=canonicalize_name(str(name)), filename=path.name,
                 source=path, sha256=_sha256(path), metadata=metadata,
                 requires_python=parsed.get("Requires-Python"), torch=_torch_of(parsed),
                 published=published)


def _check_variant(name: str, where: Path) -> str:
    if not _VARIANT.match(name):
        raise UsageError(f"{where}: {name!r} is not a variant name (lower-case letters, digits, "
                         "_ and .)")
    return name


def collect_dist(dist: Path) -> list[Entry]:
    """The wheels to add: ``dist/<variant>/*.whl`` (or, in ``dist`` itself, wheels whose build
    record names their variant)."""
    info = lookup(dist, what="DIST")
    if info is None or not stat.S_ISDIR(info.st_mode):
        raise UsageError(f"{dist}: no such directory (give the folder holding <variant>/*.whl)")
    entries = []
    for path in sorted(dist.glob("*.whl")):
        _, record = _read_wheel(path)
        variant = (record or {}).get("variant")
        if not isinstance(variant, str):
            raise UsageError(f"{path}: no build record names its variant; put it under "
                             f"{dist}/<variant>/")
        entries.append(read_entry(path, _check_variant(variant, path), published=False))
    for folder in sorted(p for p in dist.iterdir() if p.is_dir() and not p.name.startswith(".")
                         and p.name != VARIANT_SITE_DIR):  # wheel variants: variant_index's
        for path in sorted(folder.glob("*.whl")):
            entries.append(read_entry(path, _check_variant(folder.name, folder), published=False))
    if not entries:
        raise UsageError(f"{dist}: no wheels (expected {dist}/<variant>/*.whl, as opforge build "
                         "writes them)")
    return entries


def collect_published(site: Path) -> list[Entry]:
    """The wheels an existing tree already serves (``<variant>/<project>/*.whl``)."""
    if not site.exists():
        return []
    if site.is_symlink() or not site.is_dir():
        raise UsageError(f"{site}: not a directory")
    entries = []
    for variant_dir in sorted(p for p in site.iterdir() if p.is_dir() and not p.is_symlink()
                              and not p.name.startswith(".") and p.name != VARIANT_SITE_DIR):
        for project_dir in sorted(p for p in variant_dir.iterdir() if p.is_dir()
                                  and not p.is_symlink()):
            for path in sorted(project_dir.glob("*.whl")):
                if path.is_symlink() or not path.is_file():
                    raise UsageError(f"{path}: a published wheel must be a regular file")
                entries.append(read_entry(path, variant_dir.name, published=True))
    return entries


def merge(published: list[Entry], added: list[Entry]) -> list[Entry]:
    """Every published wheel plus the added ones; a file name that would change bytes is an
    IndexConflict, two different added wheels under one name a UsageError."""
    by_path = {e.path: e for e in published}
    problems = []
    seen: dict[str, Entry] = {}
    for entry in added:
        earlier = seen.get(entry.path)
        if earlier is not None and earlier.sha256 != entry.sha256:
            raise UsageError(f"two different wheels named {entry.filename} for {entry.variant}: "
                             f"{earlier.source} and {entry.source}")
        seen[entry.path] = entry
        old = by_path.get(entry.path)
        if old is None:
            by_path[entry.path] = entry
        elif old.sha256 != entry.sha256:
            problems.append(f"{entry.path} is published with sha256 {old.sha256[:12]}..., "
                            f"{entry.source} has {entry.sha256[:12]}...")
    if problems:
        raise IndexConflict(
            f"{len(problems)} published file name(s) would change bytes, which pip's caches "
            f"and lock files never expect: {problems[0]}"
            + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")
            + "; give the new build a new version (or a build tag), nothing was written")
    return sorted(by_path.values(), key=lambda e: (e.variant, e.project, e.filename))


def _anchor(href: str, entry: Entry) -> str:
    attrs = [f'href="{html.escape(href)}#sha256={entry.sha256}"']
    if entry.requires_python:
        attrs.append(f'data-requires-python="{html.escape(entry.requires_python)}"')
    meta = f"sha256={entry.metadata_sha256}"
    attrs += [f'data-dist-info-metadata="{meta}"', f'data-core-metadata="{meta}"']
    return f"    <a {' '.join(attrs)}>{html.escape(entry.filename)}</a><br>"


def _page(title: str, lines: list[str]) -> bytes:
    body = "\n".join(lines)
    return (f'<!DOCTYPE html>\n<html>\n  <head>\n    <meta name="pypi:repository-version" '
            f'content="1.1">\n    <title>{html.escape(title)}</title>\n  </head>\n  <body>\n'
            f"    <h1>{html.escape(title)}</h1>\n{body}\n  </body>\n</html>\n").encode()


def pages(entries: list[Entry]) -> dict[str, bytes]:
    """Every page of the tree (relative path -> bytes), in a stable order."""
    out: dict[str, bytes] = {}
    variants: dict[str, dict[str, list[Entry]]] = {}
    find_links: dict[str, list[Entry]] = {}
    for e in entries:
        variants.setdefault(e.variant, {}).setdefault(e.project, []).append(e)
        if e.find_links_page:
            find_links.setdefault(e.find_links_page, []).append(e)
    for variant, projects in sorted(variants.items()):
        for project, wheels in sorted(projects.items()):
            out[f"{variant}/{project}/index.html"] = _page(
                f"Links for {project} ({variant})",
                [_anchor(w.filename, w) for w in sorted(wheels, key=lambda w: w.filename)])
        out[f"{variant}/index.html"] = _page(
            f"Simple index ({variant})",
            [f'    <a href="{html.escape(p)}/">{html.escape(p)}</a><br>' for p in sorted(projects)])
    for page, wheels in sorted(find_links.items()):
        out[page] = _page(page[:-len(".html")],
                          [_anchor(w.path, w) for w in sorted(wheels, key=lambda w: w.path)])
    root = [f'    <a href="{html.escape(v)}/">{html.escape(v)}/</a><br>' for v in sorted(variants)]
    root += [f'    <a href="{html.escape(p)}">{html.escape(p[:-5])}</a><br>'
             for p in sorted(find_links)]
    out["index.html"] = _page("Wheels by variant", root)
    return out


def _refuse_links(site: Path, relative: str) -> None:
    """Nothing on the way to a target may be a link; folders are folders, files are files."""
    parts = relative.split("/")
    current = site
    for i, part in enumerate(parts):
        current = current / part
        try:
            info = os.lstat(current)
        except FileNotFoundError:
            return
        if stat.S_ISLNK(info.st_mode):
            raise UsageError(f"{current}: is a symbolic link; opforge index writes only inside "
                             f"{site}")
        last = i == len(parts) - 1
        if not last and not stat.S_ISDIR(info.st_mode):
            raise UsageError(f"{current}: not a directory")
        if last and not stat.S_ISREG(info.st_mode):
            raise UsageError(f"{current}: not a regular file")


def _write(site: Path, relative: str, data: bytes | None = None, source: Path | None = None,
           ) -> None:
    target = site / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, scratch = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".partial",
                                   dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            if data is not None:
                out.write(data)
            else:
                with open_regular(source, what="wheel") as src:  # type: ignore[arg-type]
                    for chunk in iter(lambda: src.read(1 << 20), b""):
                        out.write(chunk)
        os.chmod(scratch, 0o644)
        os.replace(scratch, target)
    except BaseException:
        try:
            os.unlink(scratch)
        except OSError:
            pass
        raise


def copy_pypi_clean(entries: list[Entry], out: Path) -> list[Path]:
    """Copy the wheels PyPI accepts (no local version label: the ``pypi: true`` variant's)
    into ``out``, for the trusted-publishing upload; the rest stay on the index only."""
    chosen = [e for e in entries if parse_wheel_filename(e.filename)[1].local is None]
    written = []
    for e in chosen:
        _refuse_links(out, e.filename)
        _write(out, e.filename, source=e.source)
        written.append(out / e.filename)
    return written


@dataclass(frozen=True)
class IndexResult:
    added: list[Entry]        # wheels new to the tree
    unchanged: list[Entry]    # wheels given again with the same bytes
    kept: list[Entry]         # wheels published before, not given this time
    pages: list[str]


class _Anchors(HTMLParser):
    def __init__(self):
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            href = dict(attrs).get("href")
            if href:
                self.hrefs.append(href)


def _get(url: str, timeout: float = 60) -> bytes | None:
    """The body at ``url``; None for a 404 (nothing published yet)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - http(s) only
            return response.read()
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise OpforgeError(f"{url}: HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise OpforgeError(f"{url}: {getattr(exc, 'reason', exc)}") from None


def _links(url: str) -> list[str] | None:
    body = _get(url)
    if body is None:
        return None
    parser = _Anchors()
    parser.feed(body.decode("utf-8", "replace"))
    return parser.hrefs


_SAFE_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*\Z")


def fetch_published(base_url: str, site: Path) -> int:
    """Copy the wheels a published tree at ``base_url`` serves into ``site`` (each checked
    against its page's sha256), so a merge starts from what users can install; a tree not
    published yet (404) is empty. Returns the number of wheels fetched."""
    parts = urllib.parse.urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise UsageError(f"--merge-from {base_url}: not an http(s) URL")
    base = base_url.rstrip("/") + "/"
    variants = _links(base + "index.html")
    if variants is None:
        return 0
    fetched = 0
    for variant in sorted({h.rstrip("/") for h in variants if h.endswith("/")}):
        if not _SAFE_PART.match(variant):
            continue
        for project in sorted({h.rstrip("/") for h in _links(f"{base}{variant}/") or []
                               if h.endswith("/")}):
            if not _SAFE_PART.match(project):
                continue
            for href in _links(f"{base}{variant}/{project}/") or []:
                name, _, fragment = href.partition("#")
                if "/" in name or not name.endswith(".whl") or not _SAFE_PART.match(name):
                    continue
                target = f"{variant}/{project}/{name}"
                _refuse_links(site, target)
                if (site / target).exists():
                    continue
                data = _get(f"{base}{target}")
                if data is None:
                    raise OpforgeError(f"{base}{target}: listed on its page but not served (404)")
                want = fragment.removeprefix("sha256=")
                if fragment.startswith("sha256=") and hashlib.sha256(data).hexdigest() != want:
                    raise OpforgeError(f"{base}{target}: its bytes do not match the sha256 its "
                                       "page lists; no page was written")
                _write(site, target, data)
                fetched += 1
    return fetched


def check_site(site: Path) -> None:
    """``--out`` is a real directory, or a path where one can be made: exit 2 otherwise."""
    info = lookup(site, what="--out")
    if info is None:
        try:
            link = os.lstat(site)
        except OSError:
            link = None
        if link is not None:  # a dangling link
            raise UsageError(f"--out {site}: a symbolic link to nothing; give a directory")
        check_writable(site / ".opforge-index", what="--out")
        return
    if os.path.islink(site):
        raise UsageError(f"--out {site}: a symbolic link; give the directory itself")
    if not stat.S_ISDIR(info.st_mode):
        raise UsageError(f"--out {site}: not a directory")
    check_writable(site / ".opforge-index", what="--out")


def build_index(dist: Path, site: Path, *, dry_run: bool = False) -> IndexResult:
    """Add ``dist``'s wheels to the tree at ``site`` (created when missing)."""
    site = Path(site)
    check_site(site)
    added = collect_dist(Path(dist))
    published = collect_published(site)
    entries = merge(published, added)
    tree = pages(entries)
    published_paths = {e.path for e in published}
    new = [e for e in entries if not e.published]
    given = {e.path for e in added}
    result = IndexResult(added=new,
                         unchanged=[e for e in entries if e.published and e.path in given],
                         kept=[e for e in entries if e.published and e.path not in given],
                         pages=sorted(tree))
    if dry_run:
        return result
    for relative in [e.path for e in new] + [f"{e.path}.metadata" for e in entries] + list(tree):
        _refuse_links(site, relative)
    for e in new:
        if e.path not in published_paths:
            _write(site, e.path, source=e.source)
    for e in entries:  # a metadata file is derived: (re)written for every wheel
        target = site / f"{e.path}.metadata"
        if not (target.is_file() and target.read_bytes() == e.metadata):
            _write(site, f"{e.path}.metadata", e.metadata)
    # project pages before the roots that link to them
    for relative in sorted(tree, key=lambda p: (-p.count("/"), p)):
        target = site / relative
        if not (target.is_file() and target.read_bytes() == tree[relative]):
            _write(site, relative, tree[relative])
    return result
