"""The expression evaluator and the run: splitter behave as GitHub and bash do."""

from __future__ import annotations

import pytest

from opforge.workflows.commands import ScriptError, classify, commands
from opforge.workflows.expressions import ExpressionError, Placeholder, condition, render

CTX = {
    "matrix": {"device_checks": False, "container": "", "name": "mps-macos-arm64-py3.11",
               "python": "3.11", "include": [1, 2]},
    "github": {"event_name": "pull_request"},
    "needs": Placeholder("needs"),
    "steps": Placeholder("steps"),
}


@pytest.mark.parametrize("text, value", [
    ("${{ matrix.device_checks && 'auto' || 'skip' }}", "skip"),
    ("${{ github.event_name == 'pull_request' && '--pull-request' || '' }}", "--pull-request"),
    ("${{ github.event_name == 'PULL_REQUEST' }}", True),       # case-insensitive strings
    ("${{ matrix.python == 3.11 }}", True),                     # mixed types compare as numbers
    ("${{ matrix.container || 'python' }}", "python"),
    ("py${{ matrix.python }}-${{ matrix.name }}", "py3.11-mps-macos-arm64-py3.11"),
    ("${{ fromJSON('{\"include\": [3]}').include[0] }}", 3.0),
    ("${{ format('{0}-{1}', matrix.python, 'x') }}", "3.11-x"),
    ("${{ contains(matrix.name, 'MACOS') }}", True),
    ("${{ matrix.missing }}", None),                            # GitHub: null, not an error
    ("${{ needs.build.result }}", "success"),
])
def test_render_follows_github(text, value):
    assert render(text, CTX) == value


def test_a_step_condition_implies_success_unless_it_names_a_status():
    assert condition("matrix.container == ''", CTX)
    assert not condition("matrix.container == ''", {**CTX, "__status__": "failure"})
    assert condition("${{ failure() }}", {**CTX, "__status__": "failure"})
    assert condition("${{ !cancelled() }}", {**CTX, "__status__": "failure"})
    assert not condition("failure()", CTX)


@pytest.mark.parametrize("bad", ["matrix.", "(matrix.name", "nosuch.context", "matrix.name ==",
                                 "frobnicate(1)", "'unterminated"])
def test_a_bad_expression_is_one_error(bad):
    with pytest.raises(ExpressionError):
        render("${{ " + bad + " }}", CTX)


def test_commands_keep_expressions_whole_and_split_the_rest_like_bash():
    script = ("# a comment\n"
              "opforge matrix --github ${{ a == 'b c' && '--pull-request' || '' }}\n\n"
              "\"$CELL_PYTHON\" -m nox -s build_cpu -- \\\n  --dry-run\n")
    assert commands(script) == [
        ["opforge", "matrix", "--github", "${{ a == 'b c' && '--pull-request' || '' }}"],
        ["$CELL_PYTHON", "-m", "nox", "-s", "build_cpu", "--", "--dry-run"],
    ]


def test_classify_names_the_tool_its_sessions_and_posargs():
    cmd = classify(["/opt/python/cp311-cp311/bin/python", "-m", "nox", "-s", "build_cu130",
                    "smoke", "--", "--dry-run"])
    assert (cmd.tool, cmd.sessions, cmd.posargs) == ("nox", ("build_cu130", "smoke"),
                                                     ("--dry-run",))
    smoke = classify(["opforge", "smoke", "--variant=mps", "--device-checks", "skip"])
    assert smoke.subcommand == "smoke"
    assert (smoke.option("--variant"), smoke.option("--device-checks")) == ("mps", "skip")
    assert classify(["python3.11", "-m", "pip", "install", "-U", "nox>=2025", "."]).tool == "pip"


def test_operators_inside_quotes_are_not_shell_operators():
    assert commands("opforge bisect --match 'a|b && c'") == [
        ["opforge", "bisect", "--match", "a|b && c"]]
    with pytest.raises(ScriptError, match="shell operator"):
        commands("opforge bisect --match a|b")
