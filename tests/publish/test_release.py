"""opforge's own release: the tag is the version, the local steps (stamp, build, twine check,
install in a fresh environment, run the CLI), and init's refusal to pin an unreleased commit."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from opforge import __version__, _release, init
from opforge.cli import main
from opforge.errors import OpforgeError, UsageError
from opforge.init import callers
from opforge.release import release, stamp, version_from_tag

ROOT = Path(__file__).resolve().parents[2]
COMMIT = "ab" * 20


@pytest.mark.parametrize("tag, version", [("v0.2.0", "0.2.0"), ("v1.0.0rc1", "1.0.0rc1"),
                                          ("v2.3.4.post1", "2.3.4.post1")])
def test_the_tag_is_the_version(tag, version):
    assert version_from_tag(tag) == version


@pytest.mark.parametrize("tag", ["0.2.0", "v0.2.0+cpu", "vbanana", "v0.02.0", "release-1"])
def test_a_tag_that_is_not_a_public_version_is_refused(tag):
    with pytest.raises(UsageError):
        version_from_tag(tag)


def _tree(tmp_path: Path, default: str = f"opforge=={__version__}") -> Path:
    """A copy of what opforge's distribution is built from."""
    root = tmp_path / "opforge"
    shutil.copytree(ROOT / "src" / "opforge", root / "src" / "opforge",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, root / name)
    workflows = root / ".github" / "workflows"
    workflows.mkdir(parents=True)
    for path in (ROOT / ".github" / "workflows").glob("reusable-*.yml"):
        text = path.read_text().replace(f"default: opforge=={__version__}", f"default: {default}")
        (workflows / path.name).write_text(text)
    return root


def test_stamp_writes_the_version_and_the_commit(tmp_path):
    root = _tree(tmp_path, default="opforge==0.2.0")
    assert stamp(root, "v0.2.0", COMMIT) == "0.2.0"
    text = (root / "src/opforge/_release.py").read_text()
    assert 'VERSION = "0.2.0"' in text and f'WORKFLOWS_COMMIT = "{COMMIT}"' in text


def test_stamp_refuses_workflows_that_install_another_opforge(tmp_path):
    root = _tree(tmp_path)  # the workflows default to this version, the tag says 9.9.9
    before = (root / "src/opforge/_release.py").read_text()
    with pytest.raises(OpforgeError, match="reusable-build-smoke.yml"):
        stamp(root, "v9.9.9", COMMIT)
    assert (root / "src/opforge/_release.py").read_text() == before
    with pytest.raises(UsageError):
        stamp(root, f"v{__version__}", "main")


@pytest.mark.slow
def test_the_release_steps_build_check_install_and_run(tmp_path):
    """What release.yml's `nox -s release` does before publishing, on a copy of the tree."""
    pytest.importorskip("twine", reason="the release check runs twine (pip install opforge[test])")
    pytest.importorskip("build", reason="the release builds with build (pip install opforge[build])")
    root = _tree(tmp_path, default="opforge==0.3.0")
    lines = []
    sdist, wheel = release(root, "v0.3.0", COMMIT, tmp_path / "out", isolated=False,
                           log=lines.append)
    assert sdist.name == "opforge-0.3.0.tar.gz" and wheel.name == "opforge-0.3.0-py3-none-any.whl"
    assert any("twine check --strict passed" in line for line in lines)
    assert lines[-1].endswith("runs: opforge 0.3.0")


# --- init from a development checkout --------------------------------------------------------


def _ext(tmp_path: Path) -> Path:
    root = tmp_path / "ext"
    (root / "my_ops").mkdir(parents=True)
    (root / "pyproject.toml").write_text('[project]\nname = "my-ops"\nversion = "0.1"\n')
    (root / "my_ops" / "__init__.py").write_text(
        "import torch\n\n\n@torch.library.custom_op('my_ops::twice', mutates_args=())\n"
        "def twice(x: torch.Tensor) -> torch.Tensor:\n    return x * 2\n")
    return root


def test_init_from_an_unreleased_checkout_refuses_to_pin_its_commit(tmp_path, capsys,
                                                                   monkeypatch):
    monkeypatch.setattr(_release, "WORKFLOWS_COMMIT", "")
    monkeypatch.setattr(callers, "_source_commit",
                        lambda: ("cd" * 20, "the opforge checkout at /src/opforge", None))
    root = _ext(tmp_path)
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    assert main(["init", str(root)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not a release" in err[0] and "cd" * 20 in err[0]
    assert "--workflows-ref" in err[0]
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before
    assert main(["init", str(root), "--workflows-ref", "cd" * 20]) == 0
    ci = (root / ".github/workflows/opforge-ci.yml").read_text()
    assert f"@{'cd' * 20} # v{__version__}" in ci


def test_init_from_this_development_tree_refuses_without_a_ref(tmp_path, capsys, monkeypatch):
    """The real lookup: this checkout's HEAD carries no v<version> tag of a release."""
    monkeypatch.setattr(_release, "WORKFLOWS_COMMIT", "")
    tags = subprocess.run(["git", "-C", str(ROOT), "tag", "--points-at", "HEAD"],
                          capture_output=True, text=True).stdout.split()
    if f"v{__version__}" in tags:
        pytest.skip("this checkout is the release's own commit")
    if callers._source_commit()[0] is None:
        pytest.skip("opforge is not imported from a git checkout here")
    assert main(["init", str(_ext(tmp_path)), "--dry-run"]) == 2
    assert "is not a release" in capsys.readouterr().err


def test_a_checkout_of_the_release_tag_is_a_release(tmp_path, monkeypatch):
    monkeypatch.setattr(_release, "WORKFLOWS_COMMIT", "")
    repo = tmp_path / "opforge"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "init", "-q"], check=True)
    (repo / "f").write_text("x")
    subprocess.run([*git, "add", "f"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "release"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    monkeypatch.setattr(callers, "_source_commit",
                        lambda: (head, f"the opforge checkout at {repo}", repo))
    with pytest.raises(UsageError, match="not a release"):
        init.workflows_pin()
    subprocess.run([*git, "tag", f"v{__version__}"], check=True)
    pin = init.workflows_pin()
    assert pin.commit == head and pin.opforge == f"opforge=={__version__}"
