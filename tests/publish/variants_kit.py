"""A matrix with CPU and CUDA variants and their wheels, stamped as opforge build stamps them
(the CUDA one without compiling: a pure wheel stamped for cu130), for the wheel-variants tests."""

from __future__ import annotations

import zipfile
from pathlib import Path

from projectkit import matrix_yaml, variant_entry
from publish_wheelkit import make_wheel

from opforge import variants
from opforge.matrix import load_matrix
from opforge.stamp import BuildFacts, _write_wheel, stamp_wheel

NAME = "boxops"

CPU = variant_entry("cpu", ("CPU", "Meta"))
CU130 = variant_entry("cu130", ("CPU", "CUDA", "Meta"), cuda="13.0",
                      arch_list="9.0;12.0+PTX")
CU126 = {**CU130, "name": "cu126", "cuda": "12.6", "arch_list": "9.0;8.0"}
ROCM = variant_entry("rocm64", ("CPU", "CUDA", "Meta"), backend="rocm", toolkit="6.4",
                     arch_list="gfx942")


def write_matrix(folder: Path, *entries: dict) -> Path:
    """``folder/matrix.yaml``: boxops with these variants (projectkit.variant_entry dicts;
    CPU and CU130 when none are given)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "matrix.yaml"
    path.write_text(matrix_yaml(NAME, ["nms"], distribution=NAME, recipes=None, index=None,
                                pr_python="3.11", variants=list(entries or (CPU, CU130))))
    return path


FACTS = {
    "cpu": dict(torch_version="2.13.0+cpu"),
    "cu130": dict(torch_version="2.14.1+cu130", cuda_version="13.0",
                  cuda_arch_list="9.0;12.0+PTX"),
    "cu126": dict(torch_version="2.14.1+cu126", cuda_version="12.6", cuda_arch_list="8.0"),
}


def stamped(tmp: Path, variant: str, version: str = "1.0", *, tag: str = "py3-none-any",
            payload: str = "") -> Path:
    """``dist/<variant>/boxops-<version>+<variant>-<tag>.whl`` as opforge build stamps it."""
    raw = make_wheel(tmp / "raw" / variant / version, NAME, version, tag=tag,
                     payload=payload or f"BUILD = {variant!r}\n")
    return stamp_wheel(raw, tmp / "dist" / variant,
                       BuildFacts(variant=variant, **FACTS[variant])).wheel


def variant_wheels(tmp: Path, matrix_path: Path, variant: str, version: str = "1.0",
                   **kw) -> list[Path]:
    """The stamped wheel's wheel variants, in ``dist/<variant>/variants/``."""
    matrix = load_matrix(matrix_path)
    wheel = stamped(tmp, variant, version, **kw)
    return variants.make_variant_wheels(wheel, matrix.variant(variant),
                                        wheel.parent / variants.SUBDIR, matrix.variants)


def rewrite_member(wheel: Path, suffix: str, edit) -> None:
    """Change one member of ``wheel`` (the one whose name ends in ``suffix``) in place, with a
    fresh RECORD: a tampered wheel that is still a valid zip."""
    with zipfile.ZipFile(wheel) as archive:
        contents = {i.filename: archive.read(i) for i in archive.infolist()
                    if not i.filename.endswith("/RECORD")}
        record = next(n for n in archive.namelist() if n.endswith(".dist-info/RECORD"))
    member = next(n for n in contents if n.endswith(suffix))
    contents[member] = edit(contents[member])
    _write_wheel(wheel, contents, {}, record)
