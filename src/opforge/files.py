"""Guarded reads of user-named files, and up-front checks of where reports will be written.

Every file opforge reads on a user's behalf (matrix.yaml, a bisect state, a smoke report, an
index page on disk) goes through ``read_bytes`` / ``read_text`` / ``read_json`` /
``compose_yaml``: regular files only (a FIFO, a directory or a device is refused without
blocking: the open is non-blocking and the type is checked on the open descriptor), a size
limit, strict UTF-8 with the line and column of the first bad byte, JSON and YAML nesting
limits, and no YAML tags. Each failure is a ``UsageError`` (exit 2) whose message starts with
what the user named, e.g. ``--file /tmp/pipe: a FIFO, not a regular file``.

``check_writable`` answers, before any work starts, whether a report can later be written to
a path: its folder exists (or can be made) and is writable, and the path is not a directory.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any, BinaryIO

import yaml

from opforge.errors import UsageError

MAX_TEXT_BYTES = 16 << 20   # a matrix, a state file or an index page is far smaller
MAX_DEPTH = 64              # YAML nesting (JSON's decoder stops at the recursion limit)
MAX_YAML_NODES = 200_000    # after expanding aliases ("billion laughs")

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


def _label(path: Path, what: str | None) -> str:
    return f"{what} {path}" if what else str(path)


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def open_problem(exc: OSError) -> str:
    """A few words for why a path could not be opened."""
    if exc.errno == errno.ENOENT:
        return "no such file"
    if exc.errno == errno.ELOOP:
        return "a symbolic link loop"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    if exc.errno == errno.ENOTDIR:
        return "a parent of it is not a directory"
    if exc.errno == errno.EISDIR:
        return "a directory, not a regular file"
    if exc.errno == errno.ENXIO:
        return "not a regular file (a socket or a device without a reader)"
    if exc.errno == errno.ENAMETOOLONG:
        return "the name is too long"
    return exc.strerror or str(exc)


def open_regular(path: str | os.PathLike, *, what: str | None = None,
                 limit: int | None = None) -> BinaryIO:
    """An open binary file, if ``path`` is a regular file (of at most ``limit`` bytes).

    The open never blocks (a FIFO is refused, not waited on) and the type is checked on the
    open descriptor, so the file cannot be swapped between the check and the read.
    """
    path = Path(path)
    label = _label(path, what)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except (OSError, ValueError) as exc:  # ValueError: an embedded NUL byte
        problem = open_problem(exc) if isinstance(exc, OSError) else "not a valid path"
        raise UsageError(f"{label}: {problem}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UsageError(f"{label}: {_kind(info.st_mode)}, not a regular file")
        if limit is not None and info.st_size > limit:
            raise UsageError(f"{label}: {info.st_size} bytes, more than the {limit}-byte limit")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path: str | os.PathLike, *, what: str | None = None,
               limit: int = MAX_TEXT_BYTES) -> bytes:
    """The whole file, if it is a regular file of at most ``limit`` bytes."""
    label = _label(Path(path), what)
    with open_regular(path, what=what, limit=limit) as fh:
        try:
            data = fh.read(limit + 1)
        except OSError as exc:
            raise UsageError(f"{label}: cannot read: {exc.strerror or exc}") from None
    if len(data) > limit:  # it grew while we read
        raise UsageError(f"{label}: more than the {limit}-byte limit")
    return data


def decode_utf8(data: bytes, label: str) -> str:
    """Strict UTF-8 (a leading byte-order mark is dropped); the error names line and column."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        before = data[:exc.start]
        line = before.count(b"\n") + 1
        column = exc.start - (before.rfind(b"\n") + 1) + 1
        raise UsageError(f"{label}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x} at "
                         f"column {column})") from None


def read_text(path: str | os.PathLike, *, what: str | None = None,
              limit: int = MAX_TEXT_BYTES) -> str:
    text = decode_utf8(read_bytes(path, what=what, limit=limit), _label(Path(path), what))
    if "\x00" in text:
        raise UsageError(f"{_label(Path(path), what)}: holds NUL bytes; not a text file")
    return text


def parse_json(text: str | bytes, label: str) -> Any:
    """JSON with a nesting limit; every failure is one UsageError line."""
    if isinstance(text, bytes):
        text = decode_utf8(text, label)
    try:
        return json.loads(text, parse_constant=_no_constant)
    except RecursionError:  # the decoder recurses once per level
        raise UsageError(f"{label}: nests too deeply") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"{label}:{exc.lineno}: not valid JSON ({exc.msg})") from None
    except ValueError as exc:
        raise UsageError(f"{label}: not valid JSON ({exc})") from None


