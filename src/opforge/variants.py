"""Wheel variants of a matrix variant's wheel (``opforge build --variants``, ``inspect``).

The WheelNext proposals (PEP 817, split into PEP 825 "Package Format" and a providers PEP)
let one index URL serve every build: a wheel carries variant properties in
``.dist-info/variant.json``, its file name ends in a variant label, the index publishes one
``{name}-{version}-variants.json`` per version, and a variant-aware installer asks provider
plugins about the host and picks the best wheel. They are drafts; opforge follows the
revisions named in ``PROPOSALS``, through ``variantlib`` (the reference library), which writes
every file of the format: opforge writes none by hand.

What a matrix variant declares comes from its platform backend, in one place
(``Backend.variant_properties`` / ``variant_provider``): a cuXYZ variant is CUDA's floor and
its architectures, cpu and mps are the null variant. The variant wheel is the stamped wheel
with the public version (``1.0``, not ``1.0+cu130``: variants of one release share one
version, so one variants JSON), its build record saying which label and properties it got.
A null variant also gets a plain copy (no label) for installers that know nothing of
variants, so the same URL installs the CPU build with today's pip and uv.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import TYPE_CHECKING

from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from opforge.errors import OpforgeError, UsageError
from opforge.platforms import get
from opforge.stamp import RECORD_NAME, _write_wheel

if TYPE_CHECKING:
    from opforge.matrix import Variant

# the revisions read (docs/adopt.md, "Wheel variants"), and the library they follow
PROPOSALS = ("PEP 825 (draft, with its August 2026 updates: python/peps#5086, #5100) and the "
             "draft providers PEP split from PEP 817 (python/peps#5133)")
VARIANTLIB = "0.2.2"
NULL_LABEL = "null"
DIST_INFO_FILE = "variant.json"   # variantlib's VARIANT_DIST_INFO_FILENAME (checked in tests)
SUBDIR = "variants"               # dist/<variant>/variants/: the variant wheels of a build
MAX_MEMBER = 1 << 20              # variant.json and the build record are a few hundred bytes
_LABEL = re.compile(r"[0-9a-z._]+\Z")


def split_label(filename: str) -> tuple[str, str | None]:
    """``x-1.0-cp311-cp311-linux_x86_64-cu130.whl`` -> (the name without label, ``cu130``).

    Six dash parts are a label unless the third is a build tag (a build tag starts with a
    digit, a Python tag never does); seven are build tag and label."""
    if not filename.endswith(".whl"):
        return filename, None
    parts = filename[:-4].split("-")
    if len(parts) == 7 or (len(parts) == 6 and not parts[2][:1].isdigit()):
        return "-".join(parts[:-1]) + ".whl", parts[-1]
    return filename, None


def require_variantlib(what: str = "--variants") -> str:
    """variantlib's version; a UsageError (exit 2, one line) when it is not installed."""
    # variantlib (~20 ms, or missing: this says so in one line): wheel variants only, and
    # variants is on the CLI's startup path
    try:
        import variantlib  # noqa: F401
    except ImportError:
        raise UsageError(f"{what} needs variantlib, the wheel variants reference library "
                         f"(an opforge dependency): pip install 'variantlib=={VARIANTLIB}'") \
            from None
    try:
        return importlib_metadata.version("variantlib")
    except importlib_metadata.PackageNotFoundError:
        return "unknown"


def status_line(installed: str) -> str:
    """The one line a variant command prints: which drafts, which library."""
    drift = "" if installed == VARIANTLIB else f", tested with {VARIANTLIB}"
    return (f"wheel variants follow {PROPOSALS}, through variantlib {installed}{drift}: drafts, "
            "the format may still change")


@dataclass(frozen=True)
class VariantSpec:
    """What a matrix variant's wheel variant declares."""

    variant: str
    label: str
    properties: tuple[str, ...]           # "namespace :: feature :: value", sorted
    provider: tuple[str, tuple[str, ...], str] | None

    @property
    def null(self) -> bool:
        return not self.properties


