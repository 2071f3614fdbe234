"""What each free-text matrix field becomes, and the check that it can become that.

A matrix value ends up as a GitHub runner label (``runs-on``), a container image reference,
part of a pip index URL, a path in the repository, a wheel's distribution name or a torch
namespace. Each check returns None when the value is fine, else a few words for the error
(``matrix.yaml:12: variants[1].container: <words>``). Patterns are anchored with ``\\Z``
(``$`` would accept a final newline).
"""

from __future__ import annotations

import re
import urllib.parse
from pathlib import PurePosixPath

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}\Z")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_DISTRIBUTION = re.compile(r"([A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9._-]*[A-Za-z0-9])\Z")
_PATH_SEGMENT = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}\Z")
# docker's reference grammar: [domain[:port]/]path-component(/path-component)*[:tag][@digest]
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN = r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*(?::[0-9]+)?|\[[0-9a-fA-F:]+\](?::[0-9]+)?)"
_IMAGE = re.compile(
    rf"(?:{_DOMAIN}/)?{_COMPONENT}(?:/{_COMPONENT})*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?"
    r"(?:@sha256:[a-f0-9]{64})?\Z")


def text(value: str) -> str | None:
    """Every string field: one line, no control characters, no surrounding spaces."""
    if _CONTROL.search(value):
        return f"{value!r} holds a control character (a newline or tab?)"
    if value != value.strip():
        return f"{value!r} has leading or trailing spaces"
    return None


def runner_label(value: str) -> str | None:
    if not _LABEL.match(value):
        return (f"{value!r} is not a runner label (letters, digits, '.', '_' and '-', "
                "e.g. ubuntu-24.04 or a self-hosted label)")
    return None


def image_reference(value: str) -> str | None:
    if len(value) > 255 or not _IMAGE.match(value):
        return (f"{value!r} is not a container image reference like "
                "pytorch/manylinux2_28-builder:cuda13.0 or ghcr.io/org/image:tag")
    return None


def index_url(value: str) -> str | None:
    try:
        parts = urllib.parse.urlsplit(value)
    except ValueError as exc:
        return f"{value!r} is not a URL ({exc})"
    if parts.scheme not in ("https", "http", "file"):
        return f"{value!r} is not an https://, http:// or file:// URL"
    if parts.scheme != "file" and not parts.hostname:
        return f"{value!r} has no host"
    if parts.query or parts.fragment or any(c in value for c in " \"'<>\\`"):
        return f"{value!r}: an index URL has no query, fragment, spaces or quotes"
    return None


def index_variant(value: str) -> str | None:
    if not _PATH_SEGMENT.match(value):
        return (f"{value!r} is not an index folder name (lower-case letters, digits, '.', '_' "
                "and '-', e.g. cpu or cu130)")
    return None


def repository_path(value: str) -> str | None:
    """A relative POSIX path that stays inside the repository."""
    if "\\" in value or value.startswith("/") or re.match(r"[A-Za-z]:", value):
        return f"{value!r} must be a relative path with '/' (inside the repository)"
    if ".." in PurePosixPath(value).parts:
        return f"{value!r} leaves the repository ('..')"
    return None


def identifier(value: str, what: str) -> str | None:
    if not _IDENTIFIER.match(value):
        return f"{value!r} is not {what} (ASCII letters, digits and _, not starting with a digit)"
    return None


def distribution(value: str) -> str | None:
    if not _DISTRIBUTION.match(value):
        return f"{value!r} is not a distribution name (PEP 508: letters, digits, '.', '_', '-')"
    return None
