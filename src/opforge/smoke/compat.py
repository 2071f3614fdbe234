"""The torch compat matrix of a stable-ABI wheel: the one wheel beside each torch of a list.

Each torch gets its own fresh environment (torch from the index, the wheel ``--no-deps``), a
full smoke probe (census and op runs), and one row of the table wheel x torch. A library
that fails to load on one torch because it calls a shim function that torch lacks is
diagnosed by the symbol and the first torch release that ships it (torch's own version table,
through ``opforge.abi``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table
from rich.text import Text

from opforge import abi
from opforge.errors import OpforgeError
from opforge.smoke import report
from opforge.smoke.runner import (
    ProbeRequest,
    Target,
    add_check,
    cleanup,
    prepare_environment,
    run_probe,
)

# the list's words that are not a release: the newest release / the newest nightly (a
# specifier naming a pre-release lets pip and uv take one)
UNPINNED = {"latest": "torch", "nightly": "torch>=0.0.0.dev0"}


@dataclass
class Row:
    torch: str            # as listed: 2.10.0, latest, nightly
    installed: str | None
    doc: dict

    @property
    def status(self) -> str:
        if report.exit_code(self.doc):
            return "fail"
        return "skip" if skipped_whole(self.doc) else "pass"


def skipped_whole(doc: dict) -> bool:
    """Nothing was tested beside this torch: no check, or every check skipped."""
    return all(c.get("status") == "skip" for c in doc.get("checks", []))


def torch_spec(entry: str) -> str:
    return UNPINNED.get(entry, f"torch=={entry}")


def diagnose(doc: dict) -> None:
    """Name the first torch that has the missing shim function of a load failure."""
    libraries = (doc.get("import") or {}).get("libraries") or []
    for lib in libraries:
        found = re.search(r"undefined symbol: (\S+)|Symbol not found: (\S+)", lib.get("error") or "")
        if not found:
            continue
        # Mach-O prints its symbols with one extra leading underscore
        symbol = found.group(1) or found.group(2).removeprefix("_")
        symbol = symbol.rstrip(",")
        first = abi.shim_version(symbol)
        if first:
            add_check(doc, f"shim-{symbol}", "fail",
                      f"{lib['path'].rsplit('/', 1)[-1]} calls stable shim function {symbol}, "
                      f"which first shipped in torch {first}; torch "
                      f"{(doc.get('environment') or {}).get('torch_version') or '?'} lacks it. "
                      f"The wheel's floor must be at least {first}.", category="import")


def unreachable(entry: str, index: str | None, error: str) -> dict:
    """The row of a nightly the index does not serve here: skipped, with the reason."""
    return {"package": None, "checks": [{
        "id": "install", "category": "environment", "status": "skip", "reason": "unreachable",
        "message": f"torch {entry} could not be installed from {index or 'the default index'} "
                   f"(skipped: the nightly is tested where its index is reachable): {error}"}]}


def run_compat(target: Target, request: ProbeRequest, torches: list[str],
               keep_env: bool = False, log=print, nightly_index: str | None = None,
               choose=None) -> list[Row]:
    """The smoke once per torch; ``choose(env, request)`` (when given) returns the request for
    that environment, e.g. with the promises of the variant its installed build record names."""
    rows = []
    for entry in torches:
        spec = torch_spec(entry)
        index = nightly_index if entry == "nightly" and nightly_index else target.torch_index
        one = Target(wheel=target.wheel, requirement=target.requirement, torch_spec=spec,
                     torch_index=index)
        log(f"opforge smoke --compat: {one.describe()}")
        try:
            env = prepare_environment(one)
        except OpforgeError as exc:
            if entry != "nightly":
                raise
            rows.append(Row(torch=entry, installed=None, doc=unreachable(entry, index, str(exc))))
            continue
        try:
            doc = run_probe(env, choose(env, request) if choose else request)
        finally:
            cleanup(env, keep=keep_env)
        diagnose(doc)
        rows.append(Row(torch=entry, installed=env.torch_installed, doc=doc))
    return rows


def combined(rows: list[Row], wheel: str) -> dict:
    """One document for JUnit / JSON / the step summary: every torch's checks, prefixed."""
    first = rows[0].doc if rows else {}
    doc = {"package": first.get("package"), "namespace": first.get("namespace"),
           "compat": [{"torch": r.torch, "installed": r.installed, "status": r.status,
                       "document": r.doc} for r in rows],
           "wheel": wheel, "checks": []}
    for r in rows:
        label = r.installed or r.torch
        for check in r.doc.get("checks", []):
            doc["checks"].append({**check, "id": f"torch-{label}/{check['id']}"})
    doc["summary"] = {"duration_s": round(sum((r.doc.get("summary") or {}).get("duration_s", 0)
                                              for r in rows), 3)}
    if all(r.status == "skip" for r in rows):  # also: no torch at all
        skipped = ", ".join(r.torch for r in rows) or "none given"
        doc["checks"].append({
            "id": "compat", "category": "environment", "status": "fail",
            "reason": "nothing tested",
            "message": f"every torch was skipped ({skipped}): nothing was tested, so the compat "
                       "run cannot pass; run it where those torches can be installed"})
    return doc


def render(rows: list[Row], wheel: str, console: Console | None = None) -> None:
    console = console or Console(width=200)
    for r in rows:
        report.render_terminal(r.doc, console=console)
    table = Table(title=f"torch compat: {wheel}")
    for column in ("torch", "installed", "result", "checks", "first failure"):
        table.add_column(column)
    for r in rows:
        n = report.counts(r.doc)
        fails = [c for c in r.doc.get("checks", []) if c["status"] == "fail"]
        # a named missing shim function explains more than the import failure it caused
        fails.sort(key=lambda c: not c["id"].startswith("shim-"))
        table.add_row(r.torch, r.installed or "-",
                      Text(r.status.upper(), style={"pass": "green", "skip": "yellow"}.get(
                          r.status, "bold red")),
                      f"{n['pass']} passed, {n['fail']} failed, {n['skip']} skipped",
                      Text(fails[0]["message"][:160] if fails else "-"))
    console.print(table)
