"""``opforge bench``'s document as a terminal table, a Markdown summary with an SVG speed-up
chart per op, and an exit code. The SVG is written here (bars on a log scale, 1x marked):
nothing to install for one chart."""

from __future__ import annotations

import base64
import math
import sys
from collections import Counter
from html import escape

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from opforge.smoke.probe.speed import seconds

STATUS_STYLE = {"pass": "", "fail": "bold red", "skip": "dim"}


def exit_code(doc: dict) -> int:
    bad = doc.get("probe_error") or any(c.get("status") == "fail" for c in doc.get("checks", []))
    bad = bad or any(r.get("status") == "fail" for r in doc.get("rows", []))
    # compared with a baseline that shares no row with this run: nothing was protected
    bad = bad or (doc.get("baseline") or {}).get("nothing_compared")
    return 1 if bad or nothing_timed(doc) else 0


def nothing_timed(doc: dict) -> str | None:
    """Why a run that failed nothing timed nothing (None when it timed a row, or failed one:
    that failure says why). A bench that timed nothing protected nothing: never a pass."""
    rows = doc.get("rows", [])
    if doc.get("probe_error") or any(c.get("status") == "fail" for c in doc.get("checks", [])) \
            or any("ours_s" in r or r.get("status") == "fail" for r in rows):
        return None
    if not rows:
        return ("nothing was timed: no workload was selected (the recipes file gives these "
                "ops no `workloads`, or --ops / --workloads matched none)")
    reasons = Counter(r.get("message") or r.get("reason") or "skipped" for r in rows)
    return "nothing was timed: " + "; ".join(
        f"{n} row{'s' if n > 1 else ''} skipped: {why}" for why, n in reasons.most_common(3))


def _label(row: dict) -> str:
    label = f"{row.get('workload', '')} {'fwd+bwd' if row.get('direction') == 'backward' else 'fwd'}"
    return label + (f" @{row['threads']}t" if row.get("threads") else "")


def _cost(row: dict) -> str:
    """A row's thread cost (its time over the first thread count's) and its time against the
    workload's plain op, where measured."""
    parts = []
    if "thread_cost" in row:
        parts.append(f"{row['threads']}t/{row.get('thread_cost_of', '?')}t "
                     f"{row['thread_cost']:.2f}")
    if "vs_plain" in row:
        parts.append(f"{row['vs_plain']:.2f}x {row.get('plain', 'plain')}")
    return ", ".join(parts)


def headline(doc: dict) -> str:
    rows = doc.get("rows", [])
    n = {s: sum(1 for r in rows if r.get("status") == s) for s in ("pass", "fail", "skip")}
    verdict = "FAIL" if exit_code(doc) else "PASS"
    line = (f"{verdict} opforge bench {doc.get('package')}: {n['pass']} timed, {n['fail']} "
            f"failed, {n['skip']} skipped on {', '.join(doc.get('devices') or ['?'])}")
    return line + (f": {nothing_timed(doc)}" if nothing_timed(doc) else "")


def why_failed(doc: dict) -> str:
    """A failed run's reason in a few words: its failed rows, or why nothing counted."""
    failed = [f"{r.get('op')}/{r.get('workload')}/{r.get('direction')}/{r.get('device')}"
              for r in doc.get("rows", []) if r.get("status") == "fail"]
    if failed:
        return (f"{len(failed)} row{'s' if len(failed) > 1 else ''} failed "
                f"({', '.join(failed[:3])}{', ...' if len(failed) > 3 else ''})")
    if (doc.get("baseline") or {}).get("nothing_compared"):
        return f"nothing was compared with {doc['baseline']['name']}"
    checks = [c for c in doc.get("checks", []) if c.get("status") == "fail"]
    if checks:
        return checks[0].get("message") or "a check failed"
    return nothing_timed(doc) or "the benchmark itself failed"


def _speed(row: dict) -> Text | str:
    if "speedup" in row:
        return Text(f"{row['speedup']:.2f}x", style="green" if row["speedup"] >= 1 else "yellow")
    return "alone" if row.get("alone") else ""


