"""What a requirement pins: the exact version of ``torch==X``, the floor of ``torch>=X``.

Read by the wheel checks (``opforge.wheels``: a wheel's torch requirement) and the library
floor (``opforge.floor``: the torch a report names) alike; it imports neither.
"""

from __future__ import annotations

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version


def _specifiers(requirement: str | None) -> list:
    """A requirement's version specifiers ([] for nothing or an unparsable requirement)."""
    if not requirement:
        return []
    try:
        return list(Requirement(requirement).specifier)
    except InvalidRequirement:
        return []


def exact_pin(requirement: str | None) -> Version | None:
    """The version of a ``torch==X`` requirement; None for a range, a wildcard or nothing."""
    specs = _specifiers(requirement)
    if len(specs) != 1 or specs[0].operator not in ("==", "===") or "*" in specs[0].version:
        return None
    try:
        return Version(specs[0].version)
    except InvalidVersion:
        return None


def floor_of(requirement: str | None) -> Version | None:
    """The version of a ``torch>=X`` requirement (an upper bound beside it is allowed)."""
    specs = _specifiers(requirement)
    lows = [s for s in specs if s.operator == ">="]
    if len(lows) != 1 or any(s.operator in ("==", "===", "~=") for s in specs):
        return None
    try:
        return Version(lows[0].version)
    except InvalidVersion:
        return None
