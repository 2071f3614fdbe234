"""The progress display while a bisect runs, and its final report (rich, JSON, Markdown)."""

from __future__ import annotations

import contextlib
import json
import sys

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from opforge.errors import OpforgeError
from opforge.files import write_atomic

from .commits import CommitRange
from .index import Nightly
from .params import reproduce_command, rerun_command
from .search import Outcome
from .session import Outcomes
from .state import StepRecord

_STYLE = {Outcome.GOOD: "green", Outcome.BAD: "red", Outcome.SKIP: "yellow"}


class Display:
    """Progress on stderr: which nightly, what step, roughly how many probes are left."""

    def __init__(self, console: Console | None = None):
        self.console = console or Console(stderr=True, highlight=False)
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(bar_width=20),
                                 TextColumn("{task.fields[count]}"), TimeElapsedColumn(),
                                 console=self.console, transient=True)
        self.task = self.progress.add_task("resolving the endpoints", total=None, count="")
        self.probes = 0
        self.remaining = 0

    def __enter__(self) -> Display:
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def _update(self, text: str) -> None:
        count = f"{self.probes} done" + (f", ~{self.remaining} left" if self.remaining else "")
        self.progress.update(self.task, description=text, count=count,
                             total=self.probes + self.remaining or None, completed=self.probes)

    @contextlib.contextmanager
    def paused(self):
        """No live redraws while something else owns the terminal's file descriptors."""
        self.progress.stop()
        try:
            yield
        finally:
            self.progress.start()

    def note(self, text: str) -> None:
        self.console.print(f"[bold]bisect:[/] {escape(text)}")

    def left(self, remaining: int) -> None:
        self.remaining = remaining

    def start(self, nightly: Nightly) -> None:
        self._update(f"{nightly.day}: preparing the environment")

    def step(self, nightly: Nightly, what: str) -> None:
        self._update(f"{nightly.day}: {what}")

    def done(self, record: StepRecord) -> None:
        self.probes += 1
        self.remaining = max(0, self.remaining - 1)
        env = "cached env" if record.reused_env else "new env"
        self.console.print(
            f"  {record.nightly.day}  {escape(record.nightly.version):<28} "
            f"[{_STYLE[record.outcome]}]{record.outcome.value:<4}[/]  {escape(record.reason)}"
            f"  [dim]({record.duration_s:.2f} s, {env})[/]")
        self._update("")


def result_json(out: Outcomes, commits: CommitRange, python: str) -> dict:
    def end(record: StepRecord) -> dict:
        return {**record.nightly.to_json(), "sha256": record.sha256,
                "commit": record.git_version, "outcome": record.outcome.value,
                "reason": record.reason}

    return {
        "schema": 1,
        "status": "found",
        "exact": not out.skipped,
        "notes": list(out.params.notes),
        "last_good": end(out.last_good),
        "first_bad": end(out.first_bad),
        "skipped": [end(r) for r in out.skipped],
        "candidates": out.candidates,
        "probes": out.probes,
        "max_probes_without_skips": (out.candidates - 1).bit_length() + 2,
        "walked_back": out.walked_back,
        "regress": out.params.regress,
        "commits": commits.to_json(),
        "reproduce": reproduce_command(out.params, out.first_bad.nightly, python),
        "rerun": rerun_command(out.params, out.last_good.nightly, out.first_bad.nightly),
    }


def _headline(data: dict) -> str:
    good, bad = data["last_good"], data["first_bad"]
    verb = "started to pass" if data["regress"] == "success" else "regressed"
    if data["exact"]:
        return f"it {verb} in the nightly of {bad['date']} (the {good['date']} nightly is good)"
    skipped = ", ".join(s["date"] for s in data["skipped"])
    return (f"it {verb} between {good['date']} (good) and {bad['date']} (bad); the nightlies in "
            f"between could not be tested ({skipped}), so the first bad one is any of them "
            f"or {bad['date']}")


