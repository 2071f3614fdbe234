"""pip's effective configuration, read once, and the same settings said to uv.

uv ignores pip's configuration files and ``PIP_*`` variables. An environment made with uv must
hold what pip would have installed there, so the settings that decide *what* gets installed
(indexes, find-links, constraints, trust) are read the way pip reads them and passed to uv as
flags and variables. The order is pip's (https://pip.pypa.io/en/stable/topics/configuration/):
global files, then user files (skipped when ``PIP_CONFIG_FILE`` names a file), the site file,
``PIP_CONFIG_FILE``; ``[global]`` of all of them, then ``[install]``; ``PIP_*`` variables last.
``PIP_CONFIG_FILE=/dev/null`` loads no file at all, as in pip.
"""

from __future__ import annotations

import configparser
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

# The options that change what is installed; everything else in pip.conf (timeouts, progress
# bars, cache) leaves the result alone.
_LIST_OPTIONS = ("extra-index-url", "find-links", "constraint", "trusted-host", "only-binary",
                 "no-binary")
_VALUE_OPTIONS = ("index-url", "cert", "client-cert", "proxy", "timeout")
_FLAG_OPTIONS = ("no-index", "pre")
_TRUE = {"1", "true", "yes", "on"}


@dataclass(frozen=True)
class PipConfig:
    """What pip would use, as pip's own option names say it."""

    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    constraints: tuple[str, ...] = ()
    trusted_hosts: tuple[str, ...] = ()
    only_binary: tuple[str, ...] = ()
    no_binary: tuple[str, ...] = ()
    no_index: bool = False
    pre: bool = False
    cert: str | None = None
    client_cert: str | None = None
    proxy: str | None = None
    timeout: str | None = None

    def uv_args(self) -> list[str]:
        """uv pip install flags that make uv choose what pip would."""
        # pip takes the best version across all its indexes and find-links; uv's default
        # takes the first index that has the package at all
        args = ["--index-strategy", "unsafe-best-match"]
        if self.index_url:
            args += ["--default-index", self.index_url]
        for url in self.extra_index_urls:
            args += ["--index", url]
        for location in self.find_links:
            args += ["--find-links", location]
        for path in self.constraints:
            args += ["--constraint", path]
        for host in self.trusted_hosts:
            args += ["--allow-insecure-host", host]
        for value in self.only_binary:
            args += ["--only-binary", value]
        for value in self.no_binary:
            args += ["--no-binary", value]
        if self.no_index:
            args.append("--no-index")
        if self.pre:
            args += ["--prerelease", "allow"]
        return args

    def uv_env(self) -> dict[str, str]:
        """Variables for uv: certificates, proxy, timeout (uv reads these, not flags)."""
        env = {}
        if self.cert:
            env["SSL_CERT_FILE"] = self.cert
        if self.client_cert:
            env["SSL_CLIENT_CERT"] = self.client_cert
        if self.proxy:
            env["HTTP_PROXY"] = env["HTTPS_PROXY"] = self.proxy
        if self.timeout:
            env["UV_HTTP_TIMEOUT"] = self.timeout
        return env


def config_files(environ: Mapping[str, str] | None = None) -> list[Path]:
    """The files pip reads, lowest precedence first (whether they exist or not)."""
    environ = os.environ if environ is None else environ
    env_file = environ.get("PIP_CONFIG_FILE")
    if env_file == os.devnull:
        return []
    home = Path(environ.get("HOME") or Path.home())
    if sys.platform == "win32":
        program_data = Path(environ.get("PROGRAMDATA", r"C:\ProgramData"))
        global_files = [program_data / "pip" / "pip.ini"]
        user_files = [home / "pip" / "pip.ini",
                      Path(environ.get("APPDATA", home)) / "pip" / "pip.ini"]
        site_name = "pip.ini"
    elif sys.platform == "darwin":
        global_files = [Path("/Library/Application Support/pip/pip.conf")]
        user_files = [home / ".pip" / "pip.conf",
                      home / "Library" / "Application Support" / "pip" / "pip.conf",
                      Path(environ.get("XDG_CONFIG_HOME") or home / ".config") / "pip" / "pip.conf"]
        site_name = "pip.conf"
    else:
        dirs = (environ.get("XDG_CONFIG_DIRS") or "/etc/xdg").split(os.pathsep)
        global_files = [Path(d) / "pip" / "pip.conf" for d in dirs if d] + [Path("/etc/pip.conf")]
        user_files = [home / ".pip" / "pip.conf",
                      Path(environ.get("XDG_CONFIG_HOME") or home / ".config") / "pip" / "pip.conf"]
        site_name = "pip.conf"
    files = list(global_files)
    if not (env_file and Path(env_file).exists()):
        files += user_files
    files.append(Path(sys.prefix) / site_name)
    if env_file:
        files.append(Path(env_file))
    return files


def _split(value: str) -> tuple[str, ...]:
    return tuple(value.split())


def read_pip_config(environ: Mapping[str, str] | None = None,
                    files: list[Path] | None = None) -> PipConfig:
    """pip's effective install options from its files and ``PIP_*`` variables."""
    environ = os.environ if environ is None else environ
    parsers = []
    for path in config_files(environ) if files is None else files:
        parser = configparser.RawConfigParser()
        try:
            parser.read(path, encoding="utf-8")
        except (configparser.Error, UnicodeDecodeError):
            continue  # pip refuses a broken file itself; the pip path reports it
        parsers.append(parser)
    raw: dict[str, str] = {}
    # as pip does: [global] of every file, then [install] of every file, then the variables
    for section in ("global", "install"):
        for parser in parsers:
            if parser.has_section(section):
                for key, value in parser.items(section):
                    raw[key.replace("_", "-")] = value
    for key, value in environ.items():
        if key.startswith("PIP_") and key != "PIP_CONFIG_FILE":
            raw[key[4:].lower().replace("_", "-")] = value
    # pip treats the option's short spelling the same
    aliases = {"extra-index-urls": "extra-index-url", "constraints": "constraint",
               "i": "index-url", "f": "find-links", "c": "constraint",
               "default-timeout": "timeout"}
    for alias, name in aliases.items():
        if alias in raw and name not in raw:
            raw[name] = raw.pop(alias)
    lists = {name: _split(raw.get(name, "")) for name in _LIST_OPTIONS}
    values = {name: (raw.get(name) or "").strip() or None for name in _VALUE_OPTIONS}
    flags = {name: (raw.get(name) or "").strip().lower() in _TRUE for name in _FLAG_OPTIONS}
    return PipConfig(index_url=values["index-url"], extra_index_urls=lists["extra-index-url"],
                     find_links=lists["find-links"], constraints=_real(lists["constraint"]),
                     trusted_hosts=lists["trusted-host"], only_binary=lists["only-binary"],
                     no_binary=lists["no-binary"], no_index=flags["no-index"], pre=flags["pre"],
                     cert=values["cert"], client_cert=values["client-cert"],
                     proxy=values["proxy"], timeout=values["timeout"])


def _real(constraints: tuple[str, ...]) -> tuple[str, ...]:
    # PIP_CONSTRAINT=/dev/null is how a cap in the global configuration is lifted
    return tuple(c for c in constraints if c != os.devnull)
