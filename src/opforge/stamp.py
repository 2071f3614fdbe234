"""The wheel contract: after the project's own PEP 517 build, opforge stamps the wheel.

Whatever built the wheel (setuptools, scikit-build-core, meson-python), ``stamp_wheel``
rewrites it so that it says what it is:

- the local version names the variant (``1.2.0`` -> ``1.2.0+cu130``), in METADATA, in the
  ``.dist-info`` / ``.data`` directory names and in the file name;
- ``Requires-Dist`` pins the torch it was built against (``torch==2.14.1``), or for a
  stable-ABI variant requires its floor (``torch>=2.10``), replacing any torch requirement
  the project wrote; a stable-ABI wheel must come out of the build tagged abi3;
- a build record, ``<name>-<version>.dist-info/opforge-build.json``, says how it was built
  (variant, torch version and commit, CUDA version and arch list, MPS, the compiled libraries
  and the backends found in them); any installed copy reads it with
  ``importlib.metadata.distribution(name).read_text("opforge-build.json")``, without importing
  the package;
- RECORD lists every file with its new hash, so pip and auditwheel accept the result.

Backends are found in the compiled code itself (CUDA fat binaries and registration symbols,
Metal), never from the project's file names: a CUDA variant whose libraries hold no device
code is refused with a message naming what the build should read.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import Version

from opforge import __version__, platforms
from opforge.errors import OpforgeError

RECORD_NAME = "opforge-build.json"
RECORD_SCHEMA = 1
LIBRARY_SUFFIXES = (".so", ".dylib", ".pyd")


@dataclass(frozen=True)
class BuildFacts:
    """What the build ran with, as the build environment reports it."""

    variant: str
    torch_version: str
    torch_git_version: str | None = None
    torch_cuda_version: str | None = None
    python: str | None = None
    cuda_version: str | None = None          # the variant's toolkit (nvcc), None for non-CUDA
    cuda_arch_list: str | None = None
    mps: bool = False
    macos_deployment_target: str | None = None
    source_commit: str | None = None
    torch_requirement: str | None = None     # default: torch==<public torch version>
    local_version: str | None = None         # default: the variant's name; "": none (PyPI)
    extra: dict = field(default_factory=dict)

    @property
    def requirement(self) -> str:
        return self.torch_requirement or f"torch=={Version(self.torch_version).public}"


def library_backends(data: bytes) -> list[str]:
    """The backends a compiled library's bytes hold code for: cpu, plus the device code of each
    platform backend whose markers it carries (cuda, hip, mps, xpu), in that order."""
    found = {backend.device_code for backend in platforms.backends()
             if backend.device_code and any(m in data for m in backend.code_markers)}
    return ["cpu", *sorted(found)]


def _is_library(member: str) -> bool:
    base = member.rsplit("/", 1)[-1]
    return base.endswith(LIBRARY_SUFFIXES) or ".so." in base


def _hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + digest.decode("ascii")


def _rewrite_metadata(text: str, version: str, torch_req: str) -> str:
    """METADATA with ``Version`` replaced and every unconditional torch requirement pinned."""
    head, sep, body = text.partition("\n\n")
    lines: list[str] = []
    for line in head.splitlines():
        if line[:1] in (" ", "\t") and lines:  # a folded header continues the previous one
            lines[-1] += "\n" + line
        else:
            lines.append(line)
    out, pinned = [], False
    for line in lines:
        name, _, value = line.partition(":")
        key = name.strip().lower()
        if key == "version":
            out.append(f"Version: {version}")
            continue
        if key == "requires-dist":
            try:
                req = Requirement(value.strip())
            except InvalidRequirement:
                req = None
            if req is not None and req.name.lower() == "torch" and \
                    (req.marker is None or "extra" not in str(req.marker)):
                if not pinned:
                    marker = f"; {req.marker}" if req.marker else ""
                    out.append(f"Requires-Dist: {torch_req}{marker}")
                    pinned = True
                continue
        out.append(line)
    if not pinned:
        out.append(f"Requires-Dist: {torch_req}")
    return "\n".join(out) + "\n" + (sep[1:] + body if sep else "")


@dataclass(frozen=True)
class StampResult:
    wheel: Path
    record: dict


def stamp_wheel(wheel: Path, out_dir: Path, facts: BuildFacts, *,
                build_env: dict[str, str] | None = None, backend=None) -> StampResult:
    """Write the stamped copy of ``wheel`` into ``out_dir``; return its path and build record.
    ``backend``: the variant's platform backend, whose device code the wheel must hold."""
    try:
        name, version, build_tag, _tags = parse_wheel_filename(wheel.name)
    except InvalidWheelFilename as exc:
        raise OpforgeError(f"{wheel.name}: the build produced no valid wheel name ({exc})") from None
    # "" (the PyPI variant): no local label, which PyPI refuses; the build record keeps the variant
    label = facts.variant if facts.local_version is None else facts.local_version
    new_version = f"{version.public}+{label}" if label else version.public
    old_info, new_info, contents, modes, libraries = _members(wheel, new_version)
    metadata_name = f"{new_info}/METADATA"
    if metadata_name not in contents:
        raise OpforgeError(f"{wheel.name}: {old_info}/METADATA is missing: not a valid wheel")
    contents[metadata_name] = _rewrite_metadata(
        contents[metadata_name].decode("utf-8"), new_version, facts.requirement).encode("utf-8")
    backends = sorted({b for lib in libraries for b in lib["backends"]},
                      key=lambda b: (b != "cpu", b))
    expected = backend.device_code if backend is not None else None
    _refuse_missing_device_code(wheel, libraries, backends, expected, backend,
                                build_env or {})
    record = _record(str(name), new_version, facts, libraries, backends)
    contents[f"{new_info}/{RECORD_NAME}"] = (json.dumps(record, indent=1) + "\n").encode()
    tags = wheel.name[:-len(".whl")].split("-")[-3:]
    _check_stable_tag(wheel, facts, tags)
    escaped = wheel.name.split("-", 1)[0]
    parts = [escaped, new_version.replace("-", "_")]
    if build_tag:
        parts.append(f"{build_tag[0]}{build_tag[1]}")
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / ("-".join(parts + tags) + ".whl")
    _write_wheel(target, contents, modes, f"{new_info}/RECORD")
    return StampResult(wheel=target, record=record)


