"""opforge's environment variables, checked for type and range before any command acts.

``check_environment`` runs once per command, before anything is created: a value opforge would
misread later (after making an environment, after a build started) is one line now, exit 2,
naming the variable and what it takes. An empty value means unset, as before.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping

from opforge.errors import UsageError

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_SWITCH_ON = {"1", "on", "true", "yes"}
_URL = re.compile(r"https?://[^\s/]+(?:/\S*)?", re.IGNORECASE)


def _installer(name: str, value: str) -> None:
    from opforge.venv import INSTALLERS

    if value not in INSTALLERS:
        raise UsageError(f"{name}={value!r}: expected one of {', '.join(INSTALLERS)}")


def _torch_index(name: str, value: str) -> None:
    from opforge.torchsource import PYPI

    if value == PYPI or _URL.fullmatch(value):
        return
    path = value[len("file://"):] if value.startswith("file://") else value
    if "://" in value and not value.startswith("file://"):
        raise UsageError(f"{name}={value!r}: expected pypi, an http(s):// or file:// index URL, "
                         "or a directory of wheels")
    try:
        info = os.stat(os.path.expanduser(path))
    except (OSError, ValueError):
        raise UsageError(f"{name}={value!r}: not pypi, not an http(s):// URL, and no such "
                         "directory (give pypi, an index URL or a directory of wheels)") from None
    if not stat.S_ISDIR(info.st_mode):
        raise UsageError(f"{name}={value!r}: not a directory (give pypi, an index URL or a "
                         "directory of wheels)")


def _compiler_cache(name: str, value: str) -> None:
    from opforge.compiler_cache import OFF_VALUES

    if value.strip().lower() not in OFF_VALUES | _SWITCH_ON:
        raise UsageError(f"{name}={value!r}: expected off (or 0, false, no) to compile "
                         "without the cache, or on (1, true, yes)")


def _cache_max_size(name: str, value: str) -> None:
    from opforge.bisect.cache import parse_size

    parse_size(value, name)


def _folder(name: str, value: str) -> None:
    try:
        info = os.stat(os.path.expanduser(value))
    except FileNotFoundError:
        return  # made when first needed
    except (OSError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not a valid path"
        raise UsageError(f"{name}={value!r}: {why}") from None
    if not stat.S_ISDIR(info.st_mode):
        raise UsageError(f"{name}={value!r}: exists and is not a directory")


def _channel(name: str, value: str) -> None:
    from opforge.matrix import CHANNELS

    if value not in CHANNELS:
        raise UsageError(f"{name}={value!r} is not one of {', '.join(CHANNELS)}")


CHECKS = {
    "OPFORGE_INSTALLER": _installer,
    "OPFORGE_TORCH_INDEX": _torch_index,
    "OPFORGE_COMPILER_CACHE": _compiler_cache,
    "OPFORGE_CACHE_MAX_SIZE": _cache_max_size,
    "OPFORGE_CACHE_DIR": _folder,
    "OPFORGE_TORCH_CHANNEL": _channel,
}


def check_environment(env: Mapping[str, str] | None = None) -> None:
    """Every opforge variable that is set, checked; the first bad one is a UsageError."""
    env = os.environ if env is None else env
    for name, check in CHECKS.items():
        value = env.get(name, "")
        if not value:
            continue
        if _CONTROL.search(value):
            raise UsageError(f"{name}={value!r}: holds a control character")
        check(name, value)
