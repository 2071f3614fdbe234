"""Argument types more than one command takes."""

from __future__ import annotations


def comma_list(text: str) -> tuple[str, ...]:
    """``a, b,,c`` -> ("a", "b", "c"): the items of a comma-separated option, blanks dropped."""
    return tuple(x.strip() for x in text.split(",") if x.strip())
