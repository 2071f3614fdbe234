"""A variant's wheels on disk: the newest one in ``dist/<variant>``, and which variant a wheel
is (its build record first, then its local version label).

The one answer ``opforge smoke`` (and anything else that needs to know) uses; ``--variant``
overrides it. The matrix's own rules (``Matrix.dist_dir``, ``Matrix.identify``) are pure; this
module reads the disk.
"""

from __future__ import annotations

import json
import re
import zipfile
from pathlib import Path

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from opforge.errors import UsageError
from opforge.files import open_regular
from opforge.matrix.model import Matrix, Variant
from opforge.stamp import RECORD_NAME

_RECORD_LIMIT = 1 << 20  # a build record is a few hundred bytes: never read a large member


def latest_wheel(matrix: Matrix, variant: str) -> Path:
    """The newest wheel ``opforge build`` left in the variant's ``dist/<variant>``."""
    out_dir = matrix.dist_dir(variant)
    wheels = sorted(out_dir.glob("*.whl"), key=lambda p: p.stat().st_mtime)
    if not wheels:
        raise UsageError(f"no wheel in {out_dir}: run `opforge build --variant {variant}` "
                         f"(or `nox -s build_{variant}`) first, or pass --wheel PATH")
    return wheels[-1]


def wheel_label(wheel: Path) -> str | None:
    """The local version label of a wheel's file name (``cu130`` of ``x-1.0+cu130-...``)."""
    try:
        _name, version, _build, _tags = parse_wheel_filename(Path(wheel).name)
    except InvalidWheelFilename:
        return None
    return version.local


def wheel_record(wheel: Path) -> dict | None:
    """The build record opforge stamped into the wheel, or None (none, or not readable: the
    install then says what is wrong with the file)."""
    pattern = re.compile(r"[^/]+\.dist-info/" + re.escape(RECORD_NAME) + r"\Z")
    try:
        with open_regular(wheel) as fh, zipfile.ZipFile(fh) as archive:
            infos = [i for i in archive.infolist() if pattern.match(i.filename)]
            if len(infos) != 1 or infos[0].file_size > _RECORD_LIMIT:
                return None
            record = json.loads(archive.read(infos[0]))
    except (UsageError, OSError, zipfile.BadZipFile, ValueError, RuntimeError, EOFError):
        return None
    return record if isinstance(record, dict) else None


def identify_record(matrix: Matrix, record: dict | None, distribution: str | None,
                    label: str | None = None) -> tuple[Variant, str] | None:
    """The variant and where it came from (``<distribution> build record``, ``local version
    +cpu``) for a build record and/or a local label, or None."""
    record_variant = (record or {}).get("variant")
    found = matrix.identify(record_variant if isinstance(record_variant, str) else None, label)
    if found is None:
        return None
    variant, how = found
    if how == "build record":
        return variant, f"{distribution or 'the package'} build record"
    return variant, f"local version +{label}"


def identify_wheel(matrix: Matrix, wheel: Path) -> tuple[Variant, str] | None:
    """Which of ``matrix``'s variants the wheel file is, and how that is known."""
    try:
        distribution = str(canonicalize_name(parse_wheel_filename(Path(wheel).name)[0]))
    except InvalidWheelFilename:
        distribution = None
    return identify_record(matrix, wheel_record(wheel), distribution, wheel_label(wheel))