def render_terminal(doc: dict, console: Console | None = None) -> None:
    console = console or Console(highlight=False, width=None if sys.stdout.isatty() else 160)
    env = doc.get("environment") or {}
    console.print(f"[bold]opforge bench[/] {doc.get('package')} · torch "
                  f"{env.get('torch_version', '?')} · {_threads_line(env)}")
    table = Table(title="speed-up = reference time / ours (median of paired, alternating "
                        "rounds); noise = ours timed against itself", title_justify="left",
                  box=box.SIMPLE_HEAD)
    for name, justify in (("op", "left"), ("workload", "left"), ("device", "left"),
                          ("reference", "left"), ("ours", "right"), ("reference time", "right"),
                          ("speed-up", "right"), ("noise", "right"), ("threads / plain", "right"),
                          ("vs baseline", "right"), ("status", "left")):
        table.add_column(name, justify=justify, no_wrap=name != "status")
    for row in doc.get("rows", []):
        timed = "ours_s" in row
        table.add_row(
            row.get("op", ""), _label(row), row.get("device", ""), str(row.get("reference", "")),
            seconds(row["ours_s"]) if timed else "",
            seconds(row["reference_s"]) if "reference_s" in row else "", _speed(row),
            f"±{row['noise'] * 100:.0f}%" if timed else "",
            _cost(row), _change(row),
            Text("ok" if row.get("status") == "pass" else f"{row.get('status')}: "
                 f"{row.get('message', '')}",
                 style=STATUS_STYLE.get(row.get("status"), "")))
    console.print(table)
    if baseline_line(doc):  # one line however long its path: logs are read with grep
        console.print(Text(baseline_line(doc)), soft_wrap=True)
    for row in doc.get("rows", []):
        if row.get("warning") and row.get("status") != "fail":  # a side moved, not ours alone
            console.print(Text(f"WARN {row.get('op')} {_label(row)} on {row.get('device', '?')}"
                               f": {row['warning']}", style="yellow"), soft_wrap=True)
    for row in doc.get("rows", []):
        if row.get("status") == "fail":  # op and factor, whatever the table's width
            console.print(Text(f"FAIL {row.get('op')} {_label(row)} on {row.get('device', '?')}"
                               f": {row.get('message', '')}", style="bold red"), soft_wrap=True)
    for c in doc.get("checks", []):
        if c.get("status") == "fail":
            console.print(Text(f"FAIL {c['id']}: {c['message']}", style="bold red"), soft_wrap=True)
    if doc.get("probe_error"):
        console.print(Text("the benchmark itself failed: "
                           + doc["probe_error"].strip().splitlines()[-1], style="bold red"))
    console.print(Text(headline(doc), style="bold red" if exit_code(doc) else "bold green"))


def _threads_line(env: dict) -> str:
    counts = env.get("thread_counts")
    line = (f"CPU rows at {','.join(map(str, counts))} threads" if counts
            else f"{env.get('threads', '?')} threads")
    return line + (" · contended (busy processes on every core)" if env.get("contended") else "")


def _change(row: dict) -> str:
    base = row.get("baseline")
    if not base:
        return ""
    # our speed against the baseline's (0.50x: half as fast); WARN: a side moved, not ours
    return f"{base['change']:.2f}x of {base['name']}" + (" (warn)" if row.get("warning") else "")


