"""Progress on long steps: a live spinner in a terminal, one plain line per step elsewhere.

A step (making an environment, installing torch, downloading a wheel) shows a rich spinner
with its elapsed time while it runs when stderr is a terminal, then a check-marked line. In a
CI log (``CI`` set) or any non-terminal it writes one line when the step ends, nothing while
it runs: logs stay line-oriented and grep-able.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager


def interactive(stream=None) -> bool:
    stream = sys.stderr if stream is None else stream
    if os.environ.get("CI", "").lower() not in ("", "0", "false"):
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


@contextmanager
def step(what: str, *, stream=None) -> Iterator[None]:
    """Show ``what`` while the block runs; report its duration when it ends without error."""
    stream = sys.stderr if stream is None else stream
    t0 = time.monotonic()
    if interactive(stream):
        from rich.console import Console
        from rich.markup import escape

        console = Console(file=stream)
        with console.status(escape(what) + " ..."):
            yield
        console.print(f"[green]✓[/] {escape(what)} [dim]({time.monotonic() - t0:.1f} s)[/]")
    else:
        yield
        print(f"opforge: {what} ({time.monotonic() - t0:.1f} s)", file=stream, flush=True)


@contextmanager
def transfer(what: str, total: int | None, *, stream=None) -> Iterator[Callable[[int], None]]:
    """A download: yields ``advance(nbytes)``; a byte bar in a terminal, one line elsewhere."""
    stream = sys.stderr if stream is None else stream
    t0 = time.monotonic()
    done = 0
    if interactive(stream):
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
    print(f"opforge: {what}: {done / 1e6:.1f} MB ({time.monotonic() - t0:.1f} s)", file=stream,
          flush=True)
