"""What this copy of opforge_ops was built with (the build record opforge stamped)."""

import copy

from ._loader import BUILD_RECORD, DISTRIBUTION, read_build_info

_INFO = read_build_info()


def build_info():
    """The build info as a dict: torch version and commit, CUDA, MPS, compiled backends, ..."""
    if _INFO is None:
        raise RuntimeError(
            f"opforge_ops: no {BUILD_RECORD} in the {DISTRIBUTION} metadata; this copy was not "
            "installed from a wheel `opforge build` made"
        )
    return copy.deepcopy(_INFO)
