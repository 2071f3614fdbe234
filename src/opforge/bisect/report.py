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

from opforge import progress
from opforge.errors import OpforgeError
from opforge.files import write_atomic

from .commits import CommitRange
from .index import Nightly
from .params import reproduce_command, rerun_command
from .releases import order_key
from .search import Outcome
from .session import Level, Outcomes
from .speed import describe_boundary
from .state import StepRecord

_STYLE = {Outcome.GOOD: "green", Outcome.BAD: "red", Outcome.SKIP: "yellow"}


class Display:
    """Progress on stderr: which nightly, what step, roughly how many probes are left. A live
    line in a terminal; in a log (no terminal, or ``CI`` set) a plain line per step; nothing
    with ``-q``."""

    def __init__(self, console: Console | None = None):
        self.live = console is not None or progress.interactive(sys.stderr)
        self.console = console or Console(stderr=True, highlight=False,
                                          quiet=progress.quiet(),
                                          no_color=not self.live, soft_wrap=not self.live)
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(bar_width=20),
                                 TextColumn("{task.fields[count]}"), TimeElapsedColumn(),
                                 console=self.console, transient=True)
        self.task = self.progress.add_task("resolving the endpoints", total=None, count="")
        self.probes = 0
        self.remaining = 0
        self._said = ""

    def __enter__(self) -> Display:
        if self.live:
            self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.live:
            self.progress.stop()

    def count(self) -> str:
        return f"{self.probes} done" + (f", ~{self.remaining} left" if self.remaining else "")

    def _update(self, text: str) -> None:
        if not self.live:
            if text and text != self._said:  # a log: one plain line per step
                self._said = text
                self.console.print(f"bisect: {escape(text)} ({self.count()})")
            return
        self.progress.update(self.task, description=text, count=self.count(),
                             total=self.probes + self.remaining or None, completed=self.probes)

    @contextlib.contextmanager
    def paused(self):
        """No live redraws while something else owns the terminal's file descriptors."""
        if not self.live:
            yield
            return
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
        self._update(f"{nightly.key}: preparing the environment")

    def step(self, nightly: Nightly, what: str) -> None:
        self._update(f"{nightly.key}: {what}")

    def done(self, record: StepRecord) -> None:
        self.probes += 1
        self.remaining = max(0, self.remaining - 1)
        env = "cached env" if record.reused_env else "new env"
        where = "" if self.live else f", {self.count()}"
        self.console.print(
            f"  {record.nightly.key:<10}  {escape(record.nightly.version):<28} "
            f"[{_STYLE[record.outcome]}]{record.outcome.value:<4}[/]  {escape(record.reason)}"
            f"  [dim]({record.duration_s:.2f} s, {env}{where})[/]")
        self._update("")


def _end(record: StepRecord, envs=None, full: bool = False) -> dict:
    data = {**record.nightly.to_json(), "label": record.nightly.key, "sha256": record.sha256,
            "commit": record.git_version, "outcome": record.outcome.value,
            "reason": record.reason}
    data.setdefault("date", None)
    env = envs.cached(record.nightly) if envs is not None else None
    if env is not None:
        data["environment"] = {"torch": env.build, **({"packages": env.packages} if full else {})}
    return data


def _level_json(level: Level, envs) -> dict:
    return {"level": level.name, "last_good": _end(level.last_good, envs, True),
            "first_bad": _end(level.first_bad, envs, True),
            "skipped": [_end(r, envs) for r in level.skipped], "candidates": level.candidates}


