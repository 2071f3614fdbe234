"""opforge init writes every file or none, whichever file fails (issue 37 part 6): a folder it
cannot write, a write or a rename that fails midway: exit 2, one line naming the file and why,
and the tree exactly as it was (no new file, no folder init made, replaced files restored)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from opforge import init
from opforge.cli import main
from opforge.errors import UsageError

WORKFLOWS = ["opforge-ci.yml", "opforge-nightly.yml", "opforge-bisect.yml"]
TARGETS = ["ext/matrix.yaml", "ext/opforge_recipes.py", "ext/noxfile.py",
           *(f".github/workflows/{name}" for name in WORKFLOWS)]


@pytest.fixture(autouse=True)
def released_opforge(monkeypatch):
    from opforge import _release

    monkeypatch.setattr(_release, "WORKFLOWS_COMMIT", "f" * 40)


def _repo(base: Path, *, workflows: bool = True) -> Path:
    """A repository with a Python-defined extension in ext/ (and a workflow of the user's)."""
    (base / ".git").mkdir(parents=True)
    ext = base / "ext"
    (ext / "wops").mkdir(parents=True)
    (ext / "pyproject.toml").write_text('[project]\nname = "wops"\nversion = "0.1"\n')
    (ext / "wops" / "__init__.py").write_text(
        'import torch\n\n\n@torch.library.custom_op("wops::twice", mutates_args=())\n'
        "def twice(x: torch.Tensor) -> torch.Tensor:\n    return x * 2\n")
    if workflows:
        (base / ".github" / "workflows").mkdir(parents=True)
        (base / ".github" / "workflows" / "tests.yml").write_text("# the user's own\n")
    return base


def _tree(base: Path) -> dict[str, tuple]:
    """Every entry under ``base``: its kind, mode and bytes."""
    out = {}
    for path in sorted(base.rglob("*")):
        info = os.lstat(path)
        data = path.read_bytes() if stat.S_ISREG(info.st_mode) else None
        out[path.relative_to(base).as_posix()] = (stat.S_IFMT(info.st_mode),
                                                  stat.S_IMODE(info.st_mode), data)
    return out


def _unwritable(folder: Path):
    """Make ``folder`` refuse new files, as for the user (chmod), or for root (chattr +i,
    which binds root too); return the undo."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        return lambda: folder.chmod(0o755)
    if shutil.which("chattr") and subprocess.run(["chattr", "+i", str(folder)],
                                                 capture_output=True).returncode == 0:
        return lambda: subprocess.run(["chattr", "-i", str(folder)], check=True)
    pytest.skip("running as root where chattr +i is not allowed: the folder stays writable "
                "(test_a_write_failing_midway_undoes_every_write covers the undo)")


def test_a_read_only_workflows_folder_leaves_no_file_behind(tmp_path, capsys):
    repo = _repo(tmp_path / "repo")
    before = _tree(repo)
    undo = _unwritable(repo / ".github" / "workflows")
    try:
        assert main(["init", str(repo / "ext")]) == 2
    finally:
        undo()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"{repo / '.github' / 'workflows' / 'opforge-ci.yml'}: cannot write in its folder " \
        "(permission denied); nothing was written" in err
    assert _tree(repo) == before   # no matrix.yaml, no scratch file, the user's files as they were


def _fail_on(monkeypatch, target: str, reason: str = "disk full (planted)"):
    """Make init's write of ``target`` (a name under the tree) fail as a full disk would."""
    real = init.write_file

    def write_file(path, data, **kw):
        if Path(path).name.startswith(f".{Path(target).name}.opforge-init-"):
            raise UsageError(f"{path}: {reason}")
        return real(path, data, **kw)

    monkeypatch.setattr(init, "write_file", write_file)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("workflows", [True, False], ids=["workflows-folder", "no-github"])
def test_a_write_failing_midway_undoes_every_write(tmp_path, capsys, monkeypatch, target,
                                                   workflows):
    """Whichever file fails, the files written before it go, and so do the folders init made
    (.github/workflows where the repository had none)."""
    repo = _repo(tmp_path / "repo", workflows=workflows)
    before = _tree(repo)
    _fail_on(monkeypatch, target)
    assert main(["init", str(repo / "ext")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"{repo / target}: disk full (planted); nothing was written" in err
    assert _tree(repo) == before


def test_a_failed_rename_puts_back_the_files_force_replaced(tmp_path, capsys, monkeypatch):
    repo = _repo(tmp_path / "repo")
    noxfile = repo / "ext" / "noxfile.py"
    noxfile.write_text("# the user's noxfile\n")
    noxfile.chmod(0o640)
    before = _tree(repo)
    real = os.replace

    def replace(src, dst, **kw):  # the last rename fails, after the noxfile was replaced
        if isinstance(dst, Path) and dst.name == "opforge-bisect.yml":
            raise OSError(28, "No space left on device")
        return real(src, dst, **kw)

    with monkeypatch.context() as patched:
        patched.setattr(init.os, "replace", replace)
        assert main(["init", str(repo / "ext"), "--force"]) == 2
    err = capsys.readouterr().err
    assert f"{repo / '.github/workflows/opforge-bisect.yml'}: No space left on device; " \
        "nothing was written" in err
    assert _tree(repo) == before   # the noxfile's bytes and mode are back
    # and the same run with nothing failing writes all of them
    assert main(["init", str(repo / "ext"), "--force"]) == 0
    assert all((repo / t).is_file() for t in TARGETS)
    assert "opforge.nox" in noxfile.read_text() and stat.S_IMODE(noxfile.stat().st_mode) == 0o640
    leftovers = [p.name for p in repo.rglob("*opforge-init*")]
    assert leftovers == []
