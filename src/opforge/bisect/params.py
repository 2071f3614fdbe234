"""What the user asked a bisect to do: its parameters, the endpoint forms, the commands to redo it.

Stored in the state file and compared on ``--resume``.
"""

from __future__ import annotations

import math
import os
import re
import shlex
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

from packaging.version import InvalidVersion, Version

from opforge.errors import UsageError
from opforge.files import lookup, read_json

from .releases import Candidate, Release


@dataclass
class Params:
    """What the user asked for; stored in the state and compared on --resume."""

    good: str | None
    bad: str | None
    variant: str
    python: str
    index: str
    command: list[str]
    wheel: str | None
    match: str | None
    regress: str
    retries: int
    timeout: float | None
    timeout_skip: bool
    cwd: str
    notes: list[str] = field(default_factory=list)  # how the endpoints were chosen
    release_index: str | None = None  # a release bisect's index ("pypi": pip's default)
    releases_only: bool = False       # stop at the release boundary (no nightlies after it)
    companions: list[str] = field(default_factory=list)  # --with: torchvision, torchaudio, ...
    slower_than: float | None = None  # bisect by speed: the slowdown that makes a nightly bad

    @property
    def level(self) -> str:
        """"release" when the endpoints are versions, else "nightly" (dates)."""
        ends = [e for e in (self.good, self.bad) if e]
        return "release" if ends and release_version(ends[0]) is not None else "nightly"

    @property
    def mode(self) -> str:
        if self.command:
            return "command"
        return "wheel" if self.wheel else "build"

    def to_json(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, data: dict) -> Params:
        """Parameters read back from a state file; a field of the wrong type is a TypeError."""
        if not isinstance(data, dict):
            raise TypeError("params must be an object")
        for name, types in _FIELD_TYPES.items():
            value = data.get(name)
            if name in ("good", "bad", "wheel", "match", "timeout", "release_index",
                        "slower_than") \
                    and value is None:
                continue
            if name in ("notes", "release_index", "releases_only", "companions",
                        "slower_than") \
                    and name not in data:
                continue
            if not isinstance(value, types) or isinstance(value, bool) and bool not in types:
                raise TypeError(f"params.{name} is {type(value).__name__}")
            if isinstance(value, list) and not all(isinstance(x, str) for x in value):
                raise TypeError(f"params.{name} must list strings")
        params = cls(**data)
        params.check_ranges()
        return params

    def check_ranges(self) -> None:
        """What the command line would have refused, refused in a saved state too (a state is
        a file anyone can edit): a ValueError naming the field."""
        def bad(name: str, value, want: str) -> ValueError:
            return ValueError(f"params.{name} {value!r}: {want}")

        if not _VARIANT.fullmatch(self.variant):
            raise bad("variant", self.variant, "expected a name like cpu, cu126, mps")
        if self.retries < 0 or self.retries > MAX_RETRIES:
            raise bad("retries", self.retries, f"expected 0 to {MAX_RETRIES}")
        if self.timeout is not None and not 0 < self.timeout < math.inf:
            raise bad("timeout", self.timeout, "expected a positive number of seconds")
        if self.timeout_skip and self.timeout is None:
            raise bad("timeout_skip", True, "needs a timeout")
        if self.slower_than is not None and not 1 < self.slower_than < math.inf:
            raise bad("slower_than", self.slower_than, "expected a factor greater than 1")
        if self.regress not in ("failure", "success"):
            raise bad("regress", self.regress, "expected failure or success")
        for name in ("good", "bad"):
            value = getattr(self, name)
            if value is not None and release_version(value) is None \
                    and not re.fullmatch(r"\d{4}-\d{2}-\d{2}", value):
                raise bad(name, value, "expected a date (YYYY-MM-DD) or a release")
            if value is not None and release_version(value) is None:
                try:
                    parse_day(value, name)
                except UsageError as exc:
                    raise ValueError(f"params.{exc}") from None
        for name in self.companions:
            if not re.fullmatch(r"[a-z0-9][a-z0-9.-]*", name) or name == "torch":
                raise bad("companions", name, "expected a package name like torchvision")
        if self.match is not None:
            try:
                re.compile(self.match)
            except (re.error, RecursionError, OverflowError) as exc:
                raise bad("match", self.match, f"not a regular expression ({exc})") from None
        for name in ("python", "index", "cwd", "wheel", "release_index", "match"):
            value = getattr(self, name)
            if value is not None and ("\x00" in value or (name != "match" and not value)):
                raise bad(name, value, "expected a non-empty text without NUL bytes")
        if any("\x00" in word for word in self.command):
            raise bad("command", self.command, "holds a NUL byte")