def result_json(out: Outcomes, commits: CommitRange, python: str, envs=None,
                steps: list[StepRecord] | None = None) -> dict:
    """The report: each level's boundary, the deepest level's ends at the top (with their
    environments), every probe, the commits, and the commands that reproduce both ends."""
    levels = out.levels or [Level("nightly", out.last_good, out.first_bad, out.skipped,
                                  out.candidates)]
    return {
        "schema": 1,
        "status": "found",
        "exact": not out.skipped,
        "notes": list(out.params.notes),
        "level": levels[-1].name,
        "levels": [_level_json(level, envs) for level in levels],
        "level_notes": list(out.level_notes),
        "last_good": _end(out.last_good, envs, True),
        "first_bad": _end(out.first_bad, envs, True),
        "skipped": [_end(r, envs) for r in out.skipped],
        "candidates": out.candidates,
        "probes": out.probes,
        "max_probes_without_skips": (out.candidates - 1).bit_length() + 2,
        "walked_back": out.walked_back,
        "regress": out.params.regress,
        "tested": [_end(r, envs) for r in sorted(steps or [], key=lambda r: order_key(r.nightly))],
        "commits": commits.to_json(),
        "reproduce": reproduce_command(out.params, out.first_bad.nightly, python),
        "reproduce_good": reproduce_command(out.params, out.last_good.nightly, python),
        "rerun": rerun_command(out.params, out.levels[0].last_good.nightly if out.levels
                               else out.last_good.nightly,
                               out.levels[0].first_bad.nightly if out.levels
                               else out.first_bad.nightly),
    }


def _level_headline(level: dict, verb: str, exact: bool) -> str:
    good, bad = level["last_good"], level["first_bad"]
    kind = level["level"]
    if exact and not level["skipped"]:
        where = {"release": bad["label"], "nightly": f"the nightly of {bad['label']}"}.get(
            kind) or f"commit {bad['label']} ({bad.get('subject', '')})"
        return f"it {verb} in {where} (the {good['label']} {kind} is good)"
    skipped = ", ".join(s["label"] for s in level["skipped"])
    return (f"it {verb} between {good['label']} (good) and {bad['label']} (bad); the "
            f"{kind}s in between could not be tested ({skipped}), so the first bad one is any "
            f"of them or {bad['label']}")


def _headline(data: dict) -> str:
    verb = "started to pass" if data["regress"] == "success" else "regressed"
    levels = data.get("levels") or [{"level": "nightly", "last_good": data["last_good"],
                                     "first_bad": data["first_bad"], "skipped": data["skipped"]}]
    parts = [_level_headline(level, verb, not level["skipped"]) for level in levels]
    return "; between them, ".join([parts[0], *(p.removeprefix("it ") for p in parts[1:])])


def _rows(data: dict) -> list[tuple[str, dict, str | None]]:
    c = data["commits"]
    rows = []
    for level in data["levels"]:
        deepest = level is data["levels"][-1]
        prefix = f"{level['level']}: " if len(data["levels"]) > 1 else ""
        rows += [(f"{prefix}last good", level["last_good"],
                  c["good_main_commit"] if deepest else None),
                 *[(f"{prefix}skipped", s, None) for s in level["skipped"]],
                 (f"{prefix}first bad", level["first_bad"],
                  c["bad_main_commit"] if deepest else None)]
    return rows


def _commit_line(commit: dict) -> str:
    pr = f" (PR #{commit['pr']}: {commit['pr_url']})" if commit.get("pr") else ""
    return f"{commit['sha'][:12]} {commit['subject']}{pr}"


