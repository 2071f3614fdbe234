"""No import circle in src/opforge at any depth: module-level, function-level and
type-checking imports all count (issue 39). Read from the source with ast, so a lazy import
that would close a circle fails here even when no code path runs it."""

from __future__ import annotations

import ast
import re
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


# a trailing pragma is not a reason
_PRAGMA = re.compile(r"#\s*(noqa\b|type:\s*ignore\b)[^#]*")


def _says_why(line: str) -> bool:
    comment = line.partition("#")[2] if "#" in line else ""
    return bool(comment) and bool(_PRAGMA.sub("", "#" + comment).strip(" #"))


def unexplained_lazy_imports(src: Path = SRC) -> list[str]:
    """Function-level imports with no comment saying why they are there: a comment on the
    import's own lines, or directly above it or above the run of imports (and ``try:`` /
    ``except ...:`` lines) it belongs to (issue 39: a function-level import only where it buys
    startup time, with a comment saying so)."""
    found = []
    for path in sorted((src / "opforge").rglob("*.py")):
        lines = path.read_text(encoding="utf-8").splitlines()
        lazy = []
        for fn in ast.walk(ast.parse("\n".join(lines))):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lazy += [n for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom))]
        import_lines = {i for n in lazy for i in range(n.lineno - 1, n.end_lineno)}
        for node in lazy:
            if any(_says_why(lines[i]) for i in range(node.lineno - 1, node.end_lineno)):
                continue
            i = node.lineno - 2
            while i >= 0 and (i in import_lines or lines[i].strip() == "try:"
                              or lines[i].strip().startswith("except")):
                i -= 1
            if i < 0 or not lines[i].strip().startswith("#"):
                found.append(f"{path.relative_to(src)}:{node.lineno}")
    return sorted(set(found))


def test_every_function_level_import_says_why():
    found = unexplained_lazy_imports()
    assert found == [], ("function-level imports without a comment saying why (startup "
                         "time, an optional package...; else import at module level): "
                         + ", ".join(found))


def test_the_lazy_import_check_wants_a_comment(tmp_path):
    (tmp_path / "opforge").mkdir()
    (tmp_path / "opforge" / "a.py").write_text(
        "def f():\n    import json  # noqa: F401\n\n\n"
        "def g():\n    # rich (~40 ms): only for a table\n    from rich import box\n"
        "    from rich.table import Table\n\n\n"
        "def h():\n    try:\n        import tomllib\n    except ImportError:  # Python 3.10\n"
        "        import tomli as tomllib\n\n\n"
        "def k():\n    # optional: absent below 3.11\n    try:\n        import x\n"
        "    except ImportError:\n        import y\n")
    assert unexplained_lazy_imports(tmp_path) == ["opforge/a.py:13", "opforge/a.py:15",
                                                  "opforge/a.py:2"]
