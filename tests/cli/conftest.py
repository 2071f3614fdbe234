"""Report how many generated cases each command ran, and how long opforge took on them."""

from __future__ import annotations

import sys


def pytest_terminal_summary(terminalreporter):
    contract = sys.modules.get("contract")
    if contract is None or not contract.CASES:
        return
    CASES, SECONDS = contract.CASES, contract.SECONDS
    terminalreporter.section("opforge bad-input contract: generated cases per command")
    for command in sorted(CASES):
        codes = ", ".join(f"exit {code}: {n}" for code, n in
                          sorted(contract.CODES[command].items()))
        terminalreporter.write_line(f"{command:8s} {CASES[command]:5d} cases "
                                    f"{SECONDS[command]:7.1f} s in opforge ({codes})")
    terminalreporter.write_line(f"{'total':8s} {sum(CASES.values()):5d} cases "
                                f"{sum(SECONDS.values()):7.1f} s in opforge")
