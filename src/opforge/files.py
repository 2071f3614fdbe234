"""Guarded reads of user-named files, and up-front checks of where reports will be written.

Every file opforge reads on a user's behalf (matrix.yaml, a bisect state, a smoke report, an
index page on disk) goes through ``read_bytes`` / ``read_text`` / ``read_json`` /
``opforge.yamlsafe``: regular files only (a FIFO, a directory or a device is refused without
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
import secrets
import stat
import tempfile
from pathlib import Path
from typing import Any, BinaryIO

from opforge.errors import UsageError
from opforge.yamlsafe import compose

MAX_TEXT_BYTES = 16 << 20   # a matrix, a state file or an index page is far smaller

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


def write_atomic(path: str | os.PathLike, data: str | bytes, *, what: str | None = None,
                 fsync: bool = False) -> None:
    """Write a report whole or not at all: a scratch file beside it, then a rename.

    An existing FIFO or character device (``--json /dev/stdout``) is written through, without
    blocking when nothing reads it; a link the user named is followed; anything else goes
    through ``write_file``.
    """
    path = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    info = lookup(path, what=what or "output")
    if info is not None and (stat.S_ISFIFO(info.st_mode) or stat.S_ISCHR(info.st_mode)):
        flags = os.O_WRONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(path, flags)
        except OSError as exc:
            raise UsageError(f"{_label(path, what)}: {open_problem(exc)}") from None
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
        return
    if os.path.islink(path):
        # a report path the user named as a link: written where the link points, as a shell
        # redirection would (files opforge places itself, write_file(root=...), never follow)
        path = Path(os.path.realpath(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    write_file(path, payload, what=what, fsync=fsync)


# -- writes that cannot escape their folder ---------------------------------------------------

_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def _open_folder(parts: tuple[str, ...], root: Path, *, make: bool, label: str) -> int:
    """A descriptor of ``root/parts...``, each part opened without following a symbolic link
    (made when ``make``); a link, a file or a FIFO on the way is refused with one line."""
    try:
        fd = os.open(root, _DIR_FLAGS)
    except OSError as exc:
        raise UsageError(f"{label}: {root}: {open_problem(exc)}") from None
    walked = root
    try:
        for part in parts:
            walked = walked / part
            try:
                info = os.stat(part, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                if not make:
                    raise UsageError(f"{label}: no folder {walked}") from None
                try:
                    os.mkdir(part, 0o777, dir_fd=fd)
                except FileExistsError:
                    pass
                except OSError as exc:
                    raise UsageError(f"{label}: cannot make {walked} "
                                     f"({open_problem(exc)})") from None
                info = os.stat(part, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISLNK(info.st_mode):
                raise UsageError(f"{label}: {walked} is a symbolic link; opforge writes only "
                                 f"into real folders under {root}")
            if not stat.S_ISDIR(info.st_mode):
                raise UsageError(f"{label}: {walked} is {_kind(info.st_mode)}, not a folder")
            try:
                child = os.open(part, _DIR_FLAGS | _NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                raise UsageError(f"{label}: {walked}: {open_problem(exc)}") from None
            os.close(fd)
            fd = child
        return fd
    except BaseException:
        os.close(fd)
        raise


def _split(path: Path, root: Path | None) -> tuple[Path, tuple[str, ...], str]:
    """(the folder walk starts at, the parts under it, the file name)."""
    if root is None:
        return path.parent, (), path.name
    try:
        rel = path.relative_to(root)
    except ValueError:
        raise UsageError(f"{path}: not under {root}; opforge writes only there") from None
    parts = rel.parts
    if not parts or any(p in ("..", ".", "") for p in parts):
        raise UsageError(f"{path}: not a file name under {root}")
    return root, parts[:-1], parts[-1]


def check_target(path: str | os.PathLike, *, root: str | os.PathLike | None = None,
                 what: str | None = None) -> bool:
    """Whether ``path`` exists; refused up front (one line) if it, or a folder between
    ``root`` and it, is a symbolic link, a FIFO, a directory or anything but what is expected.
    Nothing is created."""
    path = Path(path)
    base, parts, name = _split(path, Path(root) if root is not None else None)
    label = _label(path, what)
    walked = base
    for part in (*parts, name):
        walked = walked / part
        try:
            info = os.lstat(walked)
        except FileNotFoundError:
            return False
        except (OSError, ValueError) as exc:
            problem = open_problem(exc) if isinstance(exc, OSError) else "not a valid path"
            raise UsageError(f"{label}: {problem}") from None
        if stat.S_ISLNK(info.st_mode):
            raise UsageError(f"{label}: {walked} is a symbolic link; opforge does not write "
                             "through links (remove it, or write the file by hand)")
        if part is not name or walked != path:
            if not stat.S_ISDIR(info.st_mode):
                raise UsageError(f"{label}: {walked} is {_kind(info.st_mode)}, not a folder")
        elif not stat.S_ISREG(info.st_mode):
            raise UsageError(f"{label}: {_kind(info.st_mode)}, not a regular file; opforge "
                             "replaces only regular files")
    return True


def write_file(path: str | os.PathLike, data: str | bytes, *,
               root: str | os.PathLike | None = None, what: str | None = None,
               mode: int | None = None, fsync: bool = False) -> None:
    """Write ``path`` whole or not at all, so that it cannot land anywhere else.

    The file is made under an unpredictable name (O_EXCL, no-follow) in its own folder, then
    renamed over ``path``: a symbolic link, FIFO or directory at ``path`` is refused up front,
    never written through. With ``root``, every folder from ``root`` down is opened without
    following links (and made if missing), so a planted link cannot send the file elsewhere.
    An existing file keeps its permission bits unless ``mode`` says otherwise.
    """
    path = Path(path)
    label = _label(path, what)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    base, parts, name = _split(path, Path(root) if root is not None else None)
    folder = _open_folder(parts, base, make=root is not None, label=label)
    scratch = None
    try:
        try:
            info = os.stat(name, dir_fd=folder, follow_symlinks=False)
        except FileNotFoundError:
            info = None
        except OSError as exc:
            raise UsageError(f"{label}: {open_problem(exc)}") from None
        if info is not None and stat.S_ISLNK(info.st_mode):
            raise UsageError(f"{label}: a symbolic link; opforge does not write through links")
        if info is not None and not stat.S_ISREG(info.st_mode):
            raise UsageError(f"{label}: {_kind(info.st_mode)}, not a regular file")
        if mode is None and info is not None:
            mode = stat.S_IMODE(info.st_mode)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
        for _ in range(16):
            candidate = f".{name[:64]}.{secrets.token_hex(8)}.tmp"
            try:
                fd = os.open(candidate, flags, 0o666 if mode is None else 0o600,
                             dir_fd=folder)
            except FileExistsError:
                continue
            except OSError as exc:
                raise UsageError(f"{label}: cannot write in its folder "
                                 f"({open_problem(exc)})") from None
            scratch = candidate
            break
        else:
            raise UsageError(f"{label}: no free scratch name in its folder")
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
            fh.flush()
            if mode is not None:
                os.fchmod(fh.fileno(), mode)
            if fsync:
                os.fsync(fh.fileno())
        os.replace(scratch, name, src_dir_fd=folder, dst_dir_fd=folder)
        scratch = None
    finally:
        if scratch is not None:
            with contextlib.suppress(OSError):
                os.unlink(scratch, dir_fd=folder)
        os.close(folder)


# -- bounded reads ------------------------------------------------------------------------------

CHUNK = 1 << 16


def read_head(path: str | os.PathLike, limit: int, *, what: str | None = None) -> bytes:
    """At most ``limit`` bytes from the start of a regular file, read in chunks (a 3 GB file,
    a sparse one or one still growing costs ``limit`` bytes of memory, never more)."""
    out = bytearray()
    with open_regular(path, what=what) as fh:
        while len(out) < limit:
            try:
                chunk = fh.read(min(CHUNK, limit - len(out)))
            except OSError as exc:
                raise UsageError(f"{_label(Path(path), what)}: cannot read: "
                                 f"{exc.strerror or exc}") from None
            if not chunk:
                break
            out += chunk
    return bytes(out)


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


def compose_yaml(text: str, label: str, **limits: int):
    """``opforge.yamlsafe.compose`` (kept here for its older callers)."""
    return compose(text, label, **limits)
