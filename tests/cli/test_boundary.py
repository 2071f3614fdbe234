"""The one error boundary: every outcome of every command is one line and a documented code."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from opforge import cli
from opforge.cli import COMMANDS, build_parser, main
from opforge.errors import EXIT_BUG, OpforgeError, UsageError


def _only_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "Traceback" not in err[0]
    return err[0]


def test_every_command_is_registered():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert set(sub.choices) == set(COMMANDS)


def _replace_handler(monkeypatch, command: str, func):
    module = COMMANDS[command]
    original = module.register

    def register(subparsers):
        original(subparsers)
        subparsers.choices[command].set_defaults(func=func)

    monkeypatch.setattr(module, "register", register)


def test_expected_failure_is_one_line_with_the_command_and_its_code(monkeypatch, capsys):
    def fail(args):
        raise OpforgeError("the wheel\ncontradicts its variant")

    _replace_handler(monkeypatch, "inspect", fail)
    assert main(["inspect", "x.whl"]) == 1
    assert _only_line(capsys) == "opforge inspect: error: the wheel contradicts its variant"


def test_usage_error_exits_2(capsys):
    assert main(["matrix", "--no-such-option"]) == 2
    assert _only_line(capsys) == "opforge matrix: error: unrecognized arguments: --no-such-option"


def test_a_bug_is_one_line_naming_a_log_with_the_traceback(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path))

    def crash(args):
        return {}["missing key"]

    _replace_handler(monkeypatch, "matrix", crash)
    assert main(["matrix"]) == EXIT_BUG
    line = _only_line(capsys)
    assert line.startswith("opforge matrix: internal error (a bug in opforge")
    assert "KeyError: 'missing key'" in line
    log = line.split("the traceback is in ", 1)[1].split(" - please report it")[0]
    text = open(log, encoding="utf-8").read()
    assert "Traceback (most recent call last)" in text and "crash" in text
    assert os.path.dirname(log) == str(tmp_path / "logs")


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGHUP, 129),
                                           (signal.SIGINT, 130)])
def test_a_signal_unwinds_and_exits_128_plus_its_number(monkeypatch, capsys, signum, code):
    cleaned = []

    def stopped(args):
        try:
            os.kill(os.getpid(), signum)
        finally:
            cleaned.append(True)
        raise AssertionError("the signal did not interrupt the command")

    _replace_handler(monkeypatch, "matrix", stopped)
    before = signal.getsignal(signum)
    assert main(["matrix"]) == code
    assert cleaned == [True]
    assert _only_line(capsys) == f"opforge matrix: interrupted ({signal.Signals(signum).name})"
    assert signal.getsignal(signum) == before  # the boundary restores the handlers


def test_usage_error_message_has_no_traceback_even_when_chained(monkeypatch, capsys):
    def fail(args):
        try:
            int("x")
        except ValueError:
            raise UsageError("--timeout x: not a number") from None

    _replace_handler(monkeypatch, "bisect", fail)
    assert main(["bisect"]) == 2
    assert _only_line(capsys) == "opforge bisect: error: --timeout x: not a number"


def test_closed_stdout_is_quiet_through_the_real_entry_point(tmp_path):
    read_end, write_end = os.pipe()
    os.close(read_end)  # like `| head` that has already exited
    try:
        run = subprocess.run([sys.executable, "-m", "opforge", "matrix", "--json"],
                             stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(write_end)
    assert run.returncode == 128 + signal.SIGPIPE
    assert run.stderr == ""


def test_help_and_version_exit_0(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("opforge ")
    for command in COMMANDS:
        assert main([command, "--help"]) == 0
    assert cli.command_of(["--version"]) is None


@pytest.mark.parametrize("doc", ["README.md", "docs/cli.md"])
def test_exit_code_table_is_documented_exactly(doc):
    from pathlib import Path

    from opforge.errors import EXIT_CODES

    text = (Path(__file__).resolve().parents[2] / doc).read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if line.startswith("| ") and "|" in line[2:]]
    start = rows.index("| exit | meaning |")
    table = []
    for line in rows[start + 1:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[0] == "---":
            continue
        if not cells[0].isdigit():
            break
        table.append((int(cells[0]), cells[1]))
    assert table == list(EXIT_CODES)
