"""opforge: build, smoke-test and bisect PyTorch op extensions.

Nothing in this package imports torch or the extension it works on: it drives other
interpreters (fresh virtual environments) that do.
"""

from opforge._release import VERSION as __version__  # the release tag's (opforge.release)

__all__ = ["__version__"]
