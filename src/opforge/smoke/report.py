"""The probe's JSON document as a terminal table, JUnit XML, a GitHub step summary, an exit code."""

from __future__ import annotations

import os
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from opforge.files import write_atomic
from opforge.smoke.probe import checks

CELL = {  # census cell status -> (terminal text, style, markdown)
    "ok": ("ok", "green", "✅"),
    "missing": ("MISSING", "bold red", "❌ MISSING"),
    "present": ("+", "cyan", "+"),
    "absent": ("·", "dim", "·"),
}
STATUS_STYLE = {"pass": "green", "fail": "bold red", "warn": "yellow", "skip": "dim"}


def exit_code(doc: dict) -> int:
    return 1 if any(c["status"] == "fail" for c in doc.get("checks", [])) else 0


def counts(doc: dict) -> dict[str, int]:
    out = {s: 0 for s in ("pass", "fail", "warn", "skip")}
    for c in doc.get("checks", []):
        out[c["status"]] += 1
    return out


def headline(doc: dict) -> str:
    n = counts(doc)
    verdict = "FAIL" if n["fail"] else "PASS"
    skipped = sum(1 for c in doc.get("checks", []) if c.get("reason") == "no-device")
    return (f"{verdict} {doc.get('package')} ({doc.get('namespace')}): {n['pass']} passed, "
            f"{n['fail']} failed, {n['warn']} warnings, {n['skip']} skipped "
            f"({skipped} skipped-no-device)")


# --------------------------------------------------------------------------- causes


def unexplained(doc: dict) -> list[dict]:
    """Failures and warnings no cause explains (a cause's symptoms are shown under it)."""
    return [c for c in doc.get("checks", []) if c["status"] in ("fail", "warn")
            and c["category"] != "cause" and not c.get("explained_by_cause")]


def _explains(doc: dict, cause: dict) -> str | None:
    """The symptoms a cause explains, counted by kind, in one line."""
    ids = set(cause.get("explains") or [])
    if not ids:
        return None
    by_kind: dict[str, int] = {}
    ops = set()
    for c in doc.get("checks", []):
        if c["id"] in ids:
            by_kind[c["category"]] = by_kind.get(c["category"], 0) + 1
            if c.get("op"):
                ops.add(c["op"])
    kinds = ", ".join(f"{n} {k}" for k, n in by_kind.items())
    return (f"explains {len(ids)} failed check{'s' if len(ids) > 1 else ''} ({kinds}"
            + (f"; ops {', '.join(sorted(ops)[:6])}{' ...' if len(ops) > 6 else ''}" if ops
               else "") + "), not repeated below")


SHOWN_EVIDENCE = 3  # a cause reads in five lines: title, evidence, fix


def cause_lines(doc: dict) -> list[Text]:
    """Each cause as a block: status and title, evidence, fix, what it explains."""
    lines = []
    for cause in doc.get("causes") or []:
        style = STATUS_STYLE.get(cause["status"], "bold red")
        label = cause["class"].replace("_", " ")
        lines.append(Text(f"{cause['status'].upper()} {label}: ", style=style)
                     + Text(cause["title"], style="bold"))
        evidence = cause.get("evidence") or []
        for i, item in enumerate(evidence[:SHOWN_EVIDENCE]):
            more = len(evidence) - SHOWN_EVIDENCE
            tail = f" (+{more} more in the JSON report)" if i == SHOWN_EVIDENCE - 1 and more > 0 else ""
            lines.append(Text(f"  {item}{tail}"))
        lines.append(Text("  fix: ", style="cyan") + Text(cause["fix"]))
        explains = _explains(doc, cause)
        if explains:
            lines.append(Text(f"  {explains}", style="dim"))
    return lines


# --------------------------------------------------------------------------- terminal


SKIP_LABEL = {"no-device": "no device", "no-kernel": "no kernel", "import-failed": "not run",
              "disabled": "disabled",
              "no-recipe": "census only", "by-design": "by design",
              "stub-rejected": "not run"}


def run_categories() -> dict[str, str | None]:
    """The op checks of the probe's check table, each with its column (``device`` or None)."""
    return {check.name: check.column for check in checks.CHECKS}


def _run_column(check: dict, columns: dict[str, str | None]) -> str:
    """Forward and backward on a device share its column; every other check has one column."""
    cat = check["category"]
    if columns.get(cat) == "device":
        return check.get("device") or "run"
    return cat


