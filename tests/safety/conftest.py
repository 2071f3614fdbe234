"""tests/safety: hostile trees, hostile state files, racing processes (issue 29).

The contract helpers (``check``: exit code, one line, no traceback, nothing changed when
refused) come from tests/cli/contract.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

CLI_TESTS = str(Path(__file__).resolve().parents[1] / "cli")
if CLI_TESTS not in sys.path:
    sys.path.insert(0, CLI_TESTS)