def spec_of(variant: Variant) -> VariantSpec:
    """The variant's label and properties, from its platform backend."""
    backend = get(variant.backend)
    properties = tuple(sorted(backend.variant_properties(variant)))
    label = variant.name.lower() if properties else NULL_LABEL
    if properties and (label == NULL_LABEL or not _LABEL.match(label)):
        raise UsageError(f"variant {variant.name!r} cannot be a variant label (lower-case "
                         "letters, digits, _ and . only, and not 'null'): rename it in "
                         "matrix.yaml")
    return VariantSpec(variant.name, label, properties, backend.variant_provider)


def _refusal(spec: VariantSpec) -> str | None:
    """Why ``spec`` cannot be a wheel variant (None: it can)."""
    if spec.null:
        return None
    namespaces = sorted({p.split("::", 1)[0].strip() for p in spec.properties})
    if spec.provider is None or [spec.provider[0]] != namespaces:
        return (f"variant {spec.variant}: no variant provider plugin is published for its "
                f"{', '.join(namespaces)} properties, so no installer could select it; build "
                "it without --variants (its per-variant index pages still serve it)")
    return None


def _variantlib_description(spec: VariantSpec, variants: tuple[Variant, ...]):
    """variantlib's VariantDescription of ``spec`` and the VariantInfo every wheel variant of
    the matrix (``variants``) shares: one provider per namespace, in the matrix's order (the
    format asks each variant.json for the package's providers, the null variant's too)."""
    # variantlib: wheel variants only (variants is on the startup path)
    from variantlib.api import VariantDescription, VariantProperty
    from variantlib.errors import ValidationError
    from variantlib.models.variant_info import ProviderInfo, VariantInfo

    refusal = _refusal(spec)
    if refusal:
        raise UsageError(refusal)
    providers: dict[str, ProviderInfo] = {}
    for other in (spec_of(v) for v in variants):
        if other.null or _refusal(other) or other.provider[0] in providers:
            continue
        namespace, requires, plugin_api = other.provider
        providers[namespace] = ProviderInfo(requires=list(requires), plugin_api=plugin_api)
    if not providers:
        raise UsageError(f"variant {spec.variant}: no variant of the matrix has properties a "
                         "provider plugin answers for (a CUDA variant, say), so a wheel "
                         "variant would add nothing: publish without --variants")
    try:
        info = VariantInfo(namespace_priorities=list(providers), providers=providers)
        if spec.null:
            return VariantDescription(), info
        properties = [VariantProperty.from_str(p) for p in spec.properties]
        return VariantDescription(properties=properties, label=spec.label), info
    except ValidationError as exc:
        raise UsageError(f"variant {spec.variant}: variantlib refuses its properties: {exc}") \
            from None


def _rewrite_version(metadata: str, version: str) -> str:
    head, sep, body = metadata.partition("\n\n")
    lines = [f"Version: {version}" if line.lower().startswith("version:") else line
             for line in head.split("\n")]
    return "\n".join(lines) + sep + body


