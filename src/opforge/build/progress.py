"""Where a compile is, read from the build's own output; how long the variant's last one took.

The build systems opforge runs say which file they compile, each in its own words:

* ninja (torch's cpp_extension, CMake's Ninja generator): ``[k/N] <command or description>``
  when a job ends, so k files of N are done and the line names the one just finished;
* setuptools / distutils without ninja: the compiler's command line before each file
  (``g++ ... -c csrc/x.cpp -o x.o``), with no total: the last build's count stands in;
* CMake's Makefile generator: ``[ 42%] Building CXX object .../x.cpp.o``.

``CompileOutput`` is the pure reader of those lines. ``compile_progress`` shows it through
``opforge.progress.tally`` (a live line in a terminal, a line per file in a log) with an
estimate from the last build of the same project and variant, kept under the cache directory
(``<cache>/builds/<project>-<variant>.json``); a build that succeeds records its own.
"""

from __future__ import annotations

import json
import re
import shlex
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from opforge.errors import OpforgeError
from opforge.files import read_json, write_file
from opforge.paths import cache_dir
from opforge.progress import Tally, tally

SOURCE_SUFFIXES = (".c", ".cc", ".cpp", ".cxx", ".c++", ".cu", ".hip", ".m", ".mm", ".metal")
_NINJA = re.compile(r"^\s*\[(\d+)/(\d+)\]\s*(.*)$")
_MAKE = re.compile(r"^\s*\[\s*(\d{1,3})%\]\s+(Building|Linking)\b(.*)$")
_COMPILER = re.compile(r"(?:^|[-/\\])(?:gcc|g\+\+|c\+\+|cc|clang|clang\+\+|nvcc|hipcc|icpx|"
                       r"icx|cl)(?:-\d+(?:\.\d+)*)?(?:\.exe)?$")
_LAUNCHERS = ("sccache", "ccache")
RECORDS = "builds"
_RECORD_LIMIT = 64 << 10


@dataclass
class CompileState:
    done: int = 0                 # files compiled
    total: int | None = None      # files in all (ninja's N); None: not said
    current: str = ""             # the file compiling (just compiled, for ninja), or "linking"
    style: str | None = None      # "ninja", "compiler" or "make": whose lines these are


class CompileOutput:
    """Reads a build's output line by line; ``feed`` says whether the state moved."""

    def __init__(self, root: Path | None = None):
        self.root = Path(root).resolve() if root else None
        self.state = CompileState()
        self._compiling = False  # a compiler line was seen and its file not counted yet

    def feed(self, line: str) -> bool:
        state = self.state
        text = line.strip()
        if not text:
            return False
        m = _NINJA.match(text)
        if m:
            done, total, rest = int(m.group(1)), int(m.group(2)), m.group(3)
            if total <= 0 or done > total:
                return False
            state.style, state.done, state.total = "ninja", done, total
            source = self.source_of(rest)
            state.current = source or ("linking" if _links(rest) else _short(rest))
            return True
        m = _MAKE.match(text)
        if m:
            state.style = "make"
            state.done, state.total = int(m.group(1)), 100
            target = self.source_of(m.group(3))
            state.current = "linking" if m.group(2) == "Linking" else (target or "")
            return True
        words = _words(text)
        compiler = _compiler_at(words)
        if compiler is None:
            return False
        args = words[compiler + 1:]
        if state.style in ("ninja", "make"):
            # ninja's verbose command lines (-v) repeat what [k/N] said; the link after it
            # (setuptools links outside ninja) is news
            if "-c" in args or not _links(text) or state.current == "linking":
                return False
            state.current = "linking"
            return True
        state.style = "compiler"
        if "-c" in args or "--compile" in args:
            if self._compiling:
                state.done += 1
            self._compiling = True
            state.current = self.source_of(text) or state.current
            return True
        if _links(text):
            if self._compiling:
                state.done += 1
                self._compiling = False
            state.current = "linking"
            return True
        return False

    def finished(self) -> None:
        """The build ended: the file a compiler line named last is done too."""
        if self._compiling:
            self.state.done += 1
            self._compiling = False

    def source_of(self, command: str) -> str | None:
        """The source file a command line (or a CMake description) names, as a short path."""
        words = _words(command)
        found = None
        for i, word in enumerate(words):
            name = re.sub(r"^.*?CMakeFiles/[^/]+\.dir/", "", re.sub(r"\.(o|obj)$", "", word))
            if name.lower().endswith(SOURCE_SUFFIXES):
                found = name
                if i > 0 and words[i - 1] == "-c":
                    break
        return self.short(found) if found else None

    def short(self, path: str) -> str:
        p = Path(path)
        if self.root is not None and p.is_absolute():
            try:
                return p.resolve().relative_to(self.root).as_posix()
            except (ValueError, OSError):
                pass
        parts = p.parts
        return "/".join(parts[-3:]) if len(parts) > 3 else p.as_posix()


