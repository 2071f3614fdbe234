"""What noxfile.py needs beyond calling opforge: argument parsing, docstrings, lint commands."""

from __future__ import annotations

import argparse
from pathlib import Path

from opforge.errors import UsageError
from opforge.matrix import Matrix, Variant


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message}")


def parse_build_args(posargs: list[str]) -> argparse.Namespace:
    """``nox -s build_<variant> -- [--dry-run] [--out DIR] [--torch-index URL] [--omit-kernels K]``."""
    parser = _Parser(prog="nox -s build_<variant> --")
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--torch-index")
    parser.add_argument("--omit-kernels")
    return parser.parse_args(posargs)


def build_doc(matrix: Matrix, variant: Variant) -> str:
    what = (f"CUDA {variant.cuda} ({variant.arch_list})" if variant.cuda
            else "MPS (Metal)" if variant.mps else "CPU")
    return (f"Build the {variant.name} wheel: {what} kernels, torch "
            f"{variant.torch_version or matrix.torch.version}, for "
            f"{', '.join(variant.platforms)} (-- --dry-run shows the plan).")


def latest_wheel(matrix: Matrix, variant: str) -> Path:
    out_dir = matrix.path.parent / "dist" / variant
    wheels = sorted(out_dir.glob("*.whl"), key=lambda p: p.stat().st_mtime)
    if not wheels:
        raise UsageError(f"no wheel in {out_dir}: run `nox -s build_{variant}` first, "
                         "or pass -- --wheel PATH")
    return wheels[-1]


def lint_commands(root: Path) -> list[list[str]]:
    """The workflow checks, once .github/workflows exists."""
    workflows = sorted((root / ".github" / "workflows").glob("*.yml"))
    if not workflows:
        return []
    files = [str(p) for p in workflows]
    return [
        ["python", "-m", "opforge.workflows"],
        ["actionlint", *files],
        ["check-jsonschema", "--builtin-schema", "vendor.github-workflows", *files],
    ]


def smoke_args(matrix: Matrix, posargs: list[str], default_variant: str) -> list[str]:
    """``nox -s smoke -- [--variant V] [...]``: without a target, take dist/<V>'s newest wheel."""
    args = list(posargs)
    if any(a in args or any(p.startswith(a + "=") for p in args)
           for a in ("--wheel", "--requirement", "--python")):
        return args
    variant = default_variant
    for i, arg in enumerate(args):
        if arg == "--variant" and i + 1 < len(args):
            variant = args[i + 1]
        elif arg.startswith("--variant="):
            variant = arg.split("=", 1)[1]
    if "--variant" not in args and not any(a.startswith("--variant=") for a in args):
        args = ["--variant", variant, *args]
    return ["--wheel", str(latest_wheel(matrix, variant)), *args]
