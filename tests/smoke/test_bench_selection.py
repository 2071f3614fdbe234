"""`opforge bench` refuses what it cannot honour before it makes an environment: an `--ops` or
`--workloads` name the recipes file does not have, and `--regression` / `--against-label`
without a baseline to compare with. Exit 2, one line, no environment directory, no probe run.

Names the recipes file writes as literals are checked on the host (the file is parsed, never
run); names its code makes (a helper that returns the workloads) can only be known by running
it, which happens in the environment under test: the same rule refuses them there, also
exit 2, in one line."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from opforge.bench.selection import read_names
from opforge.cli import main

LITERAL = '''
import torch


def inputs(dtype):
    return [torch.ones(4, dtype=dtype)]


RECIPES = {
    "scale": {"inputs": inputs, "workloads": {"small": {"inputs": inputs},
                                              "medium": {"inputs": inputs}}},
    "shift": {"inputs": inputs, "workloads": {"small": {"inputs": inputs}}},
    "plain": {"inputs": inputs},
}
'''

MADE_BY_CODE = '''
import torch


def inputs(dtype):
    return [torch.ones(4, dtype=dtype)]


def sizes(*names):
    return {name: {"inputs": inputs} for name in names}


RECIPES = {
    "scale": {"inputs": inputs, "workloads": sizes("small", "medium")},
}
'''


class Reached(BaseException):
    """Raised where the environment would be made: past every check (not an Exception, so
    the command's error boundary lets it through to the test)."""


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A recipes file of each kind, an environment folder that must never appear, and a
    prepare_environment that fails the test if anything gets that far."""
    (tmp_path / "literal.py").write_text(textwrap.dedent(LITERAL), encoding="utf-8")
    (tmp_path / "code.py").write_text(textwrap.dedent(MADE_BY_CODE), encoding="utf-8")
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)

    def no_environment(*_args, **_kwargs):
        raise Reached("an environment was about to be made")

    monkeypatch.setattr("opforge.bench.run.prepare_environment", no_environment)
    return tmp_path


def bench(project: Path, capsys, *argv: str, recipes: str = "literal.py") -> tuple[int, str]:
    env_dir = project / "env"
    code = main(["bench", "--requirement", "scaleops", "--package", "scaleops", "--namespace",
                 "scaleops", "--recipes", str(project / recipes), "--env-dir", str(env_dir),
                 *argv])
    captured = capsys.readouterr()
    assert not env_dir.exists(), "an environment directory was created"
    assert not (project / "cache").exists() or not any((project / "cache").rglob("*venv*"))
    return code, captured.out + captured.err


@pytest.mark.parametrize(("argv", "says"), [
    (["--ops", "no_such_op"],
     "opforge bench: error: --ops no_such_op: literal.py has no such op with workloads (its ops "
     "with workloads: scale, shift)"),
    (["--ops", "scale,sacle"], "--ops sacle: literal.py has no such op with workloads (its ops "
                               "with workloads: scale, shift); did you mean scale?"),
    (["--ops", "plain"], "--ops plain: literal.py has no such op with workloads"),
    (["--workloads", "no_such_workload"],
     "--workloads no_such_workload: literal.py has no such workload (its workloads: medium, "
     "small)"),
    (["--ops", "shift", "--workloads", "medium"],
     "--workloads medium: literal.py has no such workload (its workloads of shift: small)"),
    (["--regression", "3"], "--regression applies to a comparison with a baseline: give "
                            "--against NAME|FILE or --baseline NAME|FILE with it"),
    (["--against-label", "last night"], "--against-label applies to a comparison with a "
                                        "baseline"),
])
def test_a_name_or_option_bench_cannot_honour_exits_2_before_any_environment(
        project, capsys, argv, says):
    code, output = bench(project, capsys, *argv)
    assert code == 2, output
    assert says in output, output
    assert len(output.strip().splitlines()) == 1 and "Traceback" not in output, output


@pytest.mark.parametrize("argv", [
    ["--ops", "scale", "--workloads", "medium,small"],
    ["--workloads", "medium"],  # one op has it: the others time nothing, as before
    ["--regression", "3", "--baseline", "nightly"],
    ["--regression", "3", "--against", ""],  # a workflow's first night: compared with nothing
])
def test_what_bench_can_honour_gets_past_the_checks(project, capsys, argv):
    """The checks let real names and partnered options through (to the environment, which
    this test stops there)."""
    with pytest.raises(Reached):
        bench(project, capsys, *argv)


def test_names_made_by_code_are_refused_in_the_target_with_the_same_rule(project, capsys,
                                                                        monkeypatch):
    """Workloads a helper makes: the host cannot know them, the probe (run here on this
    interpreter, no environment made) refuses the unknown one, exit 2, one line."""
    pytest.importorskip("torch")
    monkeypatch.undo()  # the real runner: --python makes no environment
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(project / "cache"))
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    monkeypatch.syspath_prepend(str(project))
    (project / "scaleops").mkdir()
    (project / "scaleops" / "__init__.py").write_text("", encoding="utf-8")
    monkeypatch.setenv("PYTHONPATH", str(project))
    code = main(["bench", "--python", sys.executable, "--package", "scaleops", "--namespace",
                 "scaleops", "--recipes", str(project / "code.py"), "--workloads", "large"])
    captured = capsys.readouterr()
    output = captured.out + captured.err
    assert code == 2, output
    assert output.strip().splitlines()[-1] == (
        "opforge bench: error: --workloads large: code.py has no such workload (its "
        "workloads: medium, small)"), output


def test_the_host_reads_only_names_written_as_literals(tmp_path):
    literal = tmp_path / "literal.py"
    literal.write_text(LITERAL, encoding="utf-8")
    assert read_names(literal) == {"scale": {"small", "medium"}, "shift": {"small"},
                                   "plain": frozenset()}
    code = tmp_path / "code.py"
    code.write_text(MADE_BY_CODE, encoding="utf-8")
    assert read_names(code) == {"scale": None}  # its workloads: only running it tells
    for text in ("RECIPES = dict(a={})\n", "RECIPES = {}\nRECIPES['a'] = {}\n",
                 "RECIPES = {**BASE}\n", "def broken(:\n", "X = 1\n"):
        code.write_text(text, encoding="utf-8")
        assert read_names(code) is None, text
