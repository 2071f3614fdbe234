"""Find a call of an op that runs: candidates from the schema, refined by the op's own error
messages. Pure: no I/O; the caller runs each call (``opforge.recipes.app``) and tells the
search what happened.

The clues' fixes and the variations are ``opforge.recipes.fixes``; the C++ conditions it
solves, ``opforge.recipes.conditions``.

``Search`` starts from ``calls.first_call`` and keeps a queue of untried calls. Each failure
is read for clues (``clues.read``); every clue gives targeted fixes (the dtype the message
asks for, the rank, sizes made to agree, ``dim`` moved into range, a failed C++ condition
made true by evaluating it against the call). A failure whose message differs from its
parent's made progress: its fixes and a small space of plain variations (each tensor's dtype
and rank, each scalar's value) are tried before anything older, so the search follows the
messages deeper; a fix that changed nothing waits behind its siblings. It is deterministic
and bounded: at most ``limit`` tries, each call tried once.
"""

from __future__ import annotations

import heapq
import itertools
import re
from dataclasses import dataclass

from opforge.recipes import clues as C
from opforge.recipes.calls import Call, Param, first_call
from opforge.recipes.fixes import fixes, variations

MAX_TRIES = 40


# --------------------------------------------------------------------------- the search

def error_key(error: str) -> str:
    """A failure's message without what differs between runs of the same check (file:line)."""
    text = error.strip().splitlines()[0] if error.strip() else ""
    return re.sub(r'at "?[^"\s]+"?:\d+', "", text)[:300]


@dataclass
class _Node:
    call: Call
    level: int
    parent_key: str | None


@dataclass
class Try:
    call: Call
    error: str | None     # None: it ran
    level: int


class Search:
    """``next()`` the call to try, ``tell(error)`` what it did (None: it ran), until ``next``
    returns None: ``found`` is then the working call, or None."""

    def __init__(self, params: list[Param], hints: dict | None = None, limit: int = MAX_TRIES,
                 start: Call | None = None):
        self.params, self.hints, self.limit = params, hints or {}, limit
        self._heap: list[tuple[tuple[int, int, int], _Node]] = []
        self._seen: set[Call] = set()
        self._seq = itertools.count()
        self._current: _Node | None = None
        self.tries: list[Try] = []
        self.found: Call | None = None
        self._push(start if start is not None else first_call(params, self.hints), 0, None, 0)

    def _push(self, call: Call, level: int, parent_key: str | None, kind: int) -> None:
        if call in self._seen:
            return
        self._seen.add(call)
        heapq.heappush(self._heap, ((-level, kind, next(self._seq)),
                                    _Node(call, level, parent_key)))

    def next(self) -> Call | None:
        if self.found is not None or len(self.tries) >= self.limit or not self._heap:
            return None
        _, self._current = heapq.heappop(self._heap)
        return self._current.call

    def tell(self, error: str | None) -> None:
        node = self._current
        if node is None:
            raise RuntimeError("tell() without next()")
        self._current = None
        self.tries.append(Try(node.call, error, node.level))
        if error is None:
            self.found = node.call
            return
        key = error_key(error)
        found = C.read(error)
        # a crash got past the op's checks (its values are what is wrong): its fixes go
        # first, but the plain variations around it would undo what got it there
        crashed = any(isinstance(c, C.Crash) for c in found)
        progress = key != node.parent_key
        level = node.level + (1 if progress or crashed else 0)
        for call in fixes(self.params, node.call, found):
            self._push(call, level, key, 0)
        if progress:
            # after a crash the plain variations come last: they may undo what got it there
            for call in variations(self.params, node.call, self.hints):
                self._push(call, level, key, 2 if crashed else 1)

    @property
    def best(self) -> Try | None:
        """The failed try that got furthest (the latest of the deepest), for the report."""
        failed = [(t.level, i, t) for i, t in enumerate(self.tries) if t.error is not None]
        return max(failed, key=lambda x: (x[0], x[1]))[2] if failed else None


def search(params: list[Param], attempt, hints: dict | None = None,
           limit: int = MAX_TRIES) -> Search:
    """Run a whole search with ``attempt(call) -> error or None`` (tests; the app steps it)."""
    s = Search(params, hints, limit)
    while (call := s.next()) is not None:
        s.tell(attempt(call))
    return s