def _cell(checks: list[dict]) -> Text:
    statuses = {c["status"] for c in checks}
    if "fail" in statuses:
        bad = [c.get("device") or c["category"] for c in checks if c["status"] == "fail"]
        detail = ",".join(sorted({b for b in bad if b})) if checks[0]["category"] == "autocast" else ""
        return Text("FAIL" + (f" {detail}" if detail else ""), style=STATUS_STYLE["fail"])
    if any(c.get("reason") == "stub-rejected" and c["status"] == "warn" for c in checks):
        return Text("stub refused", style=STATUS_STYLE["warn"])  # the op refused made-up inputs
    if any(c.get("reason") == "stub-crashed" and c["status"] == "warn" for c in checks):
        return Text("stub crashed", style=STATUS_STYLE["warn"])  # made-up inputs killed it
    passed = [c for c in checks if c["status"] in ("pass", "warn")]
    if passed:
        if checks[0]["category"] == "autocast":
            return Text("ok " + ",".join(c.get("device", "") for c in passed), style="green")
        grad = any(c["category"] == "backward" for c in passed)
        return Text("ok+grad" if grad else "ok", style="green")
    reasons = {c.get("reason") for c in checks}
    return Text(SKIP_LABEL.get(reasons.pop(), "skip") if len(reasons) == 1 else "skip", style="dim")


def render_terminal(doc: dict, console: Console | None = None) -> None:
    # CI logs are not terminals but are wide: do not squeeze the tables to 80 columns
    console = console or Console(highlight=False, width=None if sys.stdout.isatty() else 160)
    _print_header(doc, console)
    for line in cause_lines(doc):
        console.print(line)

    census = doc.get("census", {})
    if census.get("ops"):
        keys = census["keys"]
        expected = set(doc.get("expected_keys") or [])
        table = Table(title="kernel census (* promised by the variant; ok = promised and "
                            "registered, MISSING = promised but absent, + = registered, "
                            "· = neither)", title_justify="left", box=box.SIMPLE_HEAD)
        table.add_column("op", no_wrap=True)
        for key in keys:
            label = key.replace("Autocast", "Autocast\n") + ("*" if key in expected else "")
            table.add_column(label, justify="center", no_wrap=True)
        for row in census["ops"]:
            name = row["op"] if row.get("found", True) else f"{row['op']} (none)"
            cells = []
            for key in keys:
                status = row["keys"].get(key, {}).get("status", "absent")
                text, style, _ = CELL[status]
                cells.append(Text(text, style=style))
            table.add_row(Text(name, style="bold red" if not row.get("found", True) else ""), *cells)
        console.print(table)
    if doc.get("modules"):
        console.print(modules_table(doc))

    _print_runs(doc, console)

    for c in unexplained(doc):
        style = STATUS_STYLE[c["status"]]
        console.print(Text(f"{c['status'].upper()} {c['id']}: ", style=style) + Text(c["message"]))
    n = counts(doc)
    console.print(Text(headline(doc), style="bold red" if n["fail"] else "bold green"))


def _print_header(doc: dict, console: Console) -> None:
    """Who was probed where: package, torch, the build's torch, devices, the environment."""
    env = doc.get("environment", {})
    build = doc.get("build", {})
    runner = doc.get("runner", {})
    devices = doc.get("devices", {})
    variant = f" · variant {doc['variant']}" if doc.get("variant") else ""
    if doc.get("variant_source"):
        variant += f" (from {doc['variant_source']})"
    console.print(f"[bold]opforge smoke[/] {doc.get('package')} · namespace "
                  f"{doc.get('namespace')}{variant}")
    if env.get("torch_version"):
        console.print(f"  torch {env['torch_version']} ({(env.get('torch_git_version') or '')[:12]})"
                      f" · python {env.get('python')} · {env.get('executable')}")
    if build.get("built_against_torch") or build.get("distribution"):
        console.print(f"  {build.get('distribution') or doc.get('package')} "
                      f"{build.get('distribution_version') or ''} built against torch "
                      f"{build.get('built_against_torch') or 'unknown'}"
                      f" ({build.get('source') or 'no build info, no exact torch pin'})")
    if devices:
        parts = []
        for dev, entry in devices.items():
            parts.append(f"{dev}: {'present' if entry.get('present') else 'absent'}")
        console.print("  devices: " + ", ".join(parts))
    if runner.get("installs"):
        timing = ", ".join(f"{k} {v}s" for k, v in runner.items() if k.endswith("_s"))
        console.print(f"  env: {runner.get('env_dir') or runner.get('python')} ({timing})")


def _print_runs(doc: dict, console: Console) -> None:
    """The runs table (op x device and check) and the ops only the census saw."""
    grid: dict[str, dict[str, list[dict]]] = {}
    census_only = []
    columns = run_categories()
    for c in doc.get("checks", []):
        if c["category"] in columns and c.get("op"):
            if c.get("reason") == "no-recipe":
                census_only.append(c["op"])
                continue
            if c.get("reason") == "stub":
                continue  # a note on the recipe, not a run: its op's runs fill the row
            grid.setdefault(c["op"], {}).setdefault(_run_column(c, columns), []).append(c)
    if grid:
        cols = list(dict.fromkeys(col for cells in grid.values() for col in cells))
        table = Table(title="runs (device columns: forward, +grad = backward too; compared with "
                            "CPU)", title_justify="left", box=box.SIMPLE_HEAD)
        table.add_column("op", no_wrap=True)
        for col in cols:
            table.add_column(col, justify="center", no_wrap=True)
        for op, cells in grid.items():
            table.add_row(op, *[_cell(cells[col]) if col in cells else Text("–", style="dim")
                                for col in cols])
        console.print(table)
    if census_only:
        console.print(f"  census only (no recipe says how to call it): {', '.join(census_only)}")


