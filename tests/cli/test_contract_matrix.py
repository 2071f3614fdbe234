"""opforge matrix and opforge build --dry-run under generated bad input (see contract.py)."""

from __future__ import annotations

import os
import string
import threading
from pathlib import Path

import pytest
import yaml
from contract import PATH_KINDS, check, examples, make_path
from hypothesis import given
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]
VALID = (ROOT / "matrix.yaml").read_text(encoding="utf-8")
VALID_LINES = VALID.splitlines(keepends=True)

# text that YAML and the fields treat specially
NASTY = st.sampled_from([
    "!!python/name:os.system", "!!python/object/apply:os.system ['true']", "!!int abc",
    "!!binary AAAA", "!custom x", "&anchor x", "*anchor", "*missing", "<<: *a", "[", "{", "]",
    "}", "- ", "? ", ": ", "|", ">", "'", '"', "\\", "\t", "\x00", "\x85", "\u2028", "\ufeff",
    "~", "null", "yes", "no", "on", "0x1F", "1e309", ".nan", "-.inf", "2024-06-01", "3.10",
    '"cpu\\n"', '"a\\tb"', "${{ secrets.TOKEN }}", "../..", "/etc/passwd", "C:\\x",
    "javascript:alert(1)", "file:///", "ubuntu 24.04", "x" * 300, "é", "#", "% tag",
])
SCALARS = st.one_of(NASTY, st.text(string.printable, max_size=30),
                    st.text(max_size=12), st.integers(), st.floats(), st.booleans(), st.none())


@st.composite
def mutated_matrix(draw) -> bytes:
    """matrix.yaml with a few edits: a value replaced, a line dropped, doubled or cut, bytes."""
    lines = list(VALID_LINES)
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(lines) - 1))
        edit = draw(st.sampled_from(["value", "value", "drop", "double", "cut", "indent"]))
        line = lines[i]
        if edit == "value" and ":" in line:
            key, _, _ = line.partition(":")
            value = draw(SCALARS)
            text = value if isinstance(value, str) else yaml.safe_dump(value).split("\n")[0]
            lines[i] = f"{key}: {text}\n"
        elif edit == "drop":
            del lines[i]
        elif edit == "double":
            lines.insert(i, line)
        elif edit == "cut":
            lines[i] = line[:draw(st.integers(0, max(0, len(line) - 1)))] + "\n"
        elif edit == "indent":
            lines[i] = " " * draw(st.integers(1, 3)) + line
        if not lines:
            break
    data = "".join(lines).encode("utf-8")
    if draw(st.booleans()):
        for _ in range(draw(st.integers(1, 4))):  # byte-level corruption
            at = draw(st.integers(0, max(0, len(data) - 1)))
            data = data[:at] + draw(st.binary(min_size=0, max_size=3)) + data[at + 1:]
    return data


YAML_VALUES = st.recursive(
    SCALARS, lambda children: st.one_of(st.lists(children, max_size=4),
                                        st.dictionaries(st.text(max_size=8), children,
                                                        max_size=4)), max_leaves=12)


@st.composite
def wrong_types(draw) -> bytes:
    """matrix.yaml parsed, one key's value replaced with something of another shape."""
    data = yaml.safe_load(VALID)
    paths = [("extension", k) for k in data["extension"]] + \
            [("torch", k) for k in data["torch"]] + [("pythons",), ("pr_python",),
                                                      ("platforms",), ("variants",)] + \
            [("variants", i, k) for i, v in enumerate(data["variants"]) for k in v] + \
            [("platforms", p, "runner") for p in data["platforms"]]
    path = draw(st.sampled_from(paths))
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = draw(YAML_VALUES)
    return yaml.safe_dump(data, allow_unicode=True).encode("utf-8")


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("contract-matrix")


