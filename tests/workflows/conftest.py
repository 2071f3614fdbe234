"""Fixtures for the workflow checks: a throw-away copy of the repository's CI inputs to break."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from opforge.cli.commands import check_workflows
from opforge.workflows import project as project_module

ROOT = Path(__file__).resolve().parents[2]


class RepoCopy:
    """matrix.yaml, noxfile.py, pyproject.toml and .github/workflows copied into tmp (src linked)."""

    def __init__(self, root: Path):
        self.root = root

    def path(self, rel: str) -> Path:
        return self.root / rel

    def replace(self, rel: str, old: str, new: str, count: int = 1) -> None:
        """Replace ``old`` (which must be there, so a test cannot pass vacuously) by ``new``."""
        path = self.path(rel)
        text = path.read_text()
        assert old in text, f"{old!r} is not in {rel}: update the test with the workflow"
        path.write_text(text.replace(old, new, count if count > 0 else -1))

    def problems(self) -> list[str]:
        return check_workflows(self.root)


@pytest.fixture(scope="session")
def listed_sessions() -> tuple:
    """The real noxfile's sessions, listed once (``nox --list`` takes about a second)."""
    return project_module.nox_sessions(ROOT)


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, listed_sessions: tuple) -> RepoCopy:
    root = tmp_path / "repo"
    root.mkdir()
    for name in ("matrix.yaml", "noxfile.py", "pyproject.toml"):
        shutil.copy(ROOT / name, root / name)
    shutil.copytree(ROOT / ".github", root / ".github")
    (root / "src").symlink_to(ROOT / "src")
    real = project_module.nox_sessions

    def sessions(path: Path):
        # the noxfile makes its sessions from matrix.yaml: while a test has edited neither,
        # the listing of the real ones holds
        same = all((Path(path) / name).read_text() == (ROOT / name).read_text()
                   for name in ("noxfile.py", "matrix.yaml"))
        return listed_sessions if same else real(path)

    monkeypatch.setattr(project_module, "nox_sessions", sessions)
    return RepoCopy(root)
