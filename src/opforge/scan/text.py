"""The source walk and the text helpers every reader shares: reading a file (bounded),
brackets, comments, lines, comma lists, an op's qualified name."""

from __future__ import annotations

import re
from pathlib import Path

from opforge.errors import UsageError
from opforge.files import read_head
from opforge.scan.model import SKIP_DIRS

MAX_SOURCE_BYTES = 8 << 20  # more than any source file; a bigger one is read this far only


def read_source(path: Path) -> str:
    """A source file's text, its first MAX_SOURCE_BYTES at most, read in chunks (a 3 GB or
    sparse file costs no more); a file that cannot be read (a FIFO, a device) reads as empty."""
    try:
        return read_head(path, MAX_SOURCE_BYTES).decode("utf-8", errors="replace")
    except UsageError:
        return ""


def source_files(root: Path):
    """Every file under ``root``, in order, outside SKIP_DIRS and hidden directories."""
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if any(part in SKIP_DIRS or part.startswith(".") for part in rel.parts[:-1]):
            continue
        if path.is_file():
            yield path


def closing(text: str, start: int, open_: str = "{", close: str = "}") -> int:
    """The index of the bracket that closes the one at ``start`` (or len(text))."""
    depth, i = 0, start
    while i < len(text):
        if text[i] == '"':  # skip string literals: a schema may hold brackets
            i += 1
            while i < len(text) and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif text[i] == open_:
            depth += 1
        elif text[i] == close:
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return i


def strip_comments(text: str) -> str:
    """The text without its comments; a block comment keeps its line breaks, so a line
    number in the stripped text is the file's."""
    text = re.sub(r"/\*.*?\*/", lambda m: " " + "\n" * m.group().count("\n"), text,
                  flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def line_of(text: str, index: int) -> int:
    return text.count("\n", 0, index) + 1


def schema_name(schema: str) -> tuple[str | None, str]:
    """'ns::name.overload(Tensor x) -> Tensor' -> ('ns', 'name')."""
    head = schema.split("(", 1)[0].strip()
    ns, _, name = head.rpartition("::")
    return (ns or None), name.split(".", 1)[0]


def split_top(text: str) -> list[str]:
    """Split on commas outside <>, (), [] and {}."""
    parts, depth, current = [], 0, ""
    for ch in text:
        if ch in "<([{":
            depth += 1
        elif ch in ">)]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += ch
    if current.strip():
        parts.append(current.strip())
    return parts