def _members(wheel: Path, new_version: str) -> tuple[str, str, dict[str, bytes],
                                                    dict[str, int], list[dict]]:
    """The wheel's members renamed for ``new_version`` (its dist-info and data folders), their
    modes, and its libraries with the backends their code is for; the old RECORD and build
    record are left out (the stamp writes new ones)."""
    with zipfile.ZipFile(wheel) as archive:
        infos = archive.infolist()
        names = [i.filename for i in infos]
        dist_infos = sorted({n.split("/", 1)[0] for n in names
                             if n.split("/", 1)[0].endswith(".dist-info")})
        if len(dist_infos) != 1:
            raise OpforgeError(f"{wheel.name}: expected one .dist-info directory, found "
                               f"{len(dist_infos)}")
        old_info = dist_infos[0]
        prefix = old_info[: -len(".dist-info")].rsplit("-", 1)[0]
        new_info = f"{prefix}-{new_version}.dist-info"
        old_data, new_data = f"{old_info[:-len('.dist-info')]}.data", f"{prefix}-{new_version}.data"
        contents: dict[str, bytes] = {}
        modes: dict[str, int] = {}
        libraries = []
        for info in infos:
            member = info.filename
            if member.endswith("/"):
                continue
            top, _, rest = member.partition("/")
            if top == old_info:
                if rest in ("RECORD", "RECORD.jws", "RECORD.p7s", RECORD_NAME):
                    continue
                member = f"{new_info}/{rest}"
            elif top == old_data:
                member = f"{new_data}/{rest}"
            data = archive.read(info)
            contents[member] = data
            modes[member] = info.external_attr
            if _is_library(member):
                libraries.append({"path": member, "size": len(data),
                                  "backends": library_backends(data)})
    return old_info, new_info, contents, modes, libraries


def _record(name: str, new_version: str, facts: BuildFacts, libraries: list[dict],
            backends: list[str]) -> dict:
    """The build record the stamped wheel carries (opforge-build.json)."""
    return {
        "schema": RECORD_SCHEMA,
        "stamped_by": _stamped_by(),
        "distribution": name,
        "version": new_version,
        "variant": facts.variant,
        "torch_version": facts.torch_version,
        "torch_git_version": facts.torch_git_version,
        "torch_cuda_version": facts.torch_cuda_version,
        "torch_requirement": facts.requirement,
        "python": facts.python,
        "cuda_version": facts.cuda_version,
        "cuda_arch_list": facts.cuda_arch_list,
        "mps": facts.mps,
        "macos_deployment_target": facts.macos_deployment_target,
        "source_commit": facts.source_commit,
        "libraries": libraries,
        "backends": backends,
        **facts.extra,
    }


