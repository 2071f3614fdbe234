"""The wheel variants of an index tree (``opforge index``, PEP 825 draft): one URL for every build.

Beside the per-variant pages of ``opforge.index`` (left byte for byte as they are, for the
installers that know nothing of variants), the tree gets::

    wheel-variants/index.html                          PEP 503 root: the projects with variant wheels
    wheel-variants/<project>/index.html                every variant wheel, the null variant's plain
                                                       copy, and each version's variants JSON
    wheel-variants/<project>/<wheel>(.metadata)        the wheels (PEP 658 metadata beside them)
    wheel-variants/<project>/<name>-<version>-variants.json

``wheel-variants`` cannot be a matrix variant's name (a dash), so it never meets a variant's
pages. The wheels come from ``dist/<variant>/variants/``, where ``opforge build --variants``
writes them. Each version's variants JSON is variantlib's merge (``VariantsJson.merge``) of the
variant.json files of that version's published and added wheels, so it is derived, like the
pages, and written anew; the wheels follow the index's rules: none is lost, a published file
name never gets other bytes (exit 1, nothing written), two wheels with one label and
different properties are refused too.

``resolve`` is the installer's half, for checking a published index from a host: it reads the
variants JSON over HTTP and lets variantlib ask the provider plugins (its own mechanism: each
provider's ``plugin-api``, run in the host's interpreter) which variant fits best.
"""

from __future__ import annotations

import hashlib
import html
import json
import stat
import zipfile
from dataclasses import dataclass
from email.parser import Parser
from pathlib import Path

from packaging.tags import sys_tags
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.utils import parse_wheel_filename as parse
from packaging.version import InvalidVersion, Version

from opforge import index, variants
from opforge.errors import OpforgeError, UsageError
from opforge.files import lookup

SITE_DIR = index.VARIANT_SITE_DIR


@dataclass(frozen=True)
class VariantFile:
    """One wheel of ``wheel-variants/``: a labelled variant wheel or the null variant's copy."""

    entry: index.Entry        # its page row (variant = SITE_DIR)
    namever: str              # the file name's "<name>-<version>", which names the JSON
    label: str | None         # None: the plain copy
    dist_info: bytes | None   # its variant.json


def _read(path: Path, *, published: bool, folder: str | None = None) -> VariantFile:
    base, label = variants.split_label(path.name)
    try:
        name, version, _build, _tags = parse_wheel_filename(base)
    except InvalidWheelFilename as exc:
        raise UsageError(f"{path}: not a wheel file name ({exc})") from None
    found = variants.read_variant(path)
    if found is None or found.declared is None:
        raise UsageError(f"{path}: not a wheel variant (no variant label, variant.json or "
                         "wheel_variant in its build record): opforge build --variants writes "
                         "them")
    problems = variants.check_variant_wheel(path)
    if problems:
        raise UsageError(f"{path}: {problems[0]}")
    built_for = (found.record or {}).get("variant")
    if folder is not None and built_for != folder:
        raise UsageError(f"{path}: its build record says variant {built_for!r}, but it is "
                         f"under {folder}/variants/")
    metadata, _record = index._read_wheel(path)
    parsed = Parser().parsestr(metadata.decode("utf-8", "replace"), headersonly=True)
    entry = index.Entry(variant=SITE_DIR, project=canonicalize_name(str(name)),
                        filename=path.name, source=path, sha256=index._sha256(path),
                        metadata=metadata, requires_python=parsed.get("Requires-Python"),
                        torch=None, published=published)
    dist_info = None
    if label is not None:
        with zipfile.ZipFile(path) as archive:
            dist_info = archive.read(next(n for n in archive.namelist()
                                          if n.endswith(f".dist-info/{variants.DIST_INFO_FILE}")))
    return VariantFile(entry, "-".join(base.split("-")[:2]), label, dist_info)


def collect_dist(dist: Path) -> list[VariantFile]:
    """The variant wheels to add: ``dist/<variant>/variants/*.whl``, as opforge build writes
    them, and ``dist/wheel-variants/*.whl``, where the release workflow downloads every
    cell's (their build records name their variants)."""
    flat = Path(dist) / SITE_DIR
    info = lookup(flat, what="DIST")
    found = [_read(path, published=False) for path in sorted(flat.glob("*.whl"))] \
        if info is not None and stat.S_ISDIR(info.st_mode) else []
    for folder in sorted(p for p in Path(dist).iterdir() if p.is_dir()
                         and not p.name.startswith(".") and p.name != SITE_DIR):
        sub = folder / variants.SUBDIR
        info = lookup(sub, what="DIST")
        if info is None or not stat.S_ISDIR(info.st_mode):
            continue
        for path in sorted(sub.glob("*.whl")):
            found.append(_read(path, published=False, folder=folder.name))
    return found


