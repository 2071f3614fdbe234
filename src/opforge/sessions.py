"""Small helpers the CLI and the noxfiles share: the newest wheel of a variant, lint commands."""

from __future__ import annotations

from pathlib import Path

from opforge.errors import UsageError
from opforge.matrix import Matrix


def latest_wheel(matrix: Matrix, variant: str) -> Path:
    out_dir = matrix.dist_dir(variant)
    wheels = sorted(out_dir.glob("*.whl"), key=lambda p: p.stat().st_mtime)
    if not wheels:
        raise UsageError(f"no wheel in {out_dir}: run `opforge build --variant {variant}` "
                         f"(or `nox -s build_{variant}`) first, or pass --wheel PATH")
    return wheels[-1]


def lint_commands(root: Path) -> list[list[str]]:
    """The workflow checks, once .github/workflows exists."""
    workflows = sorted((root / ".github" / "workflows").glob("*.yml"))
    if not workflows:
        return []
    files = [str(p) for p in workflows]
    return [
        ["opforge", "workflows", "check", "--root", str(root)],
        ["actionlint", *files],
        ["check-jsonschema", "--builtin-schema", "vendor.github-workflows", *files],
    ]


