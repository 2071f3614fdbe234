"""The recipes file as text: which entries are stubs, and the file with some of them replaced
by derived recipes. Pure: text in, text out.

An entry is a stub when its dict literal has ``"stub": True``. A derived entry keeps the
stub's other fields (``mutates``, ``skip``, ``devices``, ...) as they are written, gets the
derived ``inputs`` and ``"derived": True`` in place of ``"stub"``. A stub no call was found
for stays as it is, under a ``# derive:`` comment giving the error its best try ended on.
Authored entries, comments and everything else in the file are left byte for byte.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

from opforge.errors import UsageError

TABLES = ("RECIPES", "FUNCTIONS")
NOTE = "# derive:"
WIDTH = 99


@dataclass
class Entry:
    table: str
    key: str
    first: int             # the entry's first line (0-based, in text.splitlines())
    last: int              # its last line
    indent: str
    fields: list[tuple[str, str]] = field(default_factory=list)  # kept fields: name, source
    comment: str | None = None      # the "# schema" line above it, if any
    note: int | None = None         # the line of an earlier "# derive:" comment
    mutates: list[int] | None = None
    devices: list[str] | None = None
    overload: str | None = None


def stub_entries(text: str, label: str = "recipes file") -> list[Entry]:
    """The stub entries of RECIPES and FUNCTIONS, each on lines of its own."""
    try:
        tree = ast.parse(text)
    except SyntaxError as exc:
        raise UsageError(f"{label}:{exc.lineno}: does not parse as Python ({exc.msg})") from None
    lines = text.splitlines()
    entries = []
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id in TABLES
                and isinstance(node.value, ast.Dict)):
            continue
        table = node.targets[0].id
        for key, value in zip(node.value.keys, node.value.values):
            if not (isinstance(key, ast.Constant) and isinstance(key.value, str)
                    and isinstance(value, ast.Dict) and _is_stub(value)):
                continue
            entry = _entry(table, key, value, text, lines)
            if entry is not None:
                entries.append(entry)
    return entries


def _is_stub(value: ast.Dict) -> bool:
    return any(isinstance(k, ast.Constant) and k.value == "stub" and isinstance(v, ast.Constant)
               and v.value is True for k, v in zip(value.keys, value.values))


def _entry(table: str, key: ast.Constant, value: ast.Dict, text: str,
           lines: list[str]) -> Entry | None:
    first, last = key.lineno - 1, value.end_lineno - 1
    head = lines[first][:key.col_offset]
    tail = lines[last][value.end_col_offset:]
    if head.strip() or not re.fullmatch(r"\s*,?\s*(?:#.*)?", tail):
        return None  # shares its lines with another entry: left alone
    entry = Entry(table, key.value, first, last, head)
    for k, v in zip(value.keys, value.values):
        if not isinstance(k, ast.Constant) or k.value in ("inputs", "stub", "derived"):
            continue
        entry.fields.append((k.value, ast.get_source_segment(text, v) or "None"))
        try:
            literal = ast.literal_eval(v)
        except ValueError:
            continue
        if k.value == "mutates" and isinstance(literal, list):
            entry.mutates = [i for i in literal if isinstance(i, int)]
        elif k.value == "devices" and isinstance(literal, list):
            entry.devices = [d for d in literal if isinstance(d, str)]
        elif k.value == "overload" and isinstance(literal, str):
            entry.overload = literal
    above = first - 1
    if above >= 0 and lines[above].strip().startswith(NOTE):
        entry.note = above
        above -= 1
    if above >= 0 and lines[above].strip().startswith("#"):
        entry.comment = lines[above].strip()[1:].strip()
    return entry


def derived_lines(entry: Entry, exprs: list[str]) -> list[str]:
    """The derived entry: plain readable Python, one line when it fits."""
    indent = entry.indent
    inputs = f"lambda dtype: [{', '.join(exprs)}]"
    fields = [("inputs", inputs), *entry.fields, ("derived", "True")]
    one = f"{indent}{_quote(entry.key)}: {{" + ", ".join(
        f'"{k}": {v}' for k, v in fields) + "},"
    if len(one) <= WIDTH and "\n" not in one:
        return [one]
    inner = indent + "    "
    out = [f"{indent}{_quote(entry.key)}: {{"]
    for name, source in fields:
        line = f'{inner}"{name}": {source},'
        if name == "inputs" and len(line) > WIDTH:
            out.append(f'{inner}"inputs": lambda dtype: [')
            out += [f"{inner}    {e}," for e in exprs]
            out.append(f"{inner}],")
        else:
            out += line.splitlines()
    return out + [f"{indent}}},"]


def _quote(key: str) -> str:
    return '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'


def note_line(entry: Entry, tries: int, error: str) -> str:
    error = re.sub(r"[\x00-\x1f\x7f]+", " ", error).strip()
    text = f"{entry.indent}{NOTE} no working call in {tries} tries; the best ended on: {error}"
    return text if len(text) <= 240 else text[:237] + "..."


def rewrite(text: str, replacements: dict[tuple[str, str], list[str]],
            notes: dict[tuple[str, str], str], entries: list[Entry]) -> str:
    """The file with each (table, key) in ``replacements`` written as those lines and a note
    above each one in ``notes``; an earlier note of a replaced or noted entry goes."""
    lines = text.splitlines()
    ending = "\n" if text.endswith("\n") else ""
    for entry in sorted(entries, key=lambda e: e.first, reverse=True):
        where = (entry.table, entry.key)
        if where not in replacements and where not in notes:
            continue
        body = replacements.get(where, lines[entry.first:entry.last + 1])
        start = entry.note if entry.note is not None else entry.first
        head = [notes[where]] if where in notes else []
        lines[start:entry.last + 1] = head + body
    return "\n".join(lines) + ending
