"""The environment cache's location and what it reads from a nightly's torch."""

from __future__ import annotations

from pathlib import Path

from opforge.bisect import envs
from opforge.paths import cache_dir


def test_cache_dir_override_then_xdg_then_platform(monkeypatch, tmp_path):
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path / "o"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert cache_dir() == tmp_path / "o"
    monkeypatch.delenv("OPFORGE_CACHE_DIR")
    assert cache_dir() == tmp_path / "x" / "opforge"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert "opforge" in cache_dir().parts


def test_torch_version_is_read_without_importing_torch(tmp_path):
    site = tmp_path / "lib" / "python3.11" / "site-packages" / "torch"
    site.mkdir(parents=True)
    (site / "version.py").write_text(
        "from typing import Optional\n__all__ = ['__version__']\n"
        "__version__ = '2.5.0.dev20240610+cpu'\ndebug = False\ncuda: Optional[str] = None\n"
        "git_version = 'f1e2d3c4b5a69788f1e2d3c4b5a69788f1e2d3c4'\n"
        "raise SystemExit('importing this would fail')\n")
    assert envs.read_torch_version(tmp_path) == ("2.5.0.dev20240610+cpu",
                                                 "f1e2d3c4b5a69788f1e2d3c4b5a69788f1e2d3c4")
    assert envs.read_torch_version(Path(tmp_path / "empty")) == (None, None)


def test_run_env_activates_the_environment_and_drops_pythonpath(monkeypatch, tmp_path):
    monkeypatch.setenv("PYTHONPATH", "/somewhere/else")
    env = envs.NightlyEnv(tmp_path, envs.env_python(tmp_path), "2.5.0", None, "0" * 64)
    run_env = env.run_env()
    assert "PYTHONPATH" not in run_env
    assert run_env["VIRTUAL_ENV"] == str(tmp_path)
    assert run_env["PATH"].startswith(str(tmp_path / "bin"))