_FIELD_TYPES = {"good": (str,), "bad": (str,), "variant": (str,), "python": (str,),
                "index": (str,), "command": (list,), "wheel": (str,), "match": (str,),
                "regress": (str,), "retries": (int,), "timeout": (int, float),
                "timeout_skip": (bool,), "cwd": (str,), "notes": (list,),
                "release_index": (str,), "releases_only": (bool,), "companions": (list,),
                "slower_than": (int, float)}

_DATE = re.compile(r"(\d{4})-?(\d{2})-?(\d{2})")
_VARIANT = re.compile(r"[a-z][a-z0-9_]*")   # as --variant takes it: no path, no dots
MAX_RETRIES = 100


def release_version(text: str) -> Version | None:
    """The version a --good / --bad names when it is a release (2.12.0, 2.13.0rc1), else None."""
    text = text.strip()
    if _DATE.fullmatch(text) or ".dev" in text:
        return None
    try:
        version = Version(text)
    except InvalidVersion:
        return None
    return None if version.is_devrelease else version



def parse_day(text: str, option: str) -> date:
    """YYYY-MM-DD, YYYYMMDD, or a nightly version (2.5.0.dev20240610+cpu)."""
    found = _DATE.fullmatch(text.strip())
    if found is None:
        found = re.search(r"\.dev(\d{4})(\d{2})(\d{2})", text)
    if found is None:
        raise UsageError(f"{option} {text!r}: expected a date like 2024-06-01, a nightly "
                         "version like 2.5.0.dev20240601 or a release like 2.12.0")
    try:
        return date(*(int(g) for g in found.groups()))
    except ValueError as exc:
        raise UsageError(f"{option} {text!r}: {exc}") from None


def endpoint(text: str | None, which: str) -> tuple[str | None, str | None]:
    """(YYYY-MM-DD, a release version, or None; a note) for --good / --bad.

    Takes a date, a nightly version, ``latest`` (--bad: the newest nightly), or the path of an
    ``opforge smoke --json`` report, whose torch version names the nightly (how CI records the
    last green night). A --good report that does not exist falls back to the walk-back.
    """
    option = f"--{which}"
    if text is None or not text.strip():
        return None, None
    text = text.strip()
    if text == "latest":
        if which == "good":
            raise UsageError("--good latest: the newest nightly can only be the bad end")
        return None, None
    if text.endswith(".json") or os.sep in text:
        path = Path(text).expanduser()
        if lookup(path, what=option) is None:
            if which == "good":
                return None, f"{option} {text}: no such report, so walking back from --bad instead"
            raise UsageError(f"{option} {text}: no such file")
        doc = read_json(path, what=option)
        try:
            version = (doc.get("environment") or {}).get("torch_version") or doc.get("torch_version")
        except AttributeError as exc:
            raise UsageError(f"{option} {text}: not an opforge smoke --json report ({exc})") from None
        if not isinstance(version, str) or ".dev" not in version:
            raise UsageError(f"{option} {text}: its torch ({version}) is not a nightly")
        day = parse_day(version, option)
        return day.isoformat(), f"{option} {day} from {text} (torch {version})"
    version = release_version(text)
    if version is not None:
        return str(version), None
    return parse_day(text, option).isoformat(), None