def print_rich(data: dict, console: Console) -> None:
    console.print(f"[bold]opforge bisect:[/] {escape(_headline(data))}")
    table = Table(show_header=True, header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for column in ("", "probe", "version", "nightly commit", "main commit"):  # commits: 12 hex
        table.add_column(column, no_wrap=True)
    c = data["commits"]
    for label, end, main in _rows(data):
        table.add_row(label, end["label"], end["version"], (end["commit"] or "?")[:12],
                      (main or "")[:12])
    console.print(table)
    for note in data.get("level_notes", []):
        console.print(f"[yellow]note:[/] {escape(note)}")
    console.print(f"{data['probes']} probes in all; {data['candidates']} candidates at the last "
                  f"level (at most {data['max_probes_without_skips']} probes there when nothing "
                  "is skipped)")
    if data.get("speed"):
        for line in describe_boundary(data["speed"]):
            console.print(escape(line))
    if c["commits"]:
        console.print(f"[bold]{len(c['commits'])} first-parent commits on main[/] "
                      f"({c['good_main_commit'][:12]}..{c['bad_main_commit'][:12]}):")
        for commit in c["commits"][:40]:
            console.print(f"  {escape(_commit_line(commit))}")
        if len(c["commits"]) > 40:
            console.print(f"  ... and {len(c['commits']) - 40} more (see --json)")
    if c["note"]:
        console.print(f"[yellow]commits:[/] {escape(c['note'])}")
    if c["compare_url"]:
        console.print(f"compare: {c['compare_url']}")
    console.print("[bold]reproduce the first bad probe with:[/]")
    console.print(escape(data["reproduce"]), soft_wrap=True)
    console.print("[bold]and the last good one with:[/]")
    console.print(escape(data["reproduce_good"]), soft_wrap=True)
    console.print(f"[bold]rerun the bisect:[/] {escape(data['rerun'])}", soft_wrap=True)


def _environment_md(end: dict) -> list[str]:
    env = end.get("environment")
    if not env:
        return []
    torch = ", ".join(f"{k}={v}" for k, v in env["torch"].items() if v is not None)
    lines = [f"<details><summary>environment of {end['label']} ({end['outcome']})</summary>",
             "", f"torch build: {torch}", ""]
    if env.get("packages"):
        lines += ["```", *env["packages"], "```", ""]
    return [*lines, "</details>", ""]


def markdown(data: dict) -> str:
    c = data["commits"]
    lines = [f"### opforge bisect: {_headline(data)}", "",
             "| | probe | version | nightly commit | main commit |", "|---|---|---|---|---|"]
    for label, end, main in _rows(data):
        lines.append(f"| {label} | {end['label']} | `{end['version']}` | "
                     f"`{(end['commit'] or '?')[:12]}` | {f'`{main[:12]}`' if main else ''} |")
    lines += ["", f"{data['probes']} probes; {data['candidates']} candidates at the last level."]
    lines += [f"Note: {note}" for note in data.get("level_notes", [])]
    if data.get("speed"):
        lines += ["", "```", *describe_boundary(data["speed"]), "```"]
    if c["compare_url"]:
        lines += ["", f"Compare: {c['compare_url']}"]
    if c["commits"]:
        lines += ["", f"<details><summary>{len(c['commits'])} commits on main</summary>", ""]
        lines += [f"- `{x['sha'][:12]}` {x['subject']}" + (f" (#{x['pr']})" if x.get("pr") else "")
                  for x in c["commits"]]
        lines += ["", "</details>"]
    lines += ["", "Reproduce the first bad probe with:", "", "```sh", data["reproduce"], "```",
              "", "and the last good one with:", "", "```sh", data["reproduce_good"], "```", ""]
    lines += _environment_md(data["last_good"]) + _environment_md(data["first_bad"])
    return "\n".join(lines)


def emit(data: dict, *, json_to: str | None, markdown_to: str | None) -> None:
    """Rich to the terminal unless --json/--markdown go to stdout; files get written as asked."""
    to_stdout = json_to == "-" or markdown_to == "-"
    if json_to:
        write_output(json_to, json.dumps(data, indent=2) + "\n")
    if markdown_to:
        write_output(markdown_to, markdown(data))
    print_rich(data, Console(stderr=to_stdout, highlight=False, soft_wrap=True))


def emit_error(message: str, steps: list[StepRecord], *, json_to: str | None,
               markdown_to: str | None) -> None:
    """The report of a bisect that stopped (bad endpoints, an abort): what was tested."""
    tested = [{**r.nightly.to_json(), "label": r.nightly.key, "commit": r.git_version,
               "outcome": r.outcome.value, "reason": r.reason}
              for r in sorted(steps, key=lambda r: order_key(r.nightly))]
    for t in tested:
        t.setdefault("date", None)
    if json_to:
        write_output(json_to, json.dumps({"schema": 1, "status": "error", "error": message,
                                    "tested": tested}, indent=2) + "\n")
    if markdown_to:
        lines = [f"### opforge bisect stopped: {message}", ""]
        if tested:
            lines += ["| probe | version | outcome | reason |", "|---|---|---|---|"]
            lines += [f"| {t['label']} | `{t['version']}` | {t['outcome']} | {t['reason']} |"
                      for t in tested]
        write_output(markdown_to, "\n".join(lines) + "\n")


def write_output(target: str, text: str) -> None:
    """Write a report to ``target``: a file (atomically), or stdout for ``-``."""
    if target == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    try:
        write_atomic(target, text)
    except OSError as exc:
        raise OpforgeError(f"cannot write the report to {target}: {exc.strerror or exc}") from None
