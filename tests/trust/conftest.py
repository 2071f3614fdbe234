"""After the session: the trust corpus's table, printed and written to build/trust/report.md
(and report.json), from what the tests of this directory recorded."""

from __future__ import annotations

import json

import corpus


def pytest_terminal_summary(terminalreporter):
    if not corpus.REPORT:
        return
    table = corpus.render_table(corpus.REPORT)
    out = corpus.ROOT / "build" / "trust"
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text(table + "\n")
    (out / "report.json").write_text(json.dumps(corpus.REPORT, indent=2) + "\n")
    terminalreporter.write_sep("=", "trust corpus (build/trust/report.md)")
    terminalreporter.write_line(table)