def _check_stable_tag(wheel: Path, facts: BuildFacts, tags: list[str]) -> None:
    """A stable-ABI variant's wheel must be tagged abi3: else the build ignored the ABI."""
    if facts.extra.get("abi") == "stable" and "abi3" not in tags[1].split("."):
        raise OpforgeError(
            f"{wheel.name}: this stable-ABI variant's build produced a wheel tagged "
            f"{tags[0]}-{tags[1]}, not abi3. opforge passed OPFORGE_ABI=stable and "
            f"OPFORGE_TORCH_FLOOR={facts.extra.get('torch_floor')}: the build should define "
            "Py_LIMITED_API, TORCH_STABLE_ONLY and TORCH_TARGET_VERSION and tag the wheel "
            "(setuptools: py_limited_api=True on the extension and bdist_wheel's "
            "py_limited_api=cp310; scikit-build-core: wheel.py-api = \"cp310\").")


def _refuse_missing_device_code(wheel: Path, libraries: list[dict], backends: list[str],
                                expected: str | None, backend, build_env: dict[str, str]) -> None:
    shown = ("FORCE_CUDA", "FORCE_MPS", "TORCH_CUDA_ARCH_LIST", "CUDA_HOME",
             "MACOSX_DEPLOYMENT_TARGET", "OPFORGE_BACKEND",
             *(backend.variables if backend is not None else ()))
    passed = ", ".join(f"{k}={v}" for k, v in sorted(build_env.items()) if k in shown)
    libs = ", ".join(lib["path"] for lib in libraries) or "no compiled library at all"
    if expected is None or expected in backends:
        return
    if expected == "cuda":
        raise OpforgeError(
            f"{wheel.name}: this CUDA variant's build produced no device code (libraries: "
            f"{libs}; no CUDA fat binary in any of them). The build guessed CPU-only, probably "
            "from the build host (no GPU here). opforge passed " + passed + ": the build "
            "should compile its CUDA sources (CUDAExtension / CMake's CUDA language) when "
            "FORCE_CUDA=1, for the architectures in TORCH_CUDA_ARCH_LIST, instead of asking "
            "torch.cuda.is_available().")
    if expected == "mps":
        raise OpforgeError(
            f"{wheel.name}: this MPS variant's build produced no Metal code (libraries: {libs}). "
            f"opforge passed {passed}: the build should compile its .mm/.metal sources and link "
            "the Metal framework when FORCE_MPS=1, instead of guessing from the build host.")
    title = backend.title if backend is not None else expected
    raise OpforgeError(
        f"{wheel.name}: this {title} variant's build produced no {expected} device code "
        f"(libraries: {libs}). opforge passed {passed}: the build should compile its {title} "
        "sources from what opforge passes, instead of guessing from the build host.")


def _stamped_by() -> str:
    return f"opforge {__version__}"


def _write_wheel(target: Path, contents: dict[str, bytes], modes: dict[str, int],
                 record_name: str) -> None:
    """Write the files (dist-info last, RECORD last of all) with a fresh RECORD."""
    order = sorted(contents, key=lambda n: (".dist-info/" in n, n))
    rows = [(n, _hash(contents[n]), str(len(contents[n]))) for n in order]
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerows(rows)
    writer.writerow((record_name, "", ""))
    partial = target.with_name(f".{target.name}.partial")
    with zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_DEFLATED) as out:
        for n in order:
            out.writestr(_zinfo(n, modes.get(n)), contents[n])
        out.writestr(_zinfo(record_name, None), buffer.getvalue().encode())
    partial.replace(target)


def _zinfo(name: str, mode: int | None) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = mode if mode else 0o644 << 16  # keep the build's modes (scripts: +x)
    return info


def read_record(archive: zipfile.ZipFile) -> dict | None:
    """The build record of a wheel (None when the wheel was not stamped)."""
    for member in archive.namelist():
        if re.match(r"^[^/]+\.dist-info/" + re.escape(RECORD_NAME) + "$", member):
            try:
                return json.loads(archive.read(member))
            except ValueError:
                return {"error": f"{member} is not valid JSON"}
    return None