def collect_published(site: Path) -> list[VariantFile]:
    root = Path(site) / SITE_DIR
    if not root.is_dir() or root.is_symlink():
        return []
    found = []
    for project in sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink()):
        for path in sorted(project.glob("*.whl")):
            if path.is_symlink() or not path.is_file():
                raise UsageError(f"{path}: a published wheel must be a regular file")
            found.append(_read(path, published=True))
    return found


@dataclass(frozen=True)
class VariantPlan:
    files: list[VariantFile]              # every wheel of wheel-variants/, published and added
    documents: dict[str, bytes]           # relative path -> bytes: JSON files and pages

    @property
    def added(self) -> list[VariantFile]:
        return [f for f in self.files if not f.entry.published]


def _variants_json(group: list[VariantFile]) -> bytes:
    # variantlib (~20 ms, and require_variantlib's message where it is missing): wheel
    # variants only
    from variantlib.errors import ValidationError
    from variantlib.variant_dist_info import VariantDistInfo
    from variantlib.variants_json import VariantsJson

    merged = None
    for item in sorted(group, key=lambda f: f.entry.filename):
        if item.dist_info is None:
            continue
        one = VariantDistInfo(item.dist_info, item.label)
        try:
            if merged is None:
                merged = VariantsJson(one)
            merged.merge(one)
        except ValidationError as exc:
            what = f"{item.entry.filename} cannot join the variants of {group[0].namever}: {exc}"
            if any(f.entry.published for f in group):
                raise index.IndexConflict(f"{what}; give the new build a new version, nothing "
                                          "was written") from None
            raise UsageError(what) from None
    if merged is None:
        raise UsageError(f"{group[0].namever}: a plain copy but no variant wheel")
    by_properties: dict[str, str] = {}
    for label, vdesc in sorted(merged.variants.items()):
        other = by_properties.setdefault(vdesc.hexdigest, label)
        if other != label:  # cu130 and cu130_stable, say: no installer could tell them apart
            what = (f"{group[0].namever}: labels {other} and {label} declare the same "
                    "properties, so an installer cannot choose between them; publish one of "
                    "those variants with --variants")
            if any(f.entry.published for f in group):
                raise index.IndexConflict(what + ", nothing was written")
            raise UsageError(what)
    return merged.to_str().encode()


def _json_anchor(name: str, data: bytes) -> str:
    return (f'    <a href="{html.escape(name)}#sha256={hashlib.sha256(data).hexdigest()}">'
            f"{html.escape(name)}</a><br>")


def plan(dist: Path, site: Path) -> VariantPlan | None:
    """What ``wheel-variants/`` becomes (None: no variant wheel given nor published); every
    refusal is raised here, before the index writes anything."""
    added = collect_dist(dist)
    published = collect_published(site)
    if not added and not published:
        return None
    variants.require_variantlib("publishing wheel variants")
    merged = index.merge([f.entry for f in published], [f.entry for f in added])
    by_path = {f.entry.path: f for f in published}
    for f in added:
        by_path.setdefault(f.entry.path, f)
    files = [by_path[e.path] for e in merged]
    documents: dict[str, bytes] = {}
    projects: dict[str, list[VariantFile]] = {}
    for f in files:
        projects.setdefault(f.entry.project, []).append(f)
    for project, group in sorted(projects.items()):
        versions: dict[str, list[VariantFile]] = {}
        for f in group:
            versions.setdefault(f.namever, []).append(f)
        rows = [index._anchor(f.entry.filename, f.entry) for f in group]
        for namever, members in sorted(versions.items()):
            name = f"{namever}-variants.json"
            data = _variants_json(members)
            documents[f"{SITE_DIR}/{project}/{name}"] = data
            rows.append(_json_anchor(name, data))
        documents[f"{SITE_DIR}/{project}/index.html"] = index._page(
            f"Links for {project} (wheel variants)", rows)
    documents[f"{SITE_DIR}/index.html"] = index._page("Simple index (wheel variants)", [
        f'    <a href="{html.escape(p)}/">{html.escape(p)}</a><br>' for p in sorted(projects)])
    return VariantPlan(files, documents)


def write(variant_plan: VariantPlan, site: Path) -> None:
    """Wheels and metadata first, then the JSON files and project pages, the root last."""
    site = Path(site)
    docs = variant_plan.documents
    targets = [f.entry.path for f in variant_plan.added] + \
        [f"{f.entry.path}.metadata" for f in variant_plan.files] + list(docs)
    for relative in targets:
        index._refuse_links(site, relative)
    for f in variant_plan.added:
        if not (site / f.entry.path).exists():
            index._write(site, f.entry.path, source=f.entry.source)
    for f in variant_plan.files:
        target = site / f"{f.entry.path}.metadata"
        if not (target.is_file() and target.read_bytes() == f.entry.metadata):
            index._write(site, f"{f.entry.path}.metadata", f.entry.metadata)
    for relative in sorted(docs, key=lambda p: (-p.count("/"), not p.endswith(".json"), p)):
        target = site / relative
        if not (target.is_file() and target.read_bytes() == docs[relative]):
            index._write(site, relative, docs[relative])


