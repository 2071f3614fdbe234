"""What the user asked a bisect to do: its parameters, the endpoint forms, the commands to redo it.

Stored in the state file and compared on ``--resume``.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

from opforge.errors import UsageError
from opforge.files import lookup, read_json

from .index import Nightly


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
            if name in ("good", "bad", "wheel", "match", "timeout") and value is None:
                continue
            if name == "notes" and name not in data:
                continue
            if not isinstance(value, types) or isinstance(value, bool) and bool not in types:
                raise TypeError(f"params.{name} is {type(value).__name__}")
            if isinstance(value, list) and not all(isinstance(x, str) for x in value):
                raise TypeError(f"params.{name} must list strings")
        return cls(**data)


_FIELD_TYPES = {"good": (str,), "bad": (str,), "variant": (str,), "python": (str,),
                "index": (str,), "command": (list,), "wheel": (str,), "match": (str,),
                "regress": (str,), "retries": (int,), "timeout": (int, float),
                "timeout_skip": (bool,), "cwd": (str,), "notes": (list,)}



def parse_day(text: str, option: str) -> date:
    """YYYY-MM-DD, YYYYMMDD, or a nightly version (2.5.0.dev20240610+cpu)."""
    found = re.fullmatch(r"(\d{4})-?(\d{2})-?(\d{2})", text.strip())
    if found is None:
        found = re.search(r"\.dev(\d{4})(\d{2})(\d{2})", text)
    if found is None:
        raise UsageError(f"{option} {text!r}: expected a date like 2024-06-01 (or a nightly "
                         "version like 2.5.0.dev20240601)")
    try:
        return date(*(int(g) for g in found.groups()))
    except ValueError as exc:
        raise UsageError(f"{option} {text!r}: {exc}") from None


def endpoint(text: str | None, which: str) -> tuple[str | None, str | None]:
    """(YYYY-MM-DD or None, a note) for --good / --bad.

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
    return parse_day(text, option).isoformat(), None


def reproduce_command(params: Params, nightly: Nightly, python: str) -> str:
    """Shell lines that recreate the first bad nightly's environment and run the test."""
    env = f"/tmp/torch-{nightly.date:%Y%m%d}"
    lines = [f"{python} -m venv {env}",
             f"{env}/bin/python -m pip install {shlex.quote(nightly.url)}"
             + (f" --index-url {shlex.quote(params.index)}" if "://" in params.index
                and not params.index.startswith("file://") else "")]
    if params.wheel:
        lines.append(f"{env}/bin/python -m pip install --no-deps {shlex.quote(params.wheel)}")
    if params.command:
        lines.append(f"(. {env}/bin/activate && {shlex.join(params.command)})")
    else:
        if not params.wheel:
            lines.append(f"opforge build --variant {params.variant}  # against {env}/bin/python")
        lines.append(f"opforge smoke --python {env}/bin/python --variant {params.variant}")
    return " && \\\n  ".join(lines)


def rerun_command(params: Params, good: Nightly, bad: Nightly) -> str:
    argv = ["opforge", "bisect", "--good", good.day, "--bad", bad.day,
            "--variant", params.variant, "--python", params.python, "--index", params.index]
    if params.wheel:
        argv += ["--wheel", params.wheel]
    if params.match:
        argv += ["--match", params.match]
    if params.regress != "failure":
        argv += ["--regress", params.regress]
    if params.timeout:
        argv += ["--timeout", f"{params.timeout:g}"]
        if params.timeout_skip:
            argv.append("--timeout-skip")
    if params.command:
        argv += ["--", *params.command]
    return shlex.join(argv)
