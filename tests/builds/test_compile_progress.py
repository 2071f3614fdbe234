"""A compile shows where it is: files done of total, the current file, the time, an estimate
from the last build; plain lines in a log, nothing with -q, the last lines when it fails."""

from __future__ import annotations

import io
import json
import re
import sys
import textwrap
from pathlib import Path

import pytest
from projectkit import matrix_yaml

from opforge import build, progress
from opforge.build.progress import CompileOutput, compile_progress, last_build, record_path
from opforge.cli import main
from opforge.errors import OpforgeError

ROOT = Path("/src/ext")
ESCAPE = re.compile(r"[\x1b\r\x07\x08]")

# what torch's cpp_extension prints through pip (ninja -v: the command, when the job ends)
NINJA_BUILD = f"""\
  running build_ext
  [1/3] c++ -MMD -MF {ROOT}/build/temp/csrc/cpu/nms_kernel.o.d -O3 -fPIC -I{ROOT}/csrc -c {ROOT}/csrc/cpu/nms_kernel.cpp -o {ROOT}/build/temp/csrc/cpu/nms_kernel.o -DTORCH_EXTENSION_NAME=_C
  In file included from {ROOT}/csrc/cpu/roi_align_kernel.cpp:3:
  {ROOT}/csrc/cpu/roi_align_kernel.cpp:10:5: warning: unused variable 'x' [-Wunused-variable]
  [2/3] c++ -MMD -MF {ROOT}/build/temp/csrc/cpu/roi_align_kernel.o.d -O3 -c {ROOT}/csrc/cpu/roi_align_kernel.cpp -o {ROOT}/build/temp/csrc/cpu/roi_align_kernel.o
  [3/3] /usr/local/cuda/bin/nvcc --generate-dependencies-with-compile -c {ROOT}/csrc/cuda/nms.cu -o {ROOT}/build/temp/csrc/cuda/nms.o
  g++ -O3 -shared {ROOT}/build/temp/csrc/cpu/nms_kernel.o -o {ROOT}/build/lib/ext/_C.cpython-311-x86_64-linux-gnu.so
  copying build/lib/ext/_C.so -> build/bdist
"""

# setuptools without ninja: the compiler's command line before each file, no total
SETUPTOOLS_BUILD = """\
building 'demo._C' extension
creating build/temp.linux-x86_64-cpython-311/csrc
gcc -pthread -fno-strict-overflow -fPIC -Icsrc -c csrc/a.cpp -o build/temp/csrc/a.o -std=c++17
csrc/a.cpp: In function 'int f()':
csrc/a.cpp:4:1: error: no return statement [-Werror=return-type]
sccache g++ -pthread -fPIC -Icsrc -c csrc/sub/b.cc -o build/temp/csrc/sub/b.o
g++ -pthread -shared build/temp/csrc/a.o build/temp/csrc/sub/b.o -o build/lib/demo/_C.so
"""


def states(text: str, root: Path | None = ROOT) -> list[tuple[int, int | None, str]]:
    reader = CompileOutput(root)
    seen = []
    for line in text.splitlines():
        if reader.feed(line):
            s = reader.state
            seen.append((s.done, s.total, s.current))
    reader.finished()
    seen.append((reader.state.done, reader.state.total, "end"))
    return seen


def test_ninja_lines_give_files_done_of_total_and_the_file():
    assert states(NINJA_BUILD) == [
        (1, 3, "csrc/cpu/nms_kernel.cpp"), (2, 3, "csrc/cpu/roi_align_kernel.cpp"),
        (3, 3, "csrc/cuda/nms.cu"), (3, 3, "linking"), (3, 3, "end")]


def test_compiler_lines_count_each_file_when_the_next_one_starts():
    assert states(SETUPTOOLS_BUILD, None) == [
        (0, None, "csrc/a.cpp"), (1, None, "csrc/sub/b.cc"), (2, None, "linking"),
        (2, None, "end")]


