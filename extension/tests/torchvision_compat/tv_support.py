"""torchvision for the compatibility suite: imported once, or the module is skipped with the reason.

CI's `compat` session installs torchvision beside the torch the wheel was built against and sets
OPFORGE_REQUIRE_TORCHVISION=1, so there a missing torchvision is a failure, not a skip.
"""

import os

import pytest
import torch


def require_torchvision():
    try:
        import torchvision
        import torchvision.ops
    except Exception as exc:  # torchvision built for another torch fails with more than ImportError
        reason = (
            f"torchvision cannot be imported beside torch {torch.__version__} "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
            "the compatibility suite runs in `nox -s compat`"
        )
        if os.environ.get("OPFORGE_REQUIRE_TORCHVISION") == "1":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason, allow_module_level=True)
    return torchvision
