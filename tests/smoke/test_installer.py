"""Fresh environments with uv or pip: pip's configuration said to uv, the same builds chosen.

The unit tests read pip configuration files written here (no network); the end-to-end tests
resolve one requirement with real pip and real uv against a local find-links directory, a
``file://`` index and a constraints file, and require the same version from both.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from smoke_wheelkit import write_wheel

from opforge.errors import UsageError
from opforge.pipconfig import PipConfig, config_files, read_pip_config
from opforge.progress import step, transfer
from opforge.venv import Installer, find_uv, installer, uv_install_args

# --- reading pip's configuration -------------------------------------------------------------


def _conf(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_later_files_override_earlier_and_install_section_overrides_global(tmp_path):
    first = _conf(tmp_path / "global.conf", "[global]\nindex-url = https://a.example/simple\n"
                  "find-links = /wheels/one\n  /wheels/two\n")
    second = _conf(tmp_path / "user.conf", "[global]\nindex-url = https://b.example/simple\n"
                   "[install]\nconstraint = /caps.txt\n")
    # pip reads [global] of every file before [install] of any: the first file's [install] wins
    third = _conf(tmp_path / "site.conf", "[global]\nconstraint = /other.txt\n")
    config = read_pip_config({}, files=[first, second, third])
    assert config.index_url == "https://b.example/simple"
    assert config.find_links == ("/wheels/one", "/wheels/two")
    assert config.constraints == ("/caps.txt",)


def test_variables_override_files_and_dev_null_constraint_lifts_the_cap(tmp_path):
    conf = _conf(tmp_path / "pip.conf", "[global]\nconstraint = /caps.txt\n"
                 "extra-index-url = file:///idx/one file:///idx/two\ncert = /ca.pem\n")
    environ = {"PIP_CONSTRAINT": os.devnull, "PIP_INDEX_URL": "https://mirror.example/simple",
               "PIP_TRUSTED_HOST": "mirror.example", "PIP_NO_INDEX": "no",
               "PIP_DEFAULT_TIMEOUT": "60"}
    config = read_pip_config(environ, files=[conf])
    assert config == PipConfig(index_url="https://mirror.example/simple",
                               extra_index_urls=("file:///idx/one", "file:///idx/two"),
                               trusted_hosts=("mirror.example",), cert="/ca.pem", timeout="60")


def test_config_file_variable_set_to_dev_null_loads_no_file(tmp_path):
    assert config_files({"PIP_CONFIG_FILE": os.devnull, "HOME": str(tmp_path)}) == []


def test_config_file_variable_skips_the_user_files_but_not_the_global_ones(tmp_path):
    env_file = _conf(tmp_path / "env.conf", "[global]\n")
    with_var = config_files({"PIP_CONFIG_FILE": str(env_file), "HOME": str(tmp_path)})
    without = config_files({"HOME": str(tmp_path)})
    assert with_var[-1] == env_file
    assert tmp_path / ".pip" / "pip.conf" in without
    assert tmp_path / ".pip" / "pip.conf" not in with_var
    assert [p for p in without if "etc" in p.parts] == [p for p in with_var if "etc" in p.parts]


def test_broken_config_file_is_left_to_pip(tmp_path):
    broken = _conf(tmp_path / "broken.conf", "index-url with no section\n")
    assert read_pip_config({}, files=[broken]) == PipConfig()


# --- pip's words in uv's ---------------------------------------------------------------------


def test_uv_gets_every_index_and_pips_best_match_strategy():
    config = PipConfig(index_url="https://mirror/simple", extra_index_urls=("file:///a",),
                       find_links=("/wheels",), constraints=("/caps.txt",), no_index=False,
                       trusted_hosts=("mirror",), cert="/ca.pem", proxy="http://proxy:3128")
    args = uv_install_args(["-q", "torch==2.13.0"], config)
    assert args[:2] == ["--index-strategy", "unsafe-best-match"]
    pairs = list(zip(args[2::2], args[3::2]))
    for pair in [("--default-index", "https://mirror/simple"), ("--index", "file:///a"),
                 ("--find-links", "/wheels"), ("--constraint", "/caps.txt"),
                 ("--allow-insecure-host", "mirror")]:
        assert pair in pairs
    assert args[-2:] == ["-q", "torch==2.13.0"]
    assert config.uv_env() == {"SSL_CERT_FILE": "/ca.pem", "HTTP_PROXY": "http://proxy:3128",
                               "HTTPS_PROXY": "http://proxy:3128"}


def test_command_line_index_replaces_the_configured_one_and_keeps_the_extras():
    config = PipConfig(index_url="https://mirror/simple", extra_index_urls=("file:///a",))
    args = uv_install_args(["torch", "--index-url", "https://variant/cu130"], config)
    assert "https://mirror/simple" not in args
    assert args.count("--default-index") == 1
    assert args[args.index("--default-index") + 1] == "https://variant/cu130"
    assert "file:///a" in args


def test_pip_only_options_are_said_the_uv_way():
    args = uv_install_args(["--pre", "--force-reinstall", "--no-deps", "--ignore-installed",
                            "--disable-pip-version-check", "--extra-index-url=file:///x", "w.whl"],
                           PipConfig())
    assert args[2:] == ["--prerelease", "allow", "--reinstall", "--no-deps", "--reinstall",
                        "--index", "file:///x", "w.whl"]


def test_unknown_installer_choice_is_a_usage_error():
    with pytest.raises(UsageError, match="OPFORGE_INSTALLER='conda': expected one of uv, pip"):
        installer("conda")


def test_without_uv_the_pip_path_is_taken_with_one_notice(monkeypatch, capsys):
    import opforge.venv as venv

    monkeypatch.setattr(venv, "find_uv", lambda: None)
    venv._notice_once.cache_clear()
    assert installer().name == "pip" and installer().name == "pip"
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("opforge: uv not found:")
    with pytest.raises(UsageError, match="no uv was found"):
        installer("uv")


def test_progress_is_one_plain_line_outside_a_terminal(monkeypatch):
    monkeypatch.setenv("CI", "true")
    out = io.StringIO()
    with step("installed torch with uv", stream=out):
        pass
    assert out.getvalue().startswith("opforge: installed torch with uv (")
    assert out.getvalue().count("\n") == 1


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_in_a_terminal_ends_with_a_checked_line(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    out = _Terminal()
    with step("created an environment with uv", stream=out):
        pass
    with transfer("downloaded torch.whl", 3 << 20, stream=out) as advance:
        for _ in range(3):
            advance(1 << 20)
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())  # rich's colours
    lines = [line for line in plain.splitlines() if "✓" in line]
    assert [line.split("✓ ")[1].split(" (")[0] for line in lines] == [
        "created an environment with uv", "downloaded torch.whl"]


def test_download_outside_a_terminal_is_one_line_with_its_size(monkeypatch):
    monkeypatch.setenv("CI", "1")
    out = _Terminal()  # CI wins over a terminal
    with transfer("downloaded torch.whl", None, stream=out) as advance:
        advance(2_500_000)
    assert out.getvalue().startswith("opforge: downloaded torch.whl: 2.5 MB (")
    assert out.getvalue().count("\n") == 1


# --- the same builds from both installers (real pip, real uv, local indexes) -----------------

needs_uv = pytest.mark.skipif(find_uv() is None, reason="uv is not installed (pip install uv)")


@pytest.fixture
def local_sources(tmp_path):
    """find-links with demo 1.0+cpu, a file:// index with demo 1.0 and 2.0, a cap at <=1.0;
    pip configured for them through PIP_CONFIG_FILE alone."""
    links = tmp_path / "links"
    links.mkdir()
    write_wheel(links / "demo-1.0+cpu-py3-none-any.whl", {"demo/__init__.py": b"B='cpu'\n"},
                dist="demo", version="1.0+cpu")
    index = tmp_path / "index" / "demo"
    index.mkdir(parents=True)
    for version in ("1.0", "2.0"):
        name = f"demo-{version}-py3-none-any.whl"
        write_wheel(index / name, {"demo/__init__.py": b"B='index'\n"}, dist="demo",
                    version=version)
    (index / "index.html").write_text("".join(
        f'<a href="{p.name}">{p.name}</a>\n' for p in sorted(index.glob("*.whl"))))
    caps = tmp_path / "caps.txt"
    caps.write_text("demo<=1.0\n")
    conf = _conf(tmp_path / "pip.conf", f"[global]\nindex-url = {index.parent.as_uri()}\n"
                 f"find-links = {links}\nconstraint = {caps}\n")
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    environ["PIP_CONFIG_FILE"] = str(conf)
    return environ


def _chosen(tool: Installer, python: Path, requirement: str, environ: dict) -> str:
    """The version each installer puts in a fresh environment."""
    tool.install(python, "--force-reinstall", requirement, env=environ)
    out = subprocess.run([str(python), "-c", "import demo, importlib.metadata as m; "
                          "print(m.version('demo'), demo.B)"], capture_output=True, text=True,
                         env=environ, check=True)
    return out.stdout.strip()


@needs_uv
@pytest.mark.parametrize("requirement", ["demo==1.0", "demo"])
def test_uv_installs_what_pip_installs(tmp_path, local_sources, monkeypatch, requirement):
    monkeypatch.setattr(os, "environ", local_sources)
    uv_python = Installer(uv=find_uv()).create(tmp_path / "uv-env")
    pip_python = Installer(uv=None).create(tmp_path / "pip-env")
    by_pip = _chosen(Installer(uv=None), pip_python, requirement, local_sources)
    by_uv = _chosen(Installer(uv=find_uv()), uv_python, requirement, local_sources)
    # the local build from find-links, under the cap, over the index's plain 1.0 and its 2.0
    assert by_pip == by_uv == "1.0+cpu cpu"
    # PIP_CONSTRAINT=/dev/null lifts the configured cap for both
    lifted = {**local_sources, "PIP_CONSTRAINT": os.devnull}
    monkeypatch.setattr(os, "environ", lifted)
    assert (_chosen(Installer(uv=None), pip_python, "demo", lifted)
            == _chosen(Installer(uv=find_uv()), uv_python, "demo", lifted) == "2.0 index")


@needs_uv
def test_uv_environment_is_fresh_and_isolated(tmp_path):
    python = Installer(uv=find_uv()).create(tmp_path / "env")
    out = subprocess.run([str(python), "-c", "import sys, json; print(json.dumps("
                          "[sys.prefix, sys.base_prefix, sys.executable]))"],
                         capture_output=True, text=True, check=True)
    prefix, base, exe = json.loads(out.stdout)
    assert Path(prefix) == tmp_path / "env" and prefix != base
    assert Path(exe).parent.parent == tmp_path / "env"
    assert "include-system-site-packages = false" in (tmp_path / "env" / "pyvenv.cfg").read_text()
    assert sys.prefix != prefix


class _Session:
    """What opforge.nox.install sees of a nox session: its backend and install()."""

    def __init__(self, backend: str):
        self.virtualenv = type("Env", (), {"venv_backend": backend})()
        self.calls: list[tuple[tuple, dict]] = []

    def install(self, *args, **kwargs):
        self.calls.append((args, kwargs))


def test_nox_sessions_under_uv_get_pips_configuration(tmp_path, monkeypatch):
    import opforge.nox

    conf = _conf(tmp_path / "pip.conf", "[global]\nfind-links = /wheels\nconstraint = /caps\n"
                 "cert = /ca.pem\n")
    monkeypatch.setattr(os, "environ", {"PIP_CONFIG_FILE": str(conf), "HOME": str(tmp_path)})
    monkeypatch.setattr("opforge.pipconfig.config_files", lambda environ=None: [conf])
    uv_session, pip_session = _Session("uv"), _Session("virtualenv")
    opforge.nox.install(uv_session, "--force-reinstall", "w.whl")
    opforge.nox.install(pip_session, "--force-reinstall", "w.whl")
    (args, kwargs), = uv_session.calls
    assert args[0] == "--no-config" and args[-2:] == ("--reinstall", "w.whl")
    assert ("--find-links", "/wheels") in zip(args, args[1:])
    assert ("--constraint", "/caps") in zip(args, args[1:])
    assert kwargs == {"env": {"SSL_CERT_FILE": "/ca.pem"}}
    # virtualenv sessions run pip itself, which reads its configuration as always
    assert pip_session.calls == [(("--force-reinstall", "w.whl"), {})]