def test_cmake_descriptions_and_percentages_name_the_source():
    cmake = ("[2/5] Building CXX object CMakeFiles/_C.dir/src/ops/foo.cpp.o\n"
             "[ 40%] Building CXX object CMakeFiles/_C.dir/src/bar.cu.o\n")
    assert states(cmake, None)[:2] == [(2, 5, "src/ops/foo.cpp"), (40, 100, "src/bar.cu")]


def test_messages_that_look_like_commands_are_not_files():
    noise = ("  error: command 'g++' failed\n  c++: fatal error: no input files\n"
             "  [5/3] not ninja\n  ninja: build stopped: subcommand failed.\n")
    assert states(noise) == [(0, None, "end")]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path / "cache"))
    progress.set_quiet(False)
    yield tmp_path / "cache"
    progress.set_quiet(False)


def run_compile(text: str, monkeypatch, *, ci: str | None = "1") -> str:
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    out = io.StringIO()
    with compile_progress("compile the extension", ROOT, "cpu", stream=out) as feed:
        for line in text.splitlines(keepends=True):
            feed(line)
    return out.getvalue()


def test_a_log_gets_one_plain_line_per_file_and_the_next_build_an_estimate(cache, monkeypatch):
    first = run_compile(NINJA_BUILD, monkeypatch)
    lines = first.splitlines()
    assert not ESCAPE.search(first)
    assert [ln.split(": ", 2)[2].split(" (")[0] for ln in lines[:-1]] == [
        "1/3 files csrc/cpu/nms_kernel.cpp", "2/3 files csrc/cpu/roi_align_kernel.cpp",
        "3/3 files csrc/cuda/nms.cu", "3/3 files linking"]
    assert lines[-1].startswith("opforge: compile the extension (3/3 files, ")
    recorded = last_build(record_path(ROOT, "cpu"))
    assert recorded is not None and recorded["files"] == 3
    # the next build of the variant: what is left, from the last one; setuptools' lines get
    # the last build's count as their total
    again = run_compile(SETUPTOOLS_BUILD, monkeypatch)
    assert "0/3 files csrc/a.cpp" in again and "left (last time " in again
    assert not ESCAPE.search(again)


def test_a_damaged_record_is_no_estimate(cache, monkeypatch):
    path = record_path(ROOT, "cpu")
    path.parent.mkdir(parents=True)
    for junk in ("{", "[]", '{"seconds": -1, "files": 2}', '{"seconds": 5, "files": true}'):
        path.write_text(junk)
        assert last_build(path) is None, junk
    assert "last time" not in run_compile(NINJA_BUILD, monkeypatch)


def test_quiet_shows_nothing(cache, monkeypatch):
    progress.set_quiet(True)
    assert run_compile(NINJA_BUILD, monkeypatch) == ""
    out = io.StringIO()
    with progress.step("installed torch", stream=out):
        pass
    with progress.transfer("downloaded torch.whl", 10, stream=out) as advance:
        advance(10)
    assert out.getvalue() == ""


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_a_live_line_that_ends_checked(cache, monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    out = _Terminal()
    with compile_progress("compile the extension", ROOT, "cpu", stream=out) as feed:
        for line in NINJA_BUILD.splitlines():
            feed(line)
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())
    assert "✓ compile the extension (3/3 files, " in plain


def test_a_failed_compile_shows_its_last_lines_not_only_the_log(tmp_path, capsys):
    script = "import sys\nfor i in range(40): print(f'line {i}')\nsys.exit(3)\n"
    log = tmp_path / "build.log"
    with pytest.raises(OpforgeError, match=r"compile failed with exit 3 \(full log: "):
        build._run([sys.executable, "-c", script], {}, lambda *a: None, "compile",
                   logfile=log)
    err = capsys.readouterr().err
    assert f"opforge: compile failed; its last 20 lines ({log}):" in err
    shown = [ln[4:] for ln in err.splitlines() if ln.startswith("  | ")]
    assert shown == [f"line {i}" for i in range(20, 40)]
    assert log.read_text().count("\n") == 40


