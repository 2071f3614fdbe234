"""A reader of composed YAML nodes that keeps each value's key path and line for errors.

Working on nodes (not loaded dicts) gives every error its line, and catches duplicate keys,
which PyYAML's loader silently resolves by keeping the last. The matrix parser reads
matrix.yaml through it; each error is a ``MatrixError``: ``file:line: key: what is wrong``.
"""

from __future__ import annotations

from typing import Any

import yaml

from opforge import fields as field_checks
from opforge.errors import UsageError
from opforge.matrix.model import MatrixError
from opforge.yamlsafe import compose as compose_yaml


def compose(text: str, filename: str) -> yaml.Node | None:
    try:
        return compose_yaml(text, filename)
    except UsageError as exc:
        raise MatrixError(str(exc)) from None


class Reader:
    """Walks composed YAML nodes, keeping the key path and line for error messages.

    Working on nodes (not loaded dicts) gives every error its line, and catches duplicate
    keys, which PyYAML's loader silently resolves by keeping the last.
    """

    def __init__(self, filename: str):
        self.filename = filename

    def fail(self, node: yaml.Node | None, key: str, message: str) -> MatrixError:
        mark = getattr(node, "start_mark", None)
        line = mark.line + 1 if mark is not None else 1
        return MatrixError(f"{self.filename}:{line}: {key or '(top)'}: {message}")

    def mapping(self, node: yaml.Node, key: str, allowed: dict[str, bool]) -> dict[str, yaml.Node]:
        """Mapping node -> {name: value node}; ``allowed`` maps each key to whether it is required."""
        if not isinstance(node, yaml.MappingNode):
            raise self.fail(node, key, f"expected a mapping, got {kind(node)}")
        out: dict[str, yaml.Node] = {}
        for key_node, value_node in node.value:
            name = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            child = f"{key}.{name}" if key else str(name)
            if name is None or not isinstance(name, str):
                raise self.fail(key_node, key or "(top)", "keys must be strings")
            if name in out:
                raise self.fail(key_node, child, "duplicate key")
            if name not in allowed:
                hint = ", ".join(sorted(allowed))
                raise self.fail(key_node, child, f"unknown key (allowed: {hint})")
            out[name] = value_node
        for name, required in allowed.items():
            if required and name not in out:
                where = key or "top level"
                raise self.fail(node, f"{key}.{name}" if key else name,
                                f"required key missing from {where}")
        return out

    def check(self, node: yaml.Node | None, key: str, problem: str | None) -> None:
        if problem is not None:
            raise self.fail(node, key, problem)

    def scalar(self, node: yaml.Node, key: str, kind: type = str) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            raise self.fail(node, key, f"expected a {kind.__name__}, got {kind(node)}")
        value = yaml.constructor.SafeConstructor().construct_object(node)
        if kind is str:
            if node.tag != "tag:yaml.org,2002:str":
                raise self.fail(node, key, f"expected a string, got {value!r} "
                                           "(quote it, e.g. \"3.10\")")
            if not value.strip():
                raise self.fail(node, key, "must not be empty")
            self.check(node, key, field_checks.text(value))
            return value
        if kind is bool and not isinstance(value, bool):
            raise self.fail(node, key, f"expected true or false, got {value!r}")
        return value

    def str_list(self, node: yaml.Node, key: str) -> list[tuple[str, yaml.Node]]:
        if not isinstance(node, yaml.SequenceNode):
            raise self.fail(node, key, f"expected a list, got {kind(node)}")
        if not node.value:
            raise self.fail(node, key, "must not be empty")
        items = []
        seen = set()
        for i, item in enumerate(node.value):
            value = self.scalar(item, f"{key}[{i}]")
            if value in seen:
                raise self.fail(item, f"{key}[{i}]", f"{value!r} is listed twice")
            seen.add(value)
            items.append((value, item))
        return items


def kind(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    return repr(node.value) if node.value != "" else "nothing"
