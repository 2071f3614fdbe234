"""opforge's environment variables, checked for type and range before any command acts.

``check_environment`` runs once per command, before anything is created: a value opforge would
misread later (after making an environment, after a build started) is one line now, exit 2,
naming the variable and what it takes. An empty value means unset, as before.

Each variable's check lives with the feature that reads it (``venv.check_installer_variable``,
``torchsource.check_index_variable``...); the command line (``opforge.cli.environment``) lists
them and hands the list here. This module is shared ground: it imports no feature.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable, Mapping

from opforge.errors import UsageError

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

Check = Callable[[str, str], None]   # (variable, value) -> None, or raises UsageError


def check_folder_variable(name: str, value: str) -> None:
    """A directory opforge makes when first needed: absent is fine, a file is not."""
    try:
        info = os.stat(os.path.expanduser(value))
    except FileNotFoundError:
        return  # made when first needed
    except (OSError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not a valid path"
        raise UsageError(f"{name}={value!r}: {why}") from None
    if not stat.S_ISDIR(info.st_mode):
        raise UsageError(f"{name}={value!r}: exists and is not a directory")


def check_environment(checks: Mapping[str, Check], env: Mapping[str, str] | None = None) -> None:
    """Every variable of ``checks`` that is set, checked; the first bad one is a UsageError."""
    env = os.environ if env is None else env
    for name, check in checks.items():
        value = env.get(name, "")
        if not value:
            continue
        if _CONTROL.search(value):
            raise UsageError(f"{name}={value!r}: holds a control character")
        check(name, value)
