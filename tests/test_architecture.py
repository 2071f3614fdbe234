"""docs/architecture.md stays true: every module of src/opforge is named in its module map,
and every module it names exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "opforge"
DOC = ROOT / "docs" / "architecture.md"


def _map() -> str:
    text = DOC.read_text(encoding="utf-8")
    assert "## Every module" in text, "docs/architecture.md lost its module map"
    return text.split("## Every module", 1)[1]


def _named(section: str) -> set[str]:
    return set(re.findall(r"`([\w/]+\.py)`", section))


def test_every_module_is_in_the_architecture_map():
    modules = {p.relative_to(SRC).as_posix() for p in SRC.rglob("*.py")}
    missing = sorted(modules - _named(_map()))
    assert not missing, f"add to docs/architecture.md's module map: {missing}"


def test_the_map_names_no_module_that_is_gone():
    gone = sorted(m for m in _named(_map()) if not (SRC / m).is_file())
    assert not gone, f"docs/architecture.md names modules that do not exist: {gone}"


def test_the_document_links_only_files_of_this_repository():
    text = DOC.read_text(encoding="utf-8")
    for ref in re.findall(r"`(\.\./[^`\s]+)`|\]\((\.\./[^)\s]+)\)", text):
        target = next(r for r in ref if r)
        assert (DOC.parent / target).resolve().is_relative_to(ROOT), target
        assert (DOC.parent / target).exists(), f"docs/architecture.md links {target}: not here"


def test_the_package_ships_the_typing_marker_it_declares():
    assert (SRC / "py.typed").is_file()
