"""Fresh virtual environments and pip inside them (real envs, the way a user makes one)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from opforge.errors import OpforgeError


def venv_python(env_dir: Path) -> Path:
    bindir = "Scripts" if os.name == "nt" else "bin"
    exe = "python.exe" if os.name == "nt" else "python"
    return Path(env_dir) / bindir / exe


def create_venv(env_dir: Path, python: str | None = None) -> Path:
    """Create a virtual environment with pip at ``env_dir``; return its interpreter."""
    env_dir = Path(env_dir)
    base = python or sys.executable
    try:
        import virtualenv  # noqa: F401

        cmd = [sys.executable, "-m", "virtualenv", "-q", "--python", base,
               "--no-setuptools", "--no-wheel", "--no-periodic-update", str(env_dir)]
    except ImportError:
        cmd = [base, "-m", "venv", str(env_dir)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-1:]
        raise OpforgeError(f"could not create a virtual environment at {env_dir}: {' '.join(tail)}")
    return venv_python(env_dir)


def pip(python: Path | str, *args: str, capture: bool = True, env: dict | None = None
        ) -> subprocess.CompletedProcess:
    """Run ``python -m pip ARGS``; raise OpforgeError with pip's last lines on failure."""
    cmd = [str(python), "-m", "pip", "--disable-pip-version-check", "--no-input", *args]
    result = subprocess.run(cmd, capture_output=capture, text=True, env=env)
    if result.returncode != 0:
        out = ((result.stderr or "") + (result.stdout or "")).strip().splitlines()
        errors = [line for line in out if "ERROR" in line] or out[-3:]
        raise OpforgeError(f"pip {' '.join(args[:1])} failed: {' | '.join(errors[-3:])}")
    return result