def check_endpoints(good: str | None, bad: str | None) -> None:
    """Both ends of one kind, in order; a release --bad needs a --good (no walk-back)."""
    g = release_version(good) if good else None
    b = release_version(bad) if bad else None
    if good and bad and (g is None) != (b is None):
        raise UsageError(f"--good {good} and --bad {bad}: give two releases (2.10.0) or two "
                         "dates (2024-06-01); the bisect goes from releases into nightlies "
                         "by itself")
    if b is not None and not good:
        raise UsageError(f"--bad {bad} is a release: give --good as a release too (walking back "
                         "without --good works over nightlies only)")
    if g is not None and b is not None and g >= b:
        raise UsageError(f"--good {good} must be older than --bad {bad}")
    if g is None and b is None and good and bad and good >= bad:
        raise UsageError(f"--good {good} must be older than --bad {bad}")


def _install_line(params: Params, candidate: Candidate, env: str) -> str:
    pip = f"{env}/bin/python -m pip install"
    if isinstance(candidate, Release):
        index = candidate.index
        names = " ".join(params.companions)
        if not candidate.by_requirement:
            return f"{pip} {shlex.quote(candidate.url)} {names}".rstrip()
        spec = " ".join([shlex.quote(f"torch=={candidate.version}"), *params.companions])
        return f"{pip} {spec}" + (f" --index-url {shlex.quote(index)}" if index else "")
    wheels = " ".join(shlex.quote(w.url) for w in (candidate, *candidate.companions))
    return f"{pip} {wheels}" + (
        f" --index-url {shlex.quote(params.index)}" if "://" in params.index
        and not params.index.startswith("file://") else "")


def reproduce_command(params: Params, nightly: Candidate, python: str) -> str:
    """Shell lines that recreate a probe's environment (a nightly, a release, or a commit's
    Python over a nightly) and run the test."""
    commit = nightly if getattr(nightly, "base", None) is not None else None
    if commit is not None:
        nightly = commit.base
    label = nightly.key if isinstance(nightly, Release) else f"{nightly.date:%Y%m%d}"
    if commit is not None:
        label = commit.key
    env = f"/tmp/torch-{label.replace('+', '_')}"
    lines = [f"{python} -m venv {env}", _install_line(params, nightly, env)]
    if commit is not None:  # overlay the commit's torch/ Python files, as the bisect did
        repo = shlex.quote(commit.repo)
        lines.append(
            f"site=$({env}/bin/python -c 'import sysconfig; print(sysconfig.get_path(\"purelib\"))')"
            f" && for f in $(git -C {repo} diff --name-only {commit.base_main} {commit.sha} -- "
            f"torch | grep -E '[.]pyi?$'); do rm -f \"$site/$f\"; git -C {repo} show "
            f"{commit.sha}:\"$f\" > \"$site/$f\" 2>/dev/null || rm -f \"$site/$f\"; done")
    if params.wheel:
        lines.append(f"{env}/bin/python -m pip install --no-deps {shlex.quote(params.wheel)}")
    if params.command:
        lines.append(f"(. {env}/bin/activate && {shlex.join(params.command)})")
    else:
        if not params.wheel:
            lines.append(f"opforge build --variant {params.variant}  # against {env}/bin/python")
        lines.append(f"opforge smoke --python {env}/bin/python --variant {params.variant}")
    return " && \\\n  ".join(lines)


def rerun_command(params: Params, good: Candidate, bad: Candidate) -> str:
    argv = ["opforge", "bisect", "--good", good.key, "--bad", bad.key,
            "--variant", params.variant, "--python", params.python, "--index", params.index]
    if isinstance(good, Release) and params.release_index:
        argv += ["--release-index", params.release_index]
    if params.releases_only:
        argv.append("--releases-only")
    for name in params.companions:
        argv += ["--with", name]
    if params.wheel:
        argv += ["--wheel", params.wheel]
    if params.match:
        argv += ["--match", params.match]
    if params.slower_than:
        argv += ["--slower-than", f"{params.slower_than:g}"]
    if params.regress != "failure":
        argv += ["--regress", params.regress]
    if params.timeout:
        argv += ["--timeout", f"{params.timeout:g}"]
        if params.timeout_skip:
            argv.append("--timeout-skip")
    if params.command:
        argv += ["--", *params.command]
    return shlex.join(argv)