def make_variant_wheels(wheel: Path, variant: Variant, out_dir: Path,
                        variants: tuple[Variant, ...]) -> list[Path]:
    """Write ``wheel``'s variant wheel (and, for the null variant, its plain public-version
    copy) into ``out_dir``; return their paths. ``variants``: the matrix's, whose providers
    every variant.json lists."""
    require_variantlib()
    # variantlib: wheel variants only, after require_variantlib
    from variantlib.api import make_variant_dist_info

    spec = spec_of(variant)
    vdesc, info = _variantlib_description(spec, variants)
    dist_info_text = make_variant_dist_info(vdesc, variant_info=info)
    try:
        name, version, build_tag, _tags = parse_wheel_filename(wheel.name)
    except InvalidWheelFilename as exc:
        raise UsageError(f"{wheel.name}: not a wheel file name ({exc})") from None
    public = version.public
    with zipfile.ZipFile(wheel) as archive:
        infos = [i for i in archive.infolist() if not i.filename.endswith("/")]
        tops = {i.filename.split("/", 1)[0] for i in infos}
        old_info = next((t for t in sorted(tops) if t.endswith(".dist-info")), None)
        if old_info is None:
            raise UsageError(f"{wheel.name}: no .dist-info directory: not a wheel")
        prefix = old_info[:-len(".dist-info")].rsplit("-", 1)[0]
        old_stem, new_stem = old_info[:-len(".dist-info")], f"{prefix}-{public}"
        contents: dict[str, bytes] = {}
        modes: dict[str, int] = {}
        for entry in infos:
            top, _, rest = entry.filename.partition("/")
            if top == old_info and rest in ("RECORD", "RECORD.jws", "RECORD.p7s",
                                            DIST_INFO_FILE):
                continue
            member = entry.filename
            if top in (old_info, f"{old_stem}.data"):
                member = f"{new_stem}{top[len(old_stem):]}/{rest}"
            contents[member] = archive.read(entry)
            modes[member] = entry.external_attr
    new_info = f"{new_stem}.dist-info"
    contents[f"{new_info}/METADATA"] = _rewrite_version(
        contents[f"{new_info}/METADATA"].decode("utf-8"), public).encode("utf-8")
    record_name = f"{new_info}/{RECORD_NAME}"
    if record_name not in contents:
        raise OpforgeError(f"{wheel.name}: no build record: give the wheel opforge build wrote")
    record = json.loads(contents[record_name])
    record["version"] = public
    record["wheel_variant"] = {"label": spec.label, "properties": list(spec.properties)}
    contents[record_name] = (json.dumps(record, indent=1) + "\n").encode()
    base = "-".join([wheel.name.split("-", 1)[0], public.replace("-", "_"),
                     *([f"{build_tag[0]}{build_tag[1]}"] if build_tag else []),
                     *wheel.name[:-4].split("-")[-3:]])
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {}
    if spec.null:  # the copy today's installers take: same bytes but no variant.json
        files[f"{base}.whl"] = dict(contents)
    contents[f"{new_info}/{DIST_INFO_FILE}"] = dist_info_text.encode("utf-8")
    files[f"{base}-{spec.label}.whl"] = contents
    return _replace_wheels(out_dir, files, modes, f"{new_info}/RECORD")


def _replace_wheels(out_dir: Path, files: dict[str, dict[str, bytes]], modes: dict[str, int],
                    record_name: str) -> list[Path]:
    """Write every wheel under a scratch folder, then rename them over the older wheels of
    ``out_dir`` (a build's variant wheels replace the last build's): nothing half written."""
    scratch = Path(tempfile.mkdtemp(prefix=".variants-", dir=out_dir))
    try:
        for name, contents in files.items():
            _write_wheel(scratch / name, contents, modes, record_name)
        for old in out_dir.glob("*.whl"):
            if old.name not in files:
                old.unlink()
        written = []
        for name in files:
            os.replace(scratch / name, out_dir / name)
            written.append(out_dir / name)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return sorted(written, key=lambda p: split_label(p.name)[1] is None)


def preflight(variant: Variant, variants: tuple[Variant, ...]) -> VariantSpec:
    """The spec ``--variants`` will write, checked before anything is built (exit 2 when
    variantlib is missing or refuses it, or when no provider plugin answers for it)."""
    require_variantlib()
    spec = spec_of(variant)
    _variantlib_description(spec, variants)
    return spec


def describe(spec: VariantSpec) -> str:
    """One line: the label and properties of a variant's wheel variant."""
    if spec.null:
        return f"wheel variant of {spec.variant}: the null variant (no properties), and a " \
               "plain copy for installers without variant support"
    return f"wheel variant of {spec.variant}: label {spec.label}, {', '.join(spec.properties)}"


@dataclass(frozen=True)
class WheelVariant:
    """What a wheel says of its variant: the label of its file name, its variant.json (read
    by variantlib), its build record's ``wheel_variant``, and what is wrong between them."""

    label: str | None                     # None: no label in the file name
    properties: tuple[str, ...]           # from variant.json; () for none or the null variant
    providers: dict[str, dict]
    record: dict | None                   # the build record
    faults: tuple[str, ...] = ()          # the file name and variant.json disagree

    @property
    def declared(self) -> dict | None:
        found = (self.record or {}).get("wheel_variant")
        return found if isinstance(found, dict) else None