def svg_chart(op: str, rows: list[dict]) -> str:
    """A horizontal bar per timed row: speed-up on a log2 axis, the 1x line marked."""
    timed = [r for r in rows if "speedup" in r]
    bar_h, gap, left, width, top = 18, 6, 190, 360, 28
    low = min([0.25] + [r["speedup"] for r in timed])
    high = max([4.0] + [r["speedup"] for r in timed])
    lo, hi = math.log2(low), math.log2(high)

    def x(value: float) -> float:
        return left + (math.log2(value) - lo) / (hi - lo) * width

    height = top + len(timed) * (bar_h + gap) + 24
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 70}" '
             f'height="{height}" font-family="sans-serif" font-size="12">',
             f'<text x="4" y="16" font-weight="bold">{escape(op)}: speed-up over the reference'
             '</text>']
    for i, row in enumerate(timed):
        y = top + i * (bar_h + gap)
        one, end = x(1.0), x(row["speedup"])
        colour = "#2e7d32" if row["speedup"] >= 1 else "#c62828"
        parts.append(f'<text x="{left - 6}" y="{y + 13}" text-anchor="end">'
                     f'{escape(_label(row))} · {escape(row.get("device", ""))}</text>')
        parts.append(f'<rect x="{min(one, end):.1f}" y="{y}" width="{abs(end - one):.1f}" '
                     f'height="{bar_h}" fill="{colour}"/>')
        parts.append(f'<text x="{max(one, end) + 4:.1f}" y="{y + 13}">'
                     f'{row["speedup"]:.2f}x</text>')
    axis_y = top + len(timed) * (bar_h + gap)
    parts.append(f'<line x1="{x(1.0):.1f}" y1="{top - 4}" x2="{x(1.0):.1f}" y2="{axis_y}" '
                 'stroke="#333" stroke-dasharray="3,2"/>')
    parts.append(f'<text x="{x(1.0):.1f}" y="{axis_y + 14}" text-anchor="middle">1x</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def markdown(doc: dict) -> str:
    """The job summary: headline, one table, one chart per op (an inline SVG image)."""
    env = doc.get("environment") or {}
    lines = [f"### opforge bench: {doc.get('package')}", "", f"**{headline(doc)}**", ""]
    if baseline_line(doc):
        lines += [baseline_line(doc), ""]
    if (doc.get("saved") or {}).get("line"):
        lines += [doc["saved"]["line"], ""]
    for row in doc.get("rows", []):
        if row.get("status") == "fail" and "baseline" in row:
            lines += [f"- ❌ `{row.get('op')}` {_label(row)} on {row.get('device')}: "
                      f"{escape(row.get('message', ''))}"]
        elif row.get("warning"):
            lines += [f"- ⚠️ `{row.get('op')}` {_label(row)} on {row.get('device')}: "
                      f"{escape(row['warning'])}"]
    if lines[-1].startswith("- "):
        lines.append("")
    lines += [
             f"torch `{env.get('torch_version', '?')}`, {_threads_line(env)}; speed-up = "
             "reference time / ours, the median of paired alternating rounds; noise = ours "
             "against itself.", "",
             "| op | workload | device | reference | ours | reference | speed-up | noise | "
             "threads / plain | vs baseline | |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for row in doc.get("rows", []):
        if "ours_s" in row:
            mark = "✅" if row.get("status") == "pass" else f"❌ {escape(row.get('message', ''))}"
            ref_s = seconds(row["reference_s"]) if "reference_s" in row else ""
            speed = f"**{row['speedup']:.2f}x**" if "speedup" in row else "alone"
            lines.append(f"| `{row['op']}` | {_label(row)} | {row['device']} | "
                         f"{row.get('reference', '')} | {seconds(row['ours_s'])} | "
                         f"{ref_s} | {speed} | "
                         f"±{row['noise'] * 100:.0f}% | {_cost(row)} | {_change(row)} | {mark} |")
        else:
            mark = "❌" if row.get("status") == "fail" else "·"
            lines.append(f"| `{row.get('op', '')}` | {_label(row)} | {row.get('device', '')} | "
                         f"{row.get('reference', '')} | | | | | | | {mark} "
                         f"{escape(row.get('message', ''))} |")
    lines.append("")
    ops = list(dict.fromkeys(r.get("op") for r in doc.get("rows", []) if "speedup" in r))
    for op in ops:
        svg = svg_chart(op, [r for r in doc["rows"] if r.get("op") == op])
        data = base64.b64encode(svg.encode()).decode()
        lines += [f"![{op} speed-up](data:image/svg+xml;base64,{data})", ""]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- baselines


def baseline_line(doc: dict) -> str | None:
    """What the run was compared with, for the summary (None: no comparison was asked)."""
    base = doc.get("baseline")
    if not isinstance(base, dict):
        return None
    if base.get("name") is None:
        return f"No baseline to compare with: {base.get('note', 'none given')}."
    if base.get("nothing_compared"):
        return (f"Nothing was compared with {base['name']}: none of its "
                f"{base.get('baseline_rows', 0)} rows matches a row timed now (op, workload, "
                "direction, device and reference must match): record a new baseline.")
    line = (f"Compared with {base['name']}: {base['rows_compared']} rows, {base['slower']} "
            f"slower by more than {base['threshold']:g}x beyond noise.")
    if base.get("warned"):
        line += (f" {base['warned']} rows warned: a side moved that is not ours alone (the "
                 "reference, or the machine).")
    if base.get("not_in_baseline"):
        line += f" {base['not_in_baseline']} timed rows are not in the baseline (not compared)."
    if base.get("machine"):
        line += f" Note: {base['machine']}."
    return line
