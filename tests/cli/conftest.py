"""Report how many generated cases each command ran, and how long opforge took on them.

Under pytest-xdist each worker hands its counts to the controller, which adds them up.
"""

from __future__ import annotations

import sys
from collections import Counter, defaultdict

import pytest

_FROM_WORKERS: list[dict] = []


def _counts() -> dict:
    contract = sys.modules.get("contract")
    if contract is None:
        return {"cases": {}, "seconds": {}, "codes": {}}
    return {"cases": dict(contract.CASES), "seconds": dict(contract.SECONDS),
            "codes": {command: dict(codes) for command, codes in contract.CODES.items()}}


def pytest_sessionfinish(session):
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: the controller prints the summary
        workeroutput["opforge_contract"] = _counts()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    counts = getattr(node, "workeroutput", {}).get("opforge_contract")
    if counts:
        _FROM_WORKERS.append(counts)


def pytest_terminal_summary(terminalreporter):
    cases, seconds = Counter(), defaultdict(float)
    codes: defaultdict[str, Counter] = defaultdict(Counter)
    for part in [_counts(), *_FROM_WORKERS]:
        cases.update(part["cases"])
        for command, s in part["seconds"].items():
            seconds[command] += s
        for command, by_code in part["codes"].items():
            codes[command].update({int(code): n for code, n in by_code.items()})
    if not cases:
        return
    terminalreporter.section("opforge bad-input contract: generated cases per command")
    for command in sorted(cases):
        by_code = ", ".join(f"exit {code}: {n}" for code, n in sorted(codes[command].items()))
        terminalreporter.write_line(f"{command:8s} {cases[command]:5d} cases "
                                    f"{seconds[command]:7.1f} s in opforge ({by_code})")
    terminalreporter.write_line(f"{'total':8s} {sum(cases.values()):5d} cases "
                                f"{sum(seconds.values()):7.1f} s in opforge")