def _words(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError:  # an unbalanced quote: a compiler's message, not a command
        return text.split()


def _compiler_at(words: list[str]) -> int | None:
    """The index of the compiler in a command line (after a cache launcher), or None."""
    for i, word in enumerate(words[:2]):
        name = word.rsplit("/", 1)[-1]
        if i == 0 and name in _LAUNCHERS:
            continue
        return i if _COMPILER.search(word) else None
    return None


def _links(text: str) -> bool:
    return " -shared" in text or "Linking" in text or bool(re.search(r"-o \S+\.(so|dylib|pyd)\b",
                                                                     text))


def _short(text: str) -> str:
    return text if len(text) <= 60 else text[:57] + "..."


# -- the last build's duration -------------------------------------------------------------

def project_name(extension_dir: Path) -> str:
    """pyproject.toml's [project] name, else the folder's name: what records are kept by."""
    # tomllib (~2 ms) when a pyproject.toml is read: build/progress is on the CLI's startup path
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    name = None
    try:
        with open(Path(extension_dir) / "pyproject.toml", "rb") as fh:
            name = tomllib.load(fh).get("project", {}).get("name")
    except (OSError, ValueError, AttributeError):
        pass
    name = name if isinstance(name, str) and name else Path(extension_dir).resolve().name
    return re.sub(r"[^A-Za-z0-9_.]+", "-", name).strip("-.").lower() or "project"


def record_path(extension_dir: Path, variant: str, root: Path | None = None) -> Path:
    safe = re.sub(r"[^A-Za-z0-9_.]+", "-", variant).strip("-.") or "variant"
    return (root or cache_dir()) / RECORDS / f"{project_name(extension_dir)}-{safe}.json"


def last_build(path: Path) -> dict | None:
    """The record a build wrote (seconds, files), or None: missing, unreadable or not ours."""
    try:
        data = read_json(path, limit=_RECORD_LIMIT)
    except (OpforgeError, OSError):
        return None
    if not isinstance(data, dict):
        return None
    seconds, files = data.get("seconds"), data.get("files")
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or \
            not 0 < seconds < 7 * 86400:
        return None
    if not (type(files) is int and 0 <= files < 1_000_000):
        return None
    return {"seconds": float(seconds), "files": files}


def remember(path: Path, seconds: float, files: int, root: Path | None = None) -> None:
    """Record this build for the next one's estimate; a cache that cannot be written is
    only a missing estimate next time."""
    data = {"schema": 1, "seconds": max(round(seconds, 2), 0.01), "files": files,
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    root = root or cache_dir()
    try:
        root.mkdir(parents=True, exist_ok=True)
        write_file(path, json.dumps(data) + "\n", root=root)
    except (OpforgeError, OSError):
        pass


@contextmanager
def compile_progress(what: str, extension_dir: Path, variant: str,
                     stream=None) -> Iterator[CompileFeed]:
    """Show a compile as its output comes (``feed(line)``); record its time when it
    succeeds."""
    path = record_path(extension_dir, variant)
    last = last_build(path)
    reader = CompileOutput(extension_dir)
    with tally(what, total=None, estimate_s=last["seconds"] if last else None, unit="files",
               stream=stream) as shown:
        feed = CompileFeed(reader, shown, last["files"] if last and last["files"] else None)
        yield feed
        reader.finished()
        feed.show()
    remember(path, shown.elapsed(), reader.state.done)


class CompileFeed:
    """What the build's output goes through on its way to build.log."""

    def __init__(self, reader: CompileOutput, shown: Tally, recorded_total: int | None):
        self.reader, self.shown, self.recorded_total = reader, shown, recorded_total

    def __call__(self, line: str) -> None:
        if self.reader.feed(line):
            self.show()

    def show(self) -> None:
        state = self.reader.state
        if state.style == "make":  # CMake's Makefiles say a share of the whole, not files
            self.shown.update(current=f"{state.done}% {state.current}".strip())
            return
        total = state.total
        if total is None and self.recorded_total and state.done < self.recorded_total:
            total = self.recorded_total  # setuptools says no total: the last build's count
        self.shown.update(done=state.done, total=total, current=state.current)
