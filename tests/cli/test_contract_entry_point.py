"""A sample of the contract cases through the real console script, in a new process.

The generative tests run ``opforge.cli.main`` in-process for speed; these prove the installed
entry point behaves the same: exit code, one line, no traceback, within the bound.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from contract import TIME_BOUND_S, make_path

ROOT = Path(__file__).resolve().parents[2]


def _entry_point() -> list[str]:
    script = Path(sys.executable).with_name("opforge")
    if script.exists():
        return [str(script)]
    found = shutil.which("opforge")
    return [found] if found else [sys.executable, "-m", "opforge"]


CASES = [
    ("matrix", lambda t: ["matrix", "--file", str(make_path("fifo", t))], 2),
    ("matrix", lambda t: ["matrix", "--file", str(_write(t, "m.yaml", b"a: !!python/name:os.system x\n"))], 2),
    ("matrix", lambda t: ["matrix", "--file", str(_write(t, "m.yaml", b"\xff\xfe\x00"))], 2),
    ("build", lambda t: ["build", "--variant", "cpu\n", "--dry-run", "--file", str(ROOT / "matrix.yaml")], 2),
    ("inspect", lambda t: ["inspect", str(_write(t, "d-1.0-py3-none-any.whl", b"PK\x03\x04junk"))], 2),
    ("inspect", lambda t: ["inspect", str(make_path("directory", t, "d-1.0-py3-none-any.whl"))], 2),
    ("smoke", lambda t: ["smoke", "--python", str(make_path("directory", t)), "--package", "p",
                         "--namespace", "n"], 2),
    ("smoke", lambda t: ["smoke", "--python", sys.executable, "--package", "p", "--namespace",
                         "n", "--junit", str(make_path("under-a-file", t))], 2),
    ("bisect", lambda t: ["bisect", "--timeout", "nan", "--", "true"], 2),
    ("bisect", lambda t: ["bisect", "--state", str(_write(t, "s.json", b"[1, 2]")), "--resume"], 2),
    ("bisect", lambda t: ["bisect", "--good", "2024-06-09", "--bad", "2024-06-01", "--", "x"], 2),
]


def _write(folder: Path, name: str, data: bytes) -> Path:
    path = folder / name
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("command, make_argv, code", CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_real_entry_point(tmp_path, command, make_argv, code):
    argv = make_argv(tmp_path)
    env = {**os.environ, "OPFORGE_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("GITHUB_OUTPUT", None)
    env.pop("GITHUB_STEP_SUMMARY", None)
    run = subprocess.run([*_entry_point(), *argv], capture_output=True, text=True, env=env,
                         timeout=TIME_BOUND_S * 3, cwd=tmp_path)
    assert run.returncode == code, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"opforge {command}: error: "), run.stderr
    assert "Traceback" not in run.stderr + run.stdout
