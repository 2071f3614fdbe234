"""The one guarded YAML loader: every YAML file opforge reads goes through here.

``compose`` and ``load`` refuse, before a node or an object is built, what would let a file
cost more than its size: nesting deeper than ``MAX_DEPTH`` (PyYAML's composer and constructor
recurse once per level), more than ``MAX_YAML_NODES`` nodes once aliases are expanded (the
"billion laughs" bomb), more than ``MAX_YAML_BYTES`` of text, and tags (no constructor of
ours runs on a name the file chose). Each failure is one ``UsageError`` line,
``label:line: (yaml): problem``. matrix.yaml (composed, for its line numbers), the workflow
files and ``init``'s own output are read through it.
"""

from __future__ import annotations

from typing import Any

import yaml

from opforge.errors import UsageError

MAX_DEPTH = 64              # YAML nesting (JSON's decoder stops at the recursion limit)
MAX_YAML_NODES = 200_000    # after expanding aliases ("billion laughs")
MAX_YAML_BYTES = 4 << 20    # a matrix or a workflow is a few kB


def _check_size(text: str, label: str, max_bytes: int) -> None:
    if len(text) > max_bytes:
        raise UsageError(f"{label}:0: (yaml): {len(text)} characters, more than the "
                         f"{max_bytes}-character limit for a YAML file")


def compose(text: str, label: str, *, max_depth: int = MAX_DEPTH,
                 max_nodes: int = MAX_YAML_NODES,
            max_bytes: int = MAX_YAML_BYTES) -> yaml.Node | None:
    """The document's node tree, after refusing tags, deep nesting, alias bombs and size.

    ``label`` is the file name used in ``label:line: (yaml): problem`` messages.
    """
    def fail(mark, problem: str) -> UsageError:
        line = mark.line + 1 if mark is not None else 0
        return UsageError(f"{label}:{line}: (yaml): {problem}")

    _check_size(text, label, max_bytes)
    try:
        depth, nodes = 0, 0
        sizes: dict[str, int] = {}           # anchor -> nodes it expands to
        open_anchors: list[tuple[str | None, int]] = []
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            tag = getattr(event, "tag", None)
            if tag is not None and tag != "!" and not isinstance(event, yaml.DocumentStartEvent):
                raise fail(event.start_mark, f"tags are not allowed (found {tag!r})")
            if isinstance(event, yaml.AliasEvent):
                if event.anchor not in sizes:
                    raise fail(event.start_mark, f"alias *{event.anchor} refers to an "
                                                 "unfinished or unknown anchor")
                nodes += sizes[event.anchor]
            elif isinstance(event, (yaml.ScalarEvent, yaml.CollectionStartEvent)):
                nodes += 1
                if isinstance(event, yaml.ScalarEvent):
                    if event.anchor:
                        sizes[event.anchor] = 1
                else:
                    depth += 1
                    if depth > max_depth:
                        raise fail(event.start_mark, f"nests deeper than {max_depth} levels")
                    open_anchors.append((event.anchor, nodes))
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
                anchor, start = open_anchors.pop()
                if anchor:
                    sizes[anchor] = nodes - start + 1
            if nodes > max_nodes:
                raise fail(getattr(event, "start_mark", None),
                           f"expands to more than {max_nodes} nodes (aliases?)")
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "invalid YAML"
        raise fail(mark, problem) from None
    except yaml.YAMLError as exc:
        raise UsageError(f"{label}:0: (yaml): {' '.join(str(exc).split())}") from None
    except RecursionError:
        raise UsageError(f"{label}:0: (yaml): nests too deeply") from None


def load(text: str, label: str, *, loader: type = yaml.SafeLoader, max_depth: int = MAX_DEPTH,
         max_nodes: int = MAX_YAML_NODES, max_bytes: int = MAX_YAML_BYTES) -> Any:
    """The document as Python objects (``loader``: a SafeLoader subclass), within the limits
    ``compose`` checks; a malformed document is the same one line."""
    compose(text, label, max_depth=max_depth, max_nodes=max_nodes, max_bytes=max_bytes)
    reader = loader(text)
    try:
        return reader.get_single_data()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else 0
        raise UsageError(f"{label}:{line}: (yaml): {exc.problem or exc.context}") from None
    except (yaml.YAMLError, RecursionError) as exc:
        raise UsageError(f"{label}:0: (yaml): {' '.join(str(exc).split()) or 'invalid'}") \
            from None
    finally:
        reader.dispose()
