"""Progress on long steps: a live line in a terminal, plain lines elsewhere, nothing with -q.

A step (making an environment, installing torch, downloading a wheel) shows a rich spinner
with its elapsed time while it runs when stderr is a terminal, then a check-marked line. In a
CI log (``CI`` set) or any non-terminal it writes one line when the step ends, nothing while
it runs: logs stay line-oriented and grep-able. A step in parts (``tally``: a compile's
files, a bench's rows, a bisect's probes) shows where it is: done of total, the current part,
the elapsed time and what is left (from the rate so far, or a recorded estimate); in a log,
one plain line per part. ``opforge -q`` (``set_quiet``) silences all of it; failures are
still said.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

_QUIET = False
# a log hears from a step that runs longer than this, so a slow step is not taken for a hung one
HEARTBEAT_S = 30.0
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def set_quiet(on: bool) -> None:
    """``-q``: no progress at all (reports, results and errors are not progress)."""
    global _QUIET
    _QUIET = bool(on)


def quiet() -> bool:
    return _QUIET


def interactive(stream=None) -> bool:
    stream = sys.stderr if stream is None else stream
    if os.environ.get("CI", "").lower() not in ("", "0", "false"):
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def plain(text: str) -> str:
    """``text`` without control characters (a compiler's colours, a carriage return)."""
    return _CONTROL.sub("", re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text))


def say(line: str, *, stream=None) -> None:
    """One progress line, unless quiet."""
    if not _QUIET:
        print(plain(line), file=sys.stderr if stream is None else stream, flush=True)


def duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
    minutes, rest = divmod(int(round(seconds)), 60)
    return f"{minutes} min {rest:02d} s"


@contextmanager
def heartbeat(beat: Callable[[float], None]) -> Iterator[None]:
    """``beat(seconds so far)`` every HEARTBEAT_S while the block runs."""
    t0 = time.monotonic()
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(HEARTBEAT_S):
            beat(time.monotonic() - t0)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=1)


@contextmanager
def step(what: str, *, stream=None) -> Iterator[None]:
    """Show ``what`` while the block runs; report its duration when it ends without error."""
    stream = sys.stderr if stream is None else stream
    t0 = time.monotonic()
    if _QUIET:
        yield
    elif interactive(stream):
        # rich only for a terminal: opforge.nox imports this module (through venv) in nox's own
        # interpreter, which may have no rich
        from rich.console import Console
        from rich.markup import escape

        console = Console(file=stream)
        with console.status(escape(what) + " ..."):
            yield
        console.print(f"[green]✓[/] {escape(what)} [dim]({time.monotonic() - t0:.1f} s)[/]")
    else:
        with heartbeat(lambda t: print(f"opforge: {plain(what)}: not done yet ({duration(t)} so "
                                       "far)", file=stream, flush=True)):
            yield
        print(f"opforge: {plain(what)} ({time.monotonic() - t0:.1f} s)", file=stream, flush=True)


@contextmanager
def transfer(what: str, total: int | None, *, stream=None) -> Iterator[Callable[[int], None]]:
    """A download: yields ``advance(nbytes)``; a byte bar in a terminal, one line elsewhere."""
    stream = sys.stderr if stream is None else stream
    t0 = time.monotonic()
    done = 0
    if interactive(stream) and not _QUIET:
        # rich only for a terminal: opforge.nox imports this module (through venv) in nox's own
        # interpreter, which may have no rich
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                   TransferSpeedColumn(), TimeRemainingColumn())
        with Progress(*columns, console=Console(file=stream), transient=True) as bar:
            task = bar.add_task(what, total=total)
            yield lambda n: bar.advance(task, n)
        Console(file=stream).print(f"[green]✓[/] {what} [dim]({time.monotonic() - t0:.1f} s)[/]")
        return

    def advance(n: int) -> None:
        nonlocal done
        done += n

    yield advance
    if not _QUIET:
        print(f"opforge: {what}: {done / 1e6:.1f} MB ({time.monotonic() - t0:.1f} s)",
              file=stream, flush=True)


