"""Processes started together: ``race(target, args_list)`` forks one process per argument
tuple, holds them at a barrier until every one is ready, then lets them all go at once.

Each process's result (or the one-line form of what it raised) comes back through a queue;
a process that does not finish within the bound fails the test (a deadlock, a hang on a lock).
"""

from __future__ import annotations

import multiprocessing as mp
import traceback

CTX = mp.get_context("fork")  # fast starts; the children only call opforge functions
BOUND_S = 60.0


def _child(barrier, queue, index, target, args):
    try:
        barrier.wait(timeout=BOUND_S)
        queue.put((index, "ok", target(*args)))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent as data
        queue.put((index, "raised", f"{type(exc).__name__}: {exc}",
                   traceback.format_exc()))


def race(target, args_list: list[tuple]) -> list[tuple[str, object]]:
    """Run ``target(*args)`` for each args in separate processes released together; the
    (status, value) of each, in order: ("ok", result) or ("raised", "Type: message")."""
    barrier = CTX.Barrier(len(args_list))
    queue = CTX.Queue()
    procs = [CTX.Process(target=_child, args=(barrier, queue, i, target, args))
             for i, args in enumerate(args_list)]
    for p in procs:
        p.start()
    results: dict[int, tuple] = {}
    try:
        for _ in procs:
            item = queue.get(timeout=BOUND_S)
            results[item[0]] = item[1:]
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
    return [results[i][:2] for i in range(len(args_list))]
