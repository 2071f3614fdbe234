"""Usage errors: one line, exit 2, no traceback, nothing installed."""

from __future__ import annotations

import pytest

from opforge.cli import main


@pytest.mark.parametrize("argv, message", [
    (["smoke"], "give one of --wheel PATH, --requirement REQ, --python PATH"),
    (["smoke", "--wheel", "nope.whl"], "--wheel nope.whl: no such file"),
    (["smoke", "--wheel", "setup.py"], "not a .whl file"),
    (["smoke", "--python", "/usr/bin/python3", "--expect-keys", "cpu-x"], "is not a dispatch key"),
    (["smoke", "--python", "/usr/bin/python3", "--ops", "nms;rm"], "is not an operator name"),
    (["smoke", "--python", "/usr/bin/python3", "--variant", "cu999"], "unknown variant 'cu999'"),
    (["smoke", "--python", "/usr/bin/python3", "--torch", "torch==2.14.1"],
     "--torch and --keep-env apply to a fresh environment"),
    (["smoke", "--wheel", "a.whl", "--python", "b"], "not allowed with argument"),
])
def test_bad_arguments_exit_2_with_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("opforge: error: ")
    assert message in err[0]
    assert "Traceback" not in err[0]


def test_missing_interpreter_is_a_usage_error(capsys):
    assert main(["smoke", "--python", "/nonexistent/bin/python", "--package", "p",
                 "--namespace", "n"]) == 2
    assert "no such interpreter" in capsys.readouterr().err