def modules_table(doc: dict) -> Table:
    """The compiled modules the variant promises, one row each: module x function."""
    rows = doc["modules"]
    functions = list(dict.fromkeys(f for row in rows for f in row.get("functions", {})))
    table = Table(title="module census (each imported, or loaded with torch.ops.load_library, "
                        "on its own; ok = exported / registered, MISSING = promised but absent)",
                  title_justify="left", box=box.SIMPLE_HEAD)
    table.add_column("module", no_wrap=True)
    table.add_column("backend", no_wrap=True)
    for fn in functions:
        table.add_column(fn, justify="center", no_wrap=True)
    for row in rows:
        name = row["module"] + (" (library)" if row.get("load") == "library" else "")
        cells = [Text(*{"ok": ("ok", "green"), "missing": ("MISSING", "bold red")}.get(
            row.get("functions", {}).get(fn), ("·", "dim"))) for fn in functions]
        table.add_row(Text(name, style="" if row.get("imported") else "bold red"),
                      row.get("backend", "cpu"), *cells)
    return table


# --------------------------------------------------------------------------- JUnit


def write_junit(doc: dict, path: Path) -> None:
    n = counts(doc)
    suite = ET.Element("testsuite", name=f"opforge smoke {doc.get('package')}",
                       tests=str(len(doc.get("checks", []))), failures=str(n["fail"]),
                       errors="0", skipped=str(n["skip"]),
                       time=str((doc.get("summary") or {}).get("duration_s", 0)))
    for c in doc.get("checks", []):
        case = ET.SubElement(suite, "testcase", classname=f"smoke.{c['category']}", name=c["id"])
        if c["status"] == "fail":
            ET.SubElement(case, "failure", message=c["message"]).text = c["message"]
        elif c["status"] == "skip":
            ET.SubElement(case, "skipped", message=c["message"])
        elif c["status"] == "warn":
            ET.SubElement(case, "system-out").text = "WARNING: " + c["message"]
    root = ET.Element("testsuites")
    root.append(suite)
    ET.indent(root)
    write_atomic(path, ET.tostring(root, encoding="utf-8", xml_declaration=True))


# --------------------------------------------------------------------------- GitHub


def step_summary(doc: dict) -> str:
    variant = f" (variant {doc['variant']})" if doc.get("variant") else ""
    lines = [f"### opforge smoke: {doc.get('package')}{variant}", "", f"**{headline(doc)}**", ""]
    for cause in doc.get("causes") or []:
        lines.append(f"**{cause['status'].upper()} {cause['class'].replace('_', ' ')}**: "
                     f"{cause['title']}")
        lines += [f"- {item}" for item in cause.get("evidence") or []]
        lines.append(f"- fix: {cause['fix']}")
        explains = _explains(doc, cause)
        lines += [f"- {explains}", ""] if explains else [""]
    env = doc.get("environment", {})
    if env.get("torch_version"):
        build = doc.get("build", {})
        lines += [f"torch `{env['torch_version']}`, built against "
                  f"`{build.get('built_against_torch') or 'unknown'}`; devices: "
                  + ", ".join(f"{d} {'present' if e.get('present') else 'absent'}"
                              for d, e in doc.get("devices", {}).items()), ""]
    census = doc.get("census", {})
    if census.get("ops"):
        keys = census["keys"]
        promised = set(doc.get("expected_keys") or [])
        lines.append("| op | " + " | ".join(k + ("*" if k in promised else "") for k in keys)
                     + " |")
        lines.append("|---" * (len(keys) + 1) + "|")
        for row in census["ops"]:
            cells = [CELL[row["keys"].get(k, {}).get("status", "absent")][2] for k in keys]
            lines.append(f"| `{row['op']}` | " + " | ".join(cells) + " |")
        lines += ["", "\\* promised by the variant", ""]
    for c in unexplained(doc):
        lines.append(f"- **{c['status']}** `{c['id']}`: {c['message']}")
    return "\n".join(lines) + "\n"


def _escape(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def annotations(doc: dict) -> list[str]:
    """One per cause and per failure or warning no cause explains (as the terminal shows)."""
    out = []
    causes = [c for c in doc.get("checks", []) if c["category"] == "cause"]
    for c in causes + unexplained(doc):
        if c["status"] in ("fail", "warn"):
            level = "error" if c["status"] == "fail" else "warning"
            title = _escape(f"opforge smoke {doc.get('package')}: {c['id']}").replace(",", "%2C") \
                .replace(":", "%3A")
            out.append(f"::{level} title={title}::{_escape(c['message'])}")
    return out


def publish_github(doc: dict, environ: dict | None = None, print_fn=print) -> None:
    environ = os.environ if environ is None else environ
    summary = environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        with open(summary, "a", encoding="utf-8") as fh:
            fh.write(step_summary(doc))
    if environ.get("GITHUB_ACTIONS") == "true":
        for line in annotations(doc):
            print_fn(line)
