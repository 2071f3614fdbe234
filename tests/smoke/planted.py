"""A pure-Python op extension with kernels slow on purpose, for the speed tests.

``write_planted(root)`` writes the package ``planted`` and its recipes file. Every op returns
``sin(x)`` after ``reps`` steps of plain-Python work. The Meta kernel is the "device" kernel
the smoke speed check times against the CPU's (a CPU-only machine has no other device:
``OPFORGE_SPEED_EXTRA_DEVICES=meta`` adds it): it does the same work, then returns an empty
meta tensor. A slow kernel does the work ``SLOWDOWN`` times over (same result), so a slow and
a fair build differ only in speed. The recipes' reference (for ``opforge bench``) does the
work once, like a fair kernel.

| op | CPU kernel | Meta kernel | smoke speed check | bench against the reference |
| --- | --- | --- | --- | --- |
| fair | 1x | 1x | pass | pass |
| slow_device | 1x | 30x | fail (30x the CPU) | pass |
| slow_cpu | 30x | 30x | pass (as fast as the CPU) | fail (30x slower) |
| mismatch | 1x | 1x | pass | fail: the reference disagrees |
"""

from __future__ import annotations

import textwrap
from pathlib import Path

SLOWDOWN = 30

PACKAGE = '''
import torch

KERNELS = {{"fair": (1, 1), "slow_device": (1, {slow}), "slow_cpu": ({slow}, {slow}),
           "mismatch": (1, 1)}}  # op -> (CPU repeats, Meta repeats)

lib = torch.library.Library("planted", "DEF")


def _busy(reps):
    """Work in plain Python: no torch op, so nothing the dispatcher does around a Meta call
    (which makes nested torch ops slower) can make one kernel slower than planted."""
    total = 0
    for i in range(reps):
        total += i * i
    return total


def _kernels(cpu_repeats, meta_repeats):
    def cpu(x, reps):
        for _ in range(cpu_repeats):
            _busy(reps)
        return torch.sin(x)

    def meta(x, reps):
        for _ in range(meta_repeats):
            _busy(reps)
        return torch.empty_like(x)
    return cpu, meta


for _op, (_cpu_repeats, _meta_repeats) in KERNELS.items():
    lib.define(f"{{_op}}(Tensor x, int reps) -> Tensor")
    _cpu, _meta = _kernels(_cpu_repeats, _meta_repeats)
    lib.impl(_op, _cpu, "CPU")
    lib.impl(_op, _meta, "Meta")
'''

RECIPES = '''
import torch


def inputs(dtype):
    return [torch.rand(64, generator=torch.Generator().manual_seed(0)).to(dtype), 5000]


def reference(x, reps):
    total = 0
    for i in range(reps):
        total += i * i
    return torch.sin(x)


def wrong_reference(x, reps):
    return reference(x, reps) + 1


def recipe(ref):
    return {"inputs": inputs, "reference": ref, "workloads": {"small": {"inputs": inputs}},
            "skip": {"compile": "not what these tests are about",
                     "fake": "its Meta kernel is the planted device"}}


RECIPES = {"fair": recipe(reference), "slow_device": recipe(reference),
           "slow_cpu": recipe(reference), "mismatch": recipe(wrong_reference)}
'''


def write_planted(root: Path) -> tuple[Path, Path]:
    """(the directory to put on PYTHONPATH, the recipes file)."""
    pkg = root / "planted"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text(textwrap.dedent(PACKAGE.format(slow=SLOWDOWN)),
                                     encoding="utf-8")
    recipes = root / "planted_recipes.py"
    recipes.write_text(textwrap.dedent(RECIPES), encoding="utf-8")
    return root, recipes


def planted_env(root: Path) -> dict[str, str]:
    return {"PYTHONPATH": str(root), "OPFORGE_SPEED_EXTRA_DEVICES": "meta"}
