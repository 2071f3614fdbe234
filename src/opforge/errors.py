"""Errors the CLI turns into one line and an exit code (0 ok, 1 check failed, 2 usage)."""

from __future__ import annotations


class OpforgeError(Exception):
    """A failure the user must act on; printed as one line, exit status ``exit_code``."""

    exit_code = 1


class UsageError(OpforgeError):
    """Bad arguments or bad configuration (matrix.yaml, an index page): exit 2."""

    exit_code = 2