def _matrix_file(work: Path, data: bytes) -> Path:
    path = work / "inputs" / "matrix.yaml"
    (path.parent / "extension").mkdir(parents=True, exist_ok=True)  # what extension.path names
    (path.parent / "extension" / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    path.write_bytes(data)
    return path


OUTPUT_FLAGS = st.sampled_from([[], ["--json"], ["--github"], ["--check"], ["--pull-request"],
                                ["--check", "--variant", "cpu"], ["--json", "--python", "3.11"]])


@examples(150)
@given(data=mutated_matrix(), flags=OUTPUT_FLAGS)
def test_matrix_on_mutated_files(work, data, flags):
    path = _matrix_file(work, data)
    os.environ.pop("GITHUB_OUTPUT", None)
    check(["matrix", "--file", str(path), *flags], {0, 2}, watch=(path.parent,))


@examples(80)
@given(data=wrong_types(), flags=OUTPUT_FLAGS)
def test_matrix_on_wrong_types(work, data, flags):
    path = _matrix_file(work, data)
    result = check(["matrix", "--file", str(path), *flags], {0, 2}, watch=(path.parent,))
    if result.code == 2:
        assert "matrix.yaml:" in result.err  # file:line: key: what


@examples(40)
@given(doc=YAML_VALUES)
def test_matrix_on_arbitrary_yaml(work, doc):
    path = _matrix_file(work, yaml.safe_dump(doc, allow_unicode=True).encode("utf-8"))
    check(["matrix", "--file", str(path), "--check"], {2}, watch=(path.parent,))


@examples(40)
@given(data=st.binary(max_size=400))
def test_matrix_on_random_bytes(work, data):
    path = _matrix_file(work, data)
    check(["matrix", "--file", str(path)], {2}, watch=(path.parent,))


@pytest.mark.parametrize("kind", PATH_KINDS)
@pytest.mark.parametrize("command", [["matrix", "--check"], ["build", "--variant", "cpu",
                                                             "--dry-run"]])
def test_matrix_file_of_every_kind(tmp_path, kind, command):
    path = make_path(kind, tmp_path)
    check([*command, "--file", str(path)], {2}, watch=(tmp_path,))


@pytest.mark.parametrize("kind", PATH_KINDS)
def test_github_output_of_every_kind(tmp_path, monkeypatch, kind):
    path = make_path(kind, tmp_path)
    monkeypatch.setenv("GITHUB_OUTPUT", str(path))
    # appended to: an existing file, a FIFO with a reader (how a runner may collect it), a
    # new file in an existing folder (through a dangling link too)
    fine = kind in ("empty-file", "fifo", "dangling-symlink")  # not "missing": no folder
    reader = None
    if kind == "fifo":
        got = []
        reader = threading.Thread(target=lambda: got.append(path.read_text()))
        reader.start()
    check(["matrix", "--file", str(ROOT / "matrix.yaml"), "--github", "--variant", "cpu"],
          {0} if fine else {2}, watch=(tmp_path,), changes_allowed=fine)
    if reader is not None:
        reader.join(10)
        assert got and got[0].startswith("matrix={")
    if fine:
        written = (path if kind != "dangling-symlink" else tmp_path / "nothing-here").read_text() \
            if kind != "fifo" else got[0]
        assert written.startswith('matrix={"include":')


ARG_WORDS = st.sampled_from(["--variant", "--platform", "--python", "--json", "--github",
                             "--check", "--pull-request", "--file", "--bogus", "-", "--", "",
                             "cpu", "cu130", "mps", "linux-x86_64", "3.11", "2.7", "--help"])


@examples(80)
@given(argv=st.lists(st.one_of(ARG_WORDS, NASTY, st.text(max_size=10)), max_size=6))
def test_matrix_arguments(work, argv):
    if "--help" in argv or "--file" in argv:
        argv = [a for a in argv if a not in ("--help", "--file")]
    os.environ.pop("GITHUB_OUTPUT", None)
    check(["matrix", "--file", str(ROOT / "matrix.yaml"), *argv], {0, 2}, watch=(work,))


@examples(80)
@given(data=mutated_matrix(), variant=st.one_of(st.sampled_from(["cpu", "cu130", "mps"]), NASTY),
       extra=st.lists(st.sampled_from([["--torch", "torch==2.13.0"], ["--torch", "torch>=="],
                                       ["--torch-index", "pypi"], ["--torch-index", "::"],
                                       ["--build-env", "OPFORGE_OMIT_KERNELS=nms:cpu"], ["--build-env", ";;"],
                                       ["--build-env", "OPFORGE_VARIANT=cu130"],
                                       ["--out", "/proc/x/y"]]), max_size=2))
def test_build_dry_run_on_mutated_files(work, data, variant, extra):
    path = _matrix_file(work, data)
    argv = ["build", "--variant", variant, "--file", str(path), "--dry-run"]
    for pair in extra:
        argv += pair
    check(argv, {0, 2}, watch=(path.parent,))


@pytest.mark.parametrize("width", [40, 80, 120])
def test_matrix_table_never_cuts_a_job_name(width):
    """A job name is what a user types (and the job's name on GitHub): whole on one line at
    any terminal width, the other columns wrapping instead; nothing ends in an ellipsis."""
    import io

    from rich.console import Console

    from opforge.cli.matrix import print_table
    from opforge.matrix import load_matrix

    matrix = load_matrix(ROOT / "matrix.yaml")
    jobs = matrix.jobs()
    out = io.StringIO()
    print_table(matrix, jobs, Console(file=out, width=width, color_system=None))
    lines = out.getvalue().splitlines()
    for job in jobs:
        assert any(f" {job.name} " in line for line in lines), (job.name, width)
    assert "…" not in out.getvalue()
