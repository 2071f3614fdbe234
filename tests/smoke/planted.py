"""A pure-Python op extension whose second kernel is slow on purpose (or not), for speed tests.

``write_planted(root, slowdown)`` writes the package ``planted`` (op ``torch.ops.planted.work``)
and its recipes file. The CPU kernel applies ``sin`` ``reps`` times; the Meta kernel is the
"device" kernel the tests time against it (a CPU-only machine has no other device: smoke's
``OPFORGE_SPEED_EXTRA_DEVICES=meta`` adds it): it does the same work ``slowdown`` times on a
CPU copy, then returns an empty meta tensor. ``slowdown=1`` is a kernel only as fast as the
CPU's; the two builds differ only in speed.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

PACKAGE = '''
import torch

SLOWDOWN = {slowdown}

lib = torch.library.Library("planted", "DEF")
lib.define("work(Tensor x, int reps) -> Tensor")


def _work(x, reps):
    for _ in range(reps):
        x = torch.sin(x)
    return x


def _cpu(x, reps):
    return _work(x, reps)


def _meta(x, reps):
    shadow = torch.ones(x.shape, dtype=x.dtype, device="cpu")
    for _ in range(SLOWDOWN):
        _work(shadow, reps)
    return torch.empty_like(x)


lib.impl("work", _cpu, "CPU")
lib.impl("work", _meta, "Meta")
'''

RECIPES = '''
import torch


def inputs(dtype):
    return [torch.rand(4096, generator=torch.Generator().manual_seed(0)).to(dtype), 8]


RECIPES = {
    "work": {"inputs": inputs, "skip": {"compile": "not what these tests are about",
                                          "fake": "its Meta kernel is the planted device"},
             "workloads": {"small": {"inputs": inputs}}},
}
'''


def write_planted(root: Path, slowdown: int) -> tuple[Path, Path]:
    """(the directory to put on PYTHONPATH, the recipes file)."""
    pkg = root / "planted"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text(textwrap.dedent(PACKAGE.format(slowdown=slowdown)),
                                     encoding="utf-8")
    recipes = root / "planted_recipes.py"
    recipes.write_text(textwrap.dedent(RECIPES), encoding="utf-8")
    return root, recipes
