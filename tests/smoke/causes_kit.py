"""Shared by the test_causes modules: build the planted corpus once, run smoke, read causes."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from causes_corpus import OPS_H, SOURCES, write_project
from smoke_wheelkit import REPO

from opforge.cli import main


def corpus_wheel() -> Path:
    """The planted C++ project's wheel, built with pip and the real compiler (through sccache).

    Kept under build/causes-corpus/<hash of the sources and torch>: a rerun with the same
    sources and torch reuses the wheel; any change builds it again.
    """
    import torch

    key = hashlib.sha256(json.dumps([OPS_H, SOURCES, torch.__version__, sys.version],
                                    sort_keys=True).encode()).hexdigest()[:16]
    home = REPO / "build" / "causes-corpus" / key
    wheels = sorted(home.glob("dist/*.whl"))
    if wheels:
        return wheels[0]
    from opforge.compiler_cache import CompilerCache

    project = write_project(home / "project")
    cache = CompilerCache.start(python=sys.executable, work_dir=home / "work", base_dirs=[project],
                                path=os.environ.get("PATH", ""), nvcc=None, log=lambda *a: None)
    env = {**os.environ, **(cache.env if cache else {}), "MAX_JOBS": os.environ.get("MAX_JOBS", "2")}
    try:
        built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation",
                                "--no-deps", "-q", "-w", str(home / "partial"), str(project)],
                               env=env, capture_output=True, text=True, timeout=1500)
    finally:
        if cache:
            cache.stop()
    assert built.returncode == 0, built.stderr[-4000:]
    (home / "partial").rename(home / "dist")  # whole or not at all
    return sorted(home.glob("dist/*.whl"))[0]


def smoke(capsys, python: Path, package: str, *argv: str, json_path: Path,
          namespace: str | None = None) -> tuple[int, dict, str]:
    rc = main(["smoke", "--python", str(python), "--package", package,
               "--namespace", namespace or package, *argv, "--json", str(json_path)])
    out = capsys.readouterr()
    return rc, json.loads(json_path.read_text()), out.out + out.err


def causes(doc: dict, cls: str | None = None) -> list[dict]:
    return [c for c in doc.get("causes", []) if cls is None or c["class"] == cls]


def the_cause(doc: dict, cls: str) -> dict:
    found = causes(doc, cls)
    assert len(found) == 1, f"{cls}: {[c['class'] + ': ' + c['title'] for c in causes(doc)]}"
    return found[0]


def first_lines(out: str, n: int = 5) -> list[str]:
    """The report's first ``n`` lines after the header (command line, torch, build, devices)."""
    lines = [line for line in out.splitlines() if line.strip()]
    start = next(i for i, line in enumerate(lines) if line.startswith(("FAIL", "WARN")))
    return lines[start:start + n]