def read_json(path: str | os.PathLike, *, what: str | None = None,
              limit: int = MAX_TEXT_BYTES) -> Any:
    return parse_json(read_text(path, what=what, limit=limit), _label(Path(path), what))


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def compose_yaml(text: str, label: str, *, max_depth: int = MAX_DEPTH,
                 max_nodes: int = MAX_YAML_NODES) -> yaml.Node | None:
    """The document's node tree, after refusing tags, deep nesting and alias bombs.

    ``label`` is the file name used in ``label:line: (yaml): problem`` messages.
    """
    def fail(mark, problem: str) -> UsageError:
        line = mark.line + 1 if mark is not None else 0
        return UsageError(f"{label}:{line}: (yaml): {problem}")

    try:
        depth, nodes = 0, 0
        sizes: dict[str, int] = {}           # anchor -> nodes it expands to
        open_anchors: list[tuple[str | None, int]] = []
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            tag = getattr(event, "tag", None)
            if tag is not None and tag != "!" and not isinstance(event, yaml.DocumentStartEvent):
                raise fail(event.start_mark, f"tags are not allowed (found {tag!r})")
            if isinstance(event, yaml.AliasEvent):
                if event.anchor not in sizes:
                    raise fail(event.start_mark, f"alias *{event.anchor} refers to an "
                                                 "unfinished or unknown anchor")
                nodes += sizes[event.anchor]
            elif isinstance(event, (yaml.ScalarEvent, yaml.CollectionStartEvent)):
                nodes += 1
                if isinstance(event, yaml.ScalarEvent):
                    if event.anchor:
                        sizes[event.anchor] = 1
                else:
                    depth += 1
                    if depth > max_depth:
                        raise fail(event.start_mark, f"nests deeper than {max_depth} levels")
                    open_anchors.append((event.anchor, nodes))
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
                anchor, start = open_anchors.pop()
                if anchor:
                    sizes[anchor] = nodes - start + 1
            if nodes > max_nodes:
                raise fail(getattr(event, "start_mark", None),
                           f"expands to more than {max_nodes} nodes (aliases?)")
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "invalid YAML"
        raise fail(mark, problem) from None
    except yaml.YAMLError as exc:
        raise UsageError(f"{label}:0: (yaml): {' '.join(str(exc).split())}") from None
    except RecursionError:
        raise UsageError(f"{label}:0: (yaml): nests too deeply") from None


def check_writable(path: str | os.PathLike, *, what: str, append: bool = False,
                   make_folders: bool = True) -> Path:
    """Fail now, not after the work, if a report could not be written to ``path``.

    The path must not be a directory (or anything but a regular file when it exists; a FIFO
    is fine for ``append``); an existing file is opened for appending (its content and time
    stamps are left alone), otherwise a scratch file is made and removed in the nearest
    existing folder, so a read-only mount or a folder the user cannot write is found too.
    ``make_folders=False``: the writer creates no folders, so the parent must exist.
    """
    path = Path(path).expanduser()
    label = f"{what} {path}"
    try:
        info = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):  # the walk below names the culprit
        info = None
    except (OSError, ValueError) as exc:
        problem = open_problem(exc) if isinstance(exc, OSError) else "not a valid path"
        raise UsageError(f"{label}: {problem}") from None
    if info is not None:
        if stat.S_ISDIR(info.st_mode):
            raise UsageError(f"{label}: is a directory; give a file path")
        if stat.S_ISFIFO(info.st_mode) and append:
            return path
        if not stat.S_ISREG(info.st_mode):
            raise UsageError(f"{label}: {_kind(info.st_mode)}, not a regular file")
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)))
        except OSError as exc:
            raise UsageError(f"{label}: not writable ({open_problem(exc)})") from None
        return path
    folder = path.parent
    while True:  # the nearest existing ancestor decides whether the folders can be made
        try:
            info = os.stat(folder)
        except (FileNotFoundError, NotADirectoryError):
            if not make_folders and folder == path.parent:
                raise UsageError(f"{label}: no folder {folder}") from None
            if folder.parent == folder:
                raise UsageError(f"{label}: no existing folder above it") from None
            folder = folder.parent
            continue
        except OSError as exc:
            raise UsageError(f"{label}: {open_problem(exc)}") from None
        if not stat.S_ISDIR(info.st_mode):
            raise UsageError(f"{label}: {folder} is not a directory")
        break
    try:
        fd, scratch = tempfile.mkstemp(prefix=".opforge-write-check-", dir=folder)
    except OSError as exc:
        raise UsageError(f"{label}: {folder} is not writable ({open_problem(exc)})") from None
    os.close(fd)
    os.unlink(scratch)
    return path


def write_atomic(path: str | os.PathLike, data: str | bytes) -> None:
    """Write a report whole or not at all: a scratch file beside it, then a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and not path.is_file():  # a FIFO or a device: write through it
        with open(path, "wb") as fh:
            fh.write(data.encode("utf-8") if isinstance(data, str) else data)
        return
    fd, scratch = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.replace(scratch, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(scratch)
        raise


def lookup(path: str | os.PathLike, *, what: str) -> os.stat_result | None:
    """``os.stat`` of a user-named path: None when nothing is there, a UsageError when the
    name itself is unusable (too long, a symlink loop, a parent that is a file...)."""
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        problem = open_problem(exc) if isinstance(exc, OSError) else "not a valid path"
        raise UsageError(f"{what} {path}: {problem}") from None