def print_rich(data: dict, console: Console) -> None:
    console.print(f"[bold]opforge bisect:[/] {escape(_headline(data))}")
    table = Table(show_header=True, header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for column in ("", "date", "version", "nightly commit", "main commit"):  # commits: 12 hex
        table.add_column(column, no_wrap=True)
    c = data["commits"]
    rows = [("last good", data["last_good"], c["good_main_commit"]),
            *[("skipped", s, None) for s in data["skipped"]],
            ("first bad", data["first_bad"], c["bad_main_commit"])]
    for label, end, main in rows:
        table.add_row(label, end["date"], end["version"], (end["commit"] or "?")[:12],
                      (main or "")[:12])
    console.print(table)
    console.print(f"{data['probes']} nightlies tested for a range of {data['candidates']} "
                  f"(at most {data['max_probes_without_skips']} when nothing is skipped)")
    if c["commits"]:
        console.print(f"[bold]{len(c['commits'])} first-parent commits on main[/] "
                      f"({c['good_main_commit'][:12]}..{c['bad_main_commit'][:12]}):")
        for commit in c["commits"][:40]:
            console.print(f"  {commit['sha'][:12]} {escape(commit['subject'])}")
        if len(c["commits"]) > 40:
            console.print(f"  ... and {len(c['commits']) - 40} more (see --json)")
    if c["note"]:
        console.print(f"[yellow]commits:[/] {escape(c['note'])}")
    if c["compare_url"]:
        console.print(f"compare: {c['compare_url']}")
    console.print("[bold]reproduce with:[/]")
    console.print(escape(data["reproduce"]), soft_wrap=True)
    console.print(f"[bold]rerun the bisect:[/] {escape(data['rerun'])}", soft_wrap=True)


def markdown(data: dict) -> str:
    c = data["commits"]
    lines = [f"### opforge bisect: {_headline(data)}", "",
             "| | date | version | nightly commit | main commit |", "|---|---|---|---|---|"]
    for label, end, main in (("last good", data["last_good"], c["good_main_commit"]),
                             *[("skipped", s, None) for s in data["skipped"]],
                             ("first bad", data["first_bad"], c["bad_main_commit"])):
        lines.append(f"| {label} | {end['date']} | `{end['version']}` | "
                     f"`{(end['commit'] or '?')[:12]}` | {f'`{main[:12]}`' if main else ''} |")
    lines += ["", f"{data['probes']} nightlies tested for a range of {data['candidates']}."]
    if c["compare_url"]:
        lines += ["", f"Compare: {c['compare_url']}"]
    if c["commits"]:
        lines += ["", f"<details><summary>{len(c['commits'])} commits on main</summary>", ""]
        lines += [f"- `{x['sha'][:12]}` {x['subject']}" for x in c["commits"]]
        lines += ["", "</details>"]
    lines += ["", "Reproduce with:", "", "```sh", data["reproduce"], "```", ""]
    return "\n".join(lines)


def emit(data: dict, *, json_to: str | None, markdown_to: str | None) -> None:
    """Rich to the terminal unless --json/--markdown go to stdout; files get written as asked."""
    to_stdout = json_to == "-" or markdown_to == "-"
    if json_to:
        _write(json_to, json.dumps(data, indent=2) + "\n")
    if markdown_to:
        _write(markdown_to, markdown(data))
    print_rich(data, Console(stderr=to_stdout, highlight=False, soft_wrap=True))


def emit_error(message: str, steps: list[StepRecord], *, json_to: str | None,
               markdown_to: str | None) -> None:
    """The report of a bisect that stopped (bad endpoints, an abort): what was tested."""
    tested = [{**r.nightly.to_json(), "commit": r.git_version, "outcome": r.outcome.value,
               "reason": r.reason} for r in sorted(steps, key=lambda r: r.nightly.date)]
    if json_to:
        _write(json_to, json.dumps({"schema": 1, "status": "error", "error": message,
                                    "tested": tested}, indent=2) + "\n")
    if markdown_to:
        lines = [f"### opforge bisect stopped: {message}", ""]
        if tested:
            lines += ["| date | version | outcome | reason |", "|---|---|---|---|"]
            lines += [f"| {t['date']} | `{t['version']}` | {t['outcome']} | {t['reason']} |"
                      for t in tested]
        _write(markdown_to, "\n".join(lines) + "\n")


def _write(target: str, text: str) -> None:
    if target == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    try:
        write_atomic(target, text)
    except OSError as exc:
        raise OpforgeError(f"cannot write the report to {target}: {exc.strerror or exc}") from None
