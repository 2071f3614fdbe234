"""Where opforge keeps what outlives a run: one cache directory for the whole tool.

Under it: ``envs/`` and ``bisect/`` (bisect's environments and state), ``bench/`` (bench
baselines), ``logs/`` (crash logs), ``bytecode/`` (the ``.pyc`` files fresh environments
share, ``opforge.bytecode``), ``builds/`` (how long each variant's last build took, for the
compile's estimate). The compiler cache is the exception (``sccache/`` under
the platform's user cache directory, or ``$SCCACHE_DIR``): the workflows persist that path.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

CACHE_DIR_ENV = "OPFORGE_CACHE_DIR"


def user_cache_dir() -> Path:
    """The platform's user cache directory for opforge (``~/.cache/opforge`` on Linux)."""
    # platformdirs (~3 ms) only without $OPFORGE_CACHE_DIR / $XDG_CACHE_HOME: paths is on the
    # CLI's startup path
    import platformdirs

    return Path(platformdirs.user_cache_dir("opforge", appauthor=False))


def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """OPFORGE_CACHE_DIR, else XDG_CACHE_HOME/opforge, else the platform's user cache dir."""
    environ = os.environ if environ is None else environ
    override = environ.get(CACHE_DIR_ENV)
    if override:
        return Path(override).expanduser()
    xdg = environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg).expanduser() / "opforge"
    return user_cache_dir()