def read_variant(path: Path) -> WheelVariant | None:
    """The variant a wheel declares; None for a wheel that is no variant wheel at all (no
    label, no variant.json, no ``wheel_variant`` in its build record). An unreadable wheel
    is a UsageError; a variant.json that contradicts the file name is a fault."""
    _, label = split_label(path.name)
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            found = [n for n in names if re.fullmatch(r"[^/]+\.dist-info/" +
                                                       re.escape(DIST_INFO_FILE), n)]
            for member in found + [n for n in names if n.endswith(f".dist-info/{RECORD_NAME}")]:
                if archive.getinfo(member).file_size > MAX_MEMBER:
                    raise UsageError(f"{path}: {member} is {archive.getinfo(member).file_size} "
                                     f"bytes, more than {MAX_MEMBER}")
            text = archive.read(found[0]) if len(found) == 1 else None
            records = [n for n in names if n.endswith(f".dist-info/{RECORD_NAME}")]
            record = json.loads(archive.read(records[0])) if records else None
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        raise UsageError(f"{path}: not a readable wheel ({exc})") from None
    record = record if isinstance(record, dict) else None
    if label is None and not found and not (record or {}).get("wheel_variant"):
        return None
    faults: list[str] = []
    properties: tuple[str, ...] = ()
    providers: dict[str, dict] = {}
    if len(found) > 1:
        faults.append(f"{len(found)} {DIST_INFO_FILE} files")
    elif label is None and found:
        faults.append(f"a {DIST_INFO_FILE} but no variant label in the file name: an "
                      "installer would take it for a plain wheel")
    elif label is not None and text is None:
        faults.append(f"the file name's variant label {label} but no .dist-info/"
                      f"{DIST_INFO_FILE}")
    elif text is not None:
        require_variantlib("reading a variant wheel")
        # variantlib: wheel variants only, after require_variantlib
        from variantlib.errors import ValidationError
        from variantlib.variant_dist_info import VariantDistInfo

        try:
            info = VariantDistInfo(text, label)
        except (ValidationError, ValueError) as exc:
            faults.append(f"{DIST_INFO_FILE} is not valid: {exc}")
        else:
            properties = tuple(sorted(p.to_str() for p in info.variant_desc.properties))
            providers = json.loads(info.to_str()).get("providers", {})
    return WheelVariant(label, properties, providers, record, tuple(faults))


def check_variant_wheel(path: Path, variant: Variant | None = None) -> list[str]:
    """How a wheel's variant contradicts its build record and (given) its matrix variant:
    empty for a consistent variant wheel, a consistent plain copy, or no variant wheel."""
    found = read_variant(path)
    if found is None:
        return []
    problems = list(found.faults)
    declared = found.declared
    if declared is None:
        problems.append("the build record names no wheel_variant: not written by "
                        "opforge build --variants")
        return problems
    recorded = tuple(sorted(declared.get("properties") or ()))
    if found.label is None:  # the plain copy of the null variant
        if declared.get("label") != NULL_LABEL:
            problems.append(f"the build record names variant label {declared.get('label')}, "
                            "the file name none (only the null variant has a plain copy)")
    else:
        if declared.get("label") != found.label:
            problems.append(f"label {found.label} in the file name, "
                            f"{declared.get('label')} in the build record")
        if recorded != found.properties and not found.faults:
            only_json = sorted(set(found.properties) - set(recorded))
            only_record = sorted(set(recorded) - set(found.properties))
            problems.append(f"{DIST_INFO_FILE} declares {', '.join(only_json) or 'nothing more'}"
                            f", the build record {', '.join(only_record) or 'nothing more'}")
    if variant is not None:
        spec = spec_of(variant)
        label = found.label or NULL_LABEL
        if spec.label != label or spec.properties != recorded:
            problems.append(f"variant {variant.name} maps to label {spec.label} with "
                            f"{', '.join(spec.properties) or 'no properties'}; the wheel is "
                            f"{label} with {', '.join(recorded) or 'none'}")
    return problems
