"""No import circle in src/opforge at any depth: module-level, function-level and
type-checking imports all count (issue 39). Read from the source with ast, so a lazy import
that would close a circle fails here even when no code path runs it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"


def modules(src: Path = SRC) -> dict[str, Path]:
    out = {}
    for path in (src / "opforge").rglob("*.py"):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _targets(name: str, path: Path, node: ast.AST, known: dict[str, Path]) -> list[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    if isinstance(node, ast.Import):
        wanted = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            parts = package.split(".")
            parts = parts[:len(parts) - node.level + 1]
            base = ".".join(parts + ([base] if base else []))
        wanted = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
    found = []
    for target in wanted:
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target != name:
            found.append(target)
    return found


def import_graph(src: Path = SRC) -> dict[str, set[str]]:
    known = modules(src)
    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                graph[name].update(_targets(name, path, node, known))
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_circle_at_any_depth():
    found = circles(import_graph())
    assert found == [], "import circles (break each; see docs/architecture.md): " + \
        "; ".join(" <-> ".join(c) for c in found)


@pytest.mark.parametrize(("files", "expected"), [
    ({"a.py": "from opforge import b\n", "b.py": "def f():\n    from opforge.a import x\n"},
     [["opforge.a", "opforge.b"]]),
    ({"a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n",
      "b.py": "from . import c\n", "c.py": "import opforge.a\n"},
     [["opforge.a", "opforge.b", "opforge.c"]]),
    ({"a.py": "from opforge import b\n", "b.py": "import os\n"}, []),
])
def test_the_check_sees_lazy_and_type_checking_imports(tmp_path, files, expected):
    (tmp_path / "opforge").mkdir()
    (tmp_path / "opforge" / "__init__.py").write_text("")
    for name, text in files.items():
        (tmp_path / "opforge" / name).write_text(text)
    assert circles(import_graph(tmp_path)) == expected
