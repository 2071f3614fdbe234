"""Where torch comes from: the matrix's index, overridable for machines that cannot reach it.

``OPFORGE_TORCH_INDEX`` (or a ``--torch-index`` option) replaces the matrix's index:
``pypi`` means pip's configured default index, anything else is a URL, a ``file://`` URL or
a local directory of wheels.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from opforge.errors import UsageError

ENV_VAR = "OPFORGE_TORCH_INDEX"
PYPI = "pypi"


def resolve_index(channel_index: str | None, override: str | None = None) -> str | None:
    """The index torch is installed from; None means pip's default index."""
    chosen = override or os.environ.get(ENV_VAR) or channel_index
    if not chosen or chosen == PYPI:
        return None
    return chosen


def pip_index_args(index: str | None) -> list[str]:
    """pip arguments that take torch from ``index`` and everything else from the default index."""
    if index is None:
        return []
    if "://" not in index:
        path = Path(index).expanduser().resolve()
        if path.is_dir() and not (path / "index.html").exists() and not any(path.glob("*/index.html")):
            return ["--find-links", str(path)]
        index = path.as_uri()
    # As PyTorch's install instructions do: the variant's index serves torch and its dependencies.
    return ["--index-url", index]


_URL = re.compile(r"https?://[^\s/]+(?:/\S*)?", re.IGNORECASE)


def check_index_variable(name: str, value: str) -> None:
    """OPFORGE_TORCH_INDEX's value: pypi, an http(s):// or file:// URL, or a directory."""
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
