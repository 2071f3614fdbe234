"""How a step is judged: the contexts a run would see (the cell, the event, the inputs, run-time
values as placeholders), and a step's commands as the runner would run them."""

from __future__ import annotations

import re
from typing import Any

from opforge.workflows.commands import commands
from opforge.workflows.expressions import RUNTIME, Placeholder, render, to_str
from opforge.workflows.workflow import Workflow

_ENV_REF = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?")


def input_defaults(wf: Workflow) -> dict[str, Any]:
    """``inputs`` as a run that passes none would see them (dispatch or workflow_call)."""
    inputs: dict[str, Any] = {}
    for name, spec in {**wf.dispatch_inputs, **wf.call_inputs}.items():
        spec = spec if isinstance(spec, dict) else {}
        default = spec.get("default", (spec.get("options") or [None])[0])
        if default is None:
            inputs[name] = f"{RUNTIME}inputs.{name}__"
        elif spec.get("type") in ("boolean", "number"):
            inputs[name] = default
        else:
            inputs[name] = to_str(default)
    return inputs


def context(wf: Workflow, cell: dict[str, Any] | None, event: str = "push",
            inputs: dict[str, Any] | None = None) -> dict[str, Any]:
    """Contexts to judge a step by: the cell, the event, the inputs (default: each input's
    default); run-time values as placeholders."""
    inputs = {**input_defaults(wf), **(inputs or {})}
    return {
        "matrix": cell or {}, "inputs": inputs, "env": {}, "strategy": {}, "job": {},
        "vars": {}, "secrets": {},
        "github": {"event_name": event, "workflow": str(wf.data.get("name", "")),
                   "run_id": "1", "run_attempt": "1", "sha": "0" * 40,
                   "ref": "refs/heads/main", "workspace": "/workspace", "event": {}},
        "runner": {"os": "Linux", "arch": "X64", "temp": "/runner-temp"},
        "steps": Placeholder("steps"), "needs": Placeholder("needs"),
    }


def resolved_commands(wf: Workflow, job: dict, step: dict, ctx: dict[str, Any]
                      ) -> list[list[str]]:
    """The step's argv lists as the runner would run them for ``ctx``.

    Like GitHub: ``${{ }}`` is substituted into the script text first (so an expression that
    renders empty leaves no argument), then the line is split, then ``$VARS`` from ``env:``
    are filled in. The rendered text passes the same allow-list checks as the source.
    """
    env: dict[str, str] = {}
    for scope in (wf.data.get("env"), job.get("env"), step.get("env")):
        for key, value in (scope or {}).items():
            env[key] = to_str(render(value, {**ctx, "env": env}))
    script = to_str(render(str(step.get("run", "")), {**ctx, "env": env}))
    return [[_ENV_REF.sub(lambda m: env.get(m.group(1), m.group(0)), arg) for arg in argv]
            for argv in commands(script)]