class Tally:
    """Where a step in parts is: ``update(done, total, current)`` as the parts go by."""

    def __init__(self, what: str, total: int | None, estimate_s: float | None, stream,
                 unit: str):
        self.what, self.total, self.estimate_s, self.unit = what, total, estimate_s, unit
        self.stream = stream
        self.done = 0
        self.current = ""
        self.t0 = time.monotonic()
        self.live = None
        self.task = None
        self.failed = False  # set when the step ended without raising but did not finish
        if not _QUIET and interactive(stream):
            self._start_live()

    # ------------------------------------------------------------------ what is shown
    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def left(self) -> str:
        """What is left: the recorded estimate's rest, else the rate so far; '' unknown."""
        elapsed = self.elapsed()
        if self.estimate_s:
            rest = self.estimate_s - elapsed
            last = duration(self.estimate_s)
            return f"~{duration(rest)} left (last time {last})" if rest > 0 else \
                f"longer than last time ({last})"
        if self.total and 0 < self.done < self.total:
            return f"~{duration(elapsed / self.done * (self.total - self.done))} left"
        return ""

    def count(self) -> str:
        if self.total:
            return f"{min(self.done, self.total)}/{self.total} {self.unit}"
        return f"{self.done} {self.unit}" if self.done else ""

    def line(self) -> str:
        """The plain line a log gets for the part just seen."""
        parts = [p for p in (self.count(), self.current) if p]
        timing = ", ".join(p for p in (duration(self.elapsed()), self.left()) if p)
        return plain(f"opforge: {self.what}: {' '.join(parts)} ({timing})")

    # ------------------------------------------------------------------ updates
    def update(self, done: int | None = None, total: int | None = None,
               current: str | None = None) -> None:
        changed = False
        for name, value in (("done", done), ("total", total), ("current", current)):
            if value is not None and value != getattr(self, name):
                setattr(self, name, plain(value) if isinstance(value, str) else value)
                changed = True
        if not changed or _QUIET:
            return
        if self.live is not None:
            self.live.update(self.task, description=self.what, completed=self.done,
                             total=self.total, count=self.count(), current=self.current)
        else:
            print(self.line(), file=self.stream, flush=True)

    def finish(self, ok: bool) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None
        if ok and not _QUIET:
            counted = f"{self.count()}, " if self.done else ""
            text = f"{self.what} ({counted}{duration(self.elapsed())})"
            if interactive(self.stream):
                # rich only for a terminal: opforge.nox imports this module (through venv) in nox's own
                # interpreter, which may have no rich
                from rich.console import Console
                from rich.markup import escape

                Console(file=self.stream).print(f"[green]✓[/] {escape(text)}")
            else:
                print(f"opforge: {plain(text)}", file=self.stream, flush=True)

    def _start_live(self) -> None:
        # rich only for a terminal: opforge.nox imports this module (through venv) in nox's own
        # interpreter, which may have no rich
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            Progress,
            ProgressColumn,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
        )
        from rich.text import Text

        tally = self

        class Left(ProgressColumn):
            def render(self, task):  # noqa: ARG002 - redrawn on rich's clock, not ours
                return Text(tally.left(), style="dim")

        self.live = Progress(SpinnerColumn(), TextColumn("{task.description}"),
                             BarColumn(bar_width=24), TextColumn("{task.fields[count]}"),
                             TextColumn("{task.fields[current]}", style="cyan"),
                             TimeElapsedColumn(), Left(),
                             console=Console(file=self.stream), transient=True)
        self.task = self.live.add_task(self.what, total=self.total, count="", current="")
        self.live.start()


@contextmanager
def tally(what: str, *, total: int | None = None, estimate_s: float | None = None,
          unit: str = "", stream=None) -> Iterator[Tally]:
    """A step in parts: a live line in a terminal, a plain line per part in a log, and a
    closing line with the count and the time when it ends without error."""
    shown = Tally(what, total, estimate_s, sys.stderr if stream is None else stream, unit)
    ok = False
    # a log hears from a long part too (one .cu file compiles for minutes, silently)
    beat = heartbeat(lambda _t: print(shown.line(), file=shown.stream, flush=True)) \
        if shown.live is None and not _QUIET else contextlib.nullcontext()
    try:
        with beat:
            yield shown
        ok = not shown.failed
    finally:
        shown.finish(ok)


def tail(lines: list[str], count: int = 20) -> list[str]:
    """The last ``count`` lines that say something, without control characters."""
    said = [plain(line.rstrip()) for line in lines if line.strip()]
    return said[-count:]


def show_tail(what: str, lines: list[str], *, count: int = 20, log: str | None = None,
              stream=None) -> None:
    """A failed step's last lines, before its one-line error (shown even with -q)."""
    last = tail(lines, count)
    if not last:
        return
    stream = sys.stderr if stream is None else stream
    where = f" ({log})" if log else ""
    print(f"opforge: {what} failed; its last {len(last)} lines{where}:", file=stream)
    for line in last:
        print(f"  | {line}", file=stream)
    stream.flush()