# --- the command line: a build that fails at once (a setup.py that raises) ------------------


@pytest.fixture
def failing_project(tmp_path):
    torch = pytest.importorskip("torch")
    (tmp_path / "setup.py").write_text(textwrap.dedent("""\
        import sys
        for i in range(30):
            print(f"setup says {i}", flush=True)
        print("\\x1b[31mcsrc/f.cpp:1:1: error: expected ';'\\x1b[0m", flush=True)
        sys.exit(1)
    """))
    version = torch.__version__.split("+")[0]
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text(matrix_yaml("failing", ["f"], distribution="failing", recipes=None,
                                  version=version, index=None,
                                  python="{}.{}".format(*sys.version_info)))
    return matrix


@pytest.mark.parametrize("quiet", [False, True])
def test_build_in_a_ci_log_has_no_control_characters_and_shows_the_failures_tail(
        failing_project, tmp_path, capsys, monkeypatch, quiet, cache):
    monkeypatch.setenv("CI", "1")
    argv = ["build", "--variant", "cpu", "--file", str(failing_project), "--python",
            sys.executable, "--no-install", "--no-compiler-cache", "--work-dir",
            str(tmp_path / "w"), "--out", str(tmp_path / "dist")]
    code = main(["-q", *argv] if quiet else argv)
    out, err = capsys.readouterr()
    assert code == 1
    assert not ESCAPE.search(out + err) and "\\x1b" not in err  # nor escaped into view
    tail = [ln[4:].strip() for ln in err.splitlines() if ln.startswith("  | ")]
    assert "setup says 29" in tail and "csrc/f.cpp:1:1: error: expected ';'" in tail
    assert err.strip().splitlines()[-1].startswith(
        "opforge build: error: compile the extension into a wheel failed with exit 1")
    said = out + "\n".join(ln for ln in err.splitlines()
                          if not ln.startswith(("  | ", "opforge build: error:",
                                                "opforge: compile the extension into a wheel failed")))
    if quiet:
        assert said.strip() == ""
    else:
        assert "opforge build: torch " in said  # the step lines a log shows


def test_the_record_of_a_build_is_kept_per_project_and_variant(cache):
    assert record_path(ROOT, "cpu") != record_path(ROOT, "cu130")
    assert record_path(ROOT, "cpu").parent == cache / "builds"
    assert json.dumps(last_build(cache / "builds" / "missing.json")) == "null"


def _wait_for(out: io.StringIO, words: str) -> None:
    import time

    for _ in range(200):  # the heartbeat's outcome, not its timing
        if words in out.getvalue():
            return
        time.sleep(0.05)


def test_a_log_hears_from_a_long_step_before_it_ends(cache, monkeypatch):
    monkeypatch.setenv("CI", "1")
    monkeypatch.setattr(progress, "HEARTBEAT_S", 0.05)
    out = io.StringIO()
    with progress.step("installed torch with uv", stream=out):
        _wait_for(out, "not done yet")
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("opforge: installed torch with uv: not done yet (")
    assert lines[-1].startswith("opforge: installed torch with uv (")
    out = io.StringIO()
    with compile_progress("compile the extension", ROOT, "cpu", stream=out) as feed:
        feed(NINJA_BUILD.splitlines()[1])
        _wait_for(out, "\n" * 2)  # a second line: one .cu compiling for minutes says so
    assert out.getvalue().splitlines()[1].startswith(
        "opforge: compile the extension: 1/3 files csrc/cpu/nms_kernel.cpp (")
    progress.set_quiet(True)
    quiet_out = io.StringIO()
    with progress.step("installed torch with uv", stream=quiet_out):
        import time

        time.sleep(0.2)
    assert quiet_out.getvalue() == ""