def fetch_published(base_url: str, site: Path) -> int:
    """Copy the variant wheels the index at ``base_url`` serves into ``site`` (each checked
    against its page's sha256); none published yet (404) is none. Returns how many."""
    base = base_url.rstrip("/") + f"/{SITE_DIR}/"
    fetched = 0
    for project in sorted({h.rstrip("/") for h in index._links(base) or [] if h.endswith("/")}):
        if not index._SAFE_PART.match(project):
            continue
        for href in index._links(f"{base}{project}/") or []:
            name, _, fragment = href.partition("#")
            if "/" in name or not name.endswith(".whl") or not index._SAFE_PART.match(name):
                continue
            target = f"{SITE_DIR}/{project}/{name}"
            index._refuse_links(site, target)
            if (Path(site) / target).exists():
                continue
            data = index._get(f"{base}{project}/{name}")
            if data is None:
                raise OpforgeError(f"{base}{project}/{name}: listed on its page but not served")
            if fragment.startswith("sha256=") and \
                    hashlib.sha256(data).hexdigest() != fragment.removeprefix("sha256="):
                raise OpforgeError(f"{base}{project}/{name}: its bytes do not match the sha256 "
                                   "its page lists; no page was written")
            index._write(site, target, data)
            fetched += 1
    return fetched


def resolve(index_url: str, project: str, version: str, *, python: str | None = None,
            tags: list[str] | None = None) -> str:
    """The file a variant-aware installer takes for ``project`` ``version`` from the
    ``wheel-variants/`` index at ``index_url``, on the host whose interpreter is ``python``
    (its provider plugins answer; default: this one); ``tags``: the platform tags it accepts
    (default: this interpreter's). An OpforgeError when no wheel fits, naming what the
    variants need."""
    variants.require_variantlib("resolving wheel variants")
    # variantlib: wheel variants only, after require_variantlib
    from variantlib.api import get_variants_by_priority
    from variantlib.errors import PluginError
    from variantlib.plugins import loader

    # variantlib caches the plugins' answers by plugin and command, not by interpreter: one
    # host per call, so another host's answers must not be taken for this one's
    loader.VARIANT_PROVIDER_CACHE_TABLE.clear()

    page = f"{index_url.rstrip('/')}/{canonicalize_name(project)}/"
    hrefs = [h.partition("#")[0] for h in index._links(page) or []]
    if not hrefs:
        raise OpforgeError(f"{page}: no such project page")
    accepted = tags if tags is not None else [str(t) for t in sys_tags()]
    rank = {t: i for i, t in enumerate(accepted)}
    wheels: dict[str | None, list[tuple[int, str]]] = {}
    json_name = None
    for href in hrefs:
        if href.endswith("-variants.json"):  # <name>-<version>: the name has no dash
            if _same_version(href[:-len("-variants.json")].partition("-")[2], version):
                json_name = href
            continue
        base, label = variants.split_label(href)
        try:
            _name, got, _build, wheel_tags = parse(base)
        except InvalidWheelFilename:
            continue
        fits = [rank[str(t)] for t in wheel_tags if str(t) in rank]
        if _same_version(str(got), version) and fits:
            wheels.setdefault(label, []).append((min(fits), href))
    if json_name is None:
        raise OpforgeError(f"{page}: no variants JSON for {project} {version}")
    body = index._get(page + json_name)
    try:
        order = get_variants_by_priority(variants_json=json.loads(body or b"{}"),
                                         venv_python_executable=python)
    except (PluginError, ValueError) as exc:  # the plugin's traceback: its last line says why
        last = (str(exc).strip().splitlines() or ["?"])[-1]
        raise OpforgeError(f"the provider plugins {json_name} names failed on this host "
                           f"(install them into --host-python): {last}") from None
    # the variants in variantlib's order, then the wheels that are no variant (PEP 825)
    for choice in [*(wheels.get(vdesc.label) for vdesc in order), wheels.get(None)]:
        if choice:
            return min(choice)[1]
    needs = "; ".join(f"{label}: {', '.join(sorted(p.to_str() for p in d.properties))}"
                      for label, d in sorted(_described(json.loads(body or b"{}")).items())
                      if d.properties)
    raise OpforgeError(f"no wheel of {project} {version} fits this host: no variant's "
                       f"properties are supported here ({needs or 'none'}) and the index has "
                       "no null variant (a CPU build) to fall back on")


def _same_version(a: str, b: str) -> bool:
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return False


def _described(data: dict):
    # variantlib: wheel variants only
    from variantlib.variants_json import VariantsJson

    return VariantsJson(data).variants
