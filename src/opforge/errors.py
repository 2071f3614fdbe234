"""Errors the CLI turns into one line and an exit code; the codes are listed in EXIT_CODES."""

from __future__ import annotations

import signal

EXIT_OK = 0
EXIT_FAILED = 1   # a check failed (smoke, inspect --expect-variant, a build, a bisect's probe)
EXIT_USAGE = 2    # bad arguments or bad configuration; nothing was changed
EXIT_BUG = 3      # an unexpected exception: a bug in opforge; the traceback went to a log file
EXIT_SIGNAL = 128  # + the signal's number: stopped by SIGHUP (129), SIGINT (130), SIGTERM (143)

# the table README.md and docs/cli.md show (a test keeps them in step)
EXIT_CODES = (
    (EXIT_OK, "success"),
    (EXIT_FAILED, "a check failed (smoke test, wheel contradicts its variant, build, bisect)"),
    (EXIT_USAGE, "bad arguments, configuration or input file; nothing was changed"),
    (EXIT_BUG, "internal error (a bug): one line names the log file with the traceback"),
    (EXIT_SIGNAL + signal.SIGHUP, "stopped by SIGHUP"),
    (EXIT_SIGNAL + signal.SIGINT, "stopped by SIGINT (Ctrl-C)"),
    (EXIT_SIGNAL + signal.SIGPIPE, "output closed early (SIGPIPE, e.g. piped into head); quiet"),
    (EXIT_SIGNAL + signal.SIGTERM, "stopped by SIGTERM (e.g. a cancelled CI job)"),
)


class OpforgeError(Exception):
    """A failure the user must act on; printed as one line, exit status ``exit_code``."""

    exit_code = EXIT_FAILED


class UsageError(OpforgeError):
    """Bad arguments or bad configuration (matrix.yaml, an index page): exit 2."""

    exit_code = EXIT_USAGE


class Interrupted(KeyboardInterrupt):
    """SIGTERM, SIGHUP or SIGINT arrived: unwind (``finally`` blocks clean up), exit 128+N.

    A KeyboardInterrupt, so every ``except KeyboardInterrupt`` that stops child processes and
    journals the interruption handles all three signals alike.
    """

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return EXIT_SIGNAL + self.signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name
