"""What the adoption tests share: the opforge CLI as a user types it, and a kept build env."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import opforge

ROOT = Path(__file__).resolve().parents[2]
SRC = str(Path(opforge.__file__).resolve().parent.parent)


def opforge_cli(*args: str, cwd: Path, timeout: float = 1200, env: dict | None = None):
    """``python -m opforge ARGS`` in a subprocess, with this checkout's opforge and PyPI's torch."""
    full = {**os.environ, "PYTHONPATH": SRC, "OPFORGE_TORCH_INDEX": "pypi",
            "MAX_JOBS": os.environ.get("MAX_JOBS", "2"), **(env or {})}
    full.pop("OPFORGE_MATRIX", None)
    full.pop("GITHUB_STEP_SUMMARY", None)
    return subprocess.run([sys.executable, "-m", "opforge", *args], cwd=cwd, env=full,
                          capture_output=True, text=True, timeout=timeout)


def ok(result, what: str):
    assert result.returncode == 0, f"{what} exited {result.returncode}:\n{result.stdout[-3000:]}" \
                                   f"\n{result.stderr[-5000:]}"
    return result


def build_env(name: str) -> str:
    """The python of a virtual environment under build/<name>/env, made once and kept (opforge
    build installs the build's torch and tools into it)."""
    env_dir = ROOT / "build" / name / "env"
    python = env_dir / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "virtualenv", "-q", str(env_dir)], check=True)
    return str(python)
