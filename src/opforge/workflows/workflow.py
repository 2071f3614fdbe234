"""Workflow files as data: YAML read the way GitHub reads it, with line numbers kept."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from opforge import yamlsafe


class YamlMap(dict):
    """A mapping that remembers where it and each of its keys start (1-based lines)."""

    line = 0
    lines: dict[str, int]


class _Loader(yaml.SafeLoader):
    """YAML as GitHub reads it: ``on``/``yes``/``no`` stay strings (YAML 1.2 booleans)."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver("tag:yaml.org,2002:bool",
                              re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))


def _construct_map(loader: _Loader, node: yaml.MappingNode) -> YamlMap:
    loader.flatten_mapping(node)
    out = YamlMap()
    out.line = node.start_mark.line + 1
    out.lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        out[key] = loader.construct_object(value_node, deep=True)
        out.lines[key] = key_node.start_mark.line + 1
    return out


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_map)


def load_yaml(text: str, label: str = "<workflow>") -> Any:
    """The workflow as data, through opforge's guarded loader (size, depth, alias expansion):
    a bad file is one UsageError line ``label:line: (yaml): problem``."""
    return yamlsafe.load(text, label, loader=_Loader)


def line_of(obj: Any, key: str | None = None) -> int:
    """The line ``obj`` (or its ``key``) starts on; 0 when unknown."""
    if isinstance(obj, YamlMap):
        return obj.lines.get(key, obj.line) if key is not None else obj.line
    return 0


@dataclass
class Workflow:
    path: Path
    rel: str
    text: str
    data: Any

    @property
    def jobs(self) -> dict[str, Any]:
        jobs = self.data.get("jobs") if isinstance(self.data, dict) else None
        return jobs if isinstance(jobs, dict) else {}

    @property
    def lines(self) -> list[str]:
        return self.text.splitlines()

    @property
    def triggers(self) -> dict[str, Any]:
        on = self.data.get("on") if isinstance(self.data, dict) else None
        if isinstance(on, str):
            return {on: None}
        if isinstance(on, list):
            return {str(name): None for name in on}
        return on if isinstance(on, dict) else {}

    @property
    def dispatch_inputs(self) -> dict[str, Any]:
        return self._inputs("workflow_dispatch")

    @property
    def call_inputs(self) -> dict[str, Any]:
        """``on.workflow_call.inputs``: what a caller's ``with:`` may pass."""
        return self._inputs("workflow_call")

    @property
    def is_called_only(self) -> bool:
        """A reusable workflow that nothing but a caller starts."""
        return set(self.triggers) == {"workflow_call"}

    def _inputs(self, trigger: str) -> dict[str, Any]:
        spec = self.triggers.get(trigger)
        inputs = spec.get("inputs") if isinstance(spec, dict) else None
        return inputs if isinstance(inputs, dict) else {}


@dataclass
class Report:
    """Collects problems as ``file:line: where: what`` lines."""

    problems: list[str] = field(default_factory=list)

    def __call__(self, wf: Workflow, line: int, where: str, message: str) -> None:
        self.problems.append(f"{wf.rel}:{line}: {where}: {message}")


def steps_of(job: Any) -> Iterator[tuple[Any, str]]:
    """Each step mapping of ``job`` with a name for messages: ``steps[2] (build)``."""
    steps = job.get("steps") if isinstance(job, dict) else None
    for i, step in enumerate(steps if isinstance(steps, list) else []):
        if isinstance(step, dict):
            label = step.get("name") or step.get("id") or step.get("uses") or \
                next(iter(str(step.get("run", "")).strip().splitlines()), "")
            yield step, f"steps[{i}]" + (f" ({label})" if label else "")


def needs_of(job: Any) -> list[str]:
    needs = job.get("needs", []) if isinstance(job, dict) else []
    return [needs] if isinstance(needs, str) else [n for n in needs or [] if isinstance(n, str)]


def all_needs(jobs: dict[str, Any], job_id: str) -> set[str]:
    """The jobs ``job_id`` waits for, directly or through others."""
    out: set[str] = set()
    todo = needs_of(jobs.get(job_id))
    while todo:
        need = todo.pop()
        if need not in out:
            out.add(need)
            todo.extend(needs_of(jobs.get(need)))
    return out


def strings_in(obj: Any) -> Iterator[str]:
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from strings_in(value)
    elif isinstance(obj, list):
        for value in obj:
            yield from strings_in(value)


def action_name(uses: Any) -> str:
    """``actions/cache/restore@<sha>`` -> ``actions/cache/restore``."""
    return str(uses or "").split("@", 1)[0].lower()
