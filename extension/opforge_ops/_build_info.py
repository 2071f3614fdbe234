"""What this copy of opforge_ops was built with (written by setup.py)."""

import copy

from ._loader import BUILD_INFO_PATH, read_build_info

_INFO = read_build_info()


def build_info():
    """The build info as a dict: torch version and commit, CUDA, MPS, compiled backends, ..."""
    if _INFO is None:
        raise RuntimeError(
            f"opforge_ops: {BUILD_INFO_PATH} is missing; the package was not built by setup.py"
        )
    return copy.deepcopy(_INFO)
