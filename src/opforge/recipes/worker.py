"""The trial calls' process: ``probe.pyz derive`` in the environment under test, started
from a scratch directory (so the package imports from the environment, not a checkout),
asked one call at a time, each with a time limit. A call that hangs or kills the
interpreter is that call's failure: the process is stopped (its whole group) and a fresh one
started for the next call, so the search goes on.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from opforge.errors import OpforgeError
from opforge.processes import stop_child
from opforge.smoke.archive import probe_archive

START_TIMEOUT_S = 600   # importing torch and the package
CALL_TIMEOUT_S = 30     # one trial call (twice, with its inputs)
_LEAKY_ENV = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONSAFEPATH", "VIRTUAL_ENV")


class WorkerError(OpforgeError):
    """The trial process could not start: torch or the package does not import."""


class TrialWorker:
    def __init__(self, python: Path, package: str | None, namespace: str, *, fresh: bool,
                 call_timeout: float = CALL_TIMEOUT_S):
        self.python, self.package, self.namespace = python, package, namespace
        self.fresh, self.call_timeout = fresh, call_timeout
        self.scratch = Path(tempfile.mkdtemp(prefix="opforge-derive-"))
        self.archive = probe_archive(self.scratch / "probe.pyz")
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.torch_version: str | None = None
        self._stderr = None
        self._timed_out = False
        self._buffer = b""
        self.final = False               # the last call failed beyond what inputs can fix
        self.schema_error: str | None = None

    # ------------------------------------------------------------------ process

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.fresh:
            for name in _LEAKY_ENV:
                env.pop(name, None)
            env["PYTHONNOUSERSITE"] = "1"
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def start(self) -> None:
        self.stop()
        self.starts += 1
        self._stderr = open(self.scratch / f"stderr-{self.starts}.txt", "w+b")  # noqa: SIM115 - closed in stop()
        cmd = [str(self.python), str(self.archive), "derive", "--namespace", self.namespace,
               "--package", self.package or ""]
        try:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=self._stderr, cwd=self.scratch, env=self._env(),
                                         start_new_session=True)
        except OSError as exc:
            raise WorkerError(f"cannot run {self.python}: {exc.strerror or exc}") from None
        self._buffer = b""
        hello = self._read(START_TIMEOUT_S)
        if hello is None or "error" in hello:
            why = hello["error"] if hello else self._died()
            self.stop()
            raise WorkerError(f"the trial process did not start: {why}")
        self.torch_version = hello.get("torch")

    def _read(self, timeout: float) -> dict | None:
        """The next answer, or None when the process died or did not answer in time."""
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                self._timed_out = True
                return None
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        try:
            return json.loads(line)
        except ValueError:
            return None

    def _died(self) -> str:
        code = self.proc.poll() if self.proc else None
        if code is None:
            return "no answer"
        tail = ""
        try:
            self._stderr.seek(0)
            lines = self._stderr.read().decode("utf-8", "replace").strip().splitlines()
            tail = lines[-1][:300] if lines else ""
        except (OSError, ValueError):
            pass
        how = (f"killed by {signal.Signals(-code).name}" if code < 0 and
               -code in signal.Signals._value2member_map_ else f"exited {code}")
        return how + (f": {tail}" if tail else "")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        stop_child(proc)
        stderr = getattr(self, "_stderr", None)
        if stderr is not None:
            stderr.close()
            self._stderr = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.scratch, ignore_errors=True)

    def __enter__(self) -> TrialWorker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ requests

    def ask(self, request: dict, timeout: float) -> dict:
        """One answer; a process that hangs or dies is stopped and the answer says how."""
        if self.proc is None:
            self.start()
        self._timed_out = False
        try:
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            answer = None
        else:
            answer = self._read(timeout)
        if answer is not None:
            return answer
        if self._timed_out:
            why = f"the call did not return within {timeout:.0f} s (hung?)"
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        else:
            self.proc.wait()
            why = f"the call crashed the interpreter ({self._died()})"
        self.stop()
        return {"ok": False, "error": why, "stage": "crash"}

    def schema(self, op: str, overload: str | None = None, kind: str = "op") -> str | None:
        """The op's schema (a function's signature); None, with ``schema_error`` saying why,
        where there is none (no such op or function)."""
        answer = self.ask({"schema": op, "kind": kind, "overload": overload or "default"},
                          self.call_timeout)
        self.schema_error = answer.get("error")
        return answer.get("schema")

    def call(self, key: str, kind: str, inputs: str, *, overload: str | None = None,
             mutates: list[int] | None = None) -> str | None:
        """None when the call ran twice with the same result, else what went wrong;
        ``final`` then says whether no other arguments can help (no kernel, no such op)."""
        answer = self.ask({"call": key, "kind": kind, "overload": overload or "default",
                           "inputs": inputs, "mutates": mutates or []}, self.call_timeout)
        self.final = bool(answer.get("final"))
        return None if answer.get("ok") else str(answer.get("error") or "failed")
