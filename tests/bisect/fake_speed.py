"""A fake nightly index whose torch wheels differ only in speed, and an extension to time on it.

Each fake ``torch`` (pure Python, named like a real nightly) carries the little of torch's
surface the workload server touches (``ops.<namespace>.<op>.default``, ``float32``, ``Tensor``,
``cuda``, ``backends``) and one routine, ``torch.work(reps)``, that does ``reps`` steps of
plain-Python work, ``SLOWDOWN`` times over from ``SLOW_FROM`` on: the same result, only slower.

The extension ``speedops`` (a pure-Python wheel, installed beside each nightly as ``--wheel``
installs it) has two ops: ``scale`` calls ``torch.work`` (so it slows down with the nightly),
``steady`` does the same amount of work itself (so it runs as fast on every nightly: a kernel
only as fast as its reference, never to be flagged). ``project`` holds the matrix.yaml and the
recipes file bisect reads the workloads from.
"""

from __future__ import annotations

import html
import urllib.parse
from dataclasses import dataclass
from datetime import date
from pathlib import Path

from fake_nightlies import HERE_PLATFORM, PY, write_wheel
from projectkit import matrix_yaml

SLOWDOWN = 30
DATES = [date(2024, 6, d) for d in (1, 2, 3, 4, 5, 6, 7, 8, 10)]
SLOW_FROM = date(2024, 6, 6)

TORCH = '''\
from .version import __version__, git_version

DATE = int(__version__.split(".dev")[1][:8])
float32 = "float32"


class Tensor:  # nothing a fake workload passes is a tensor
    pass


class cuda:
    @staticmethod
    def is_available():
        return False


class backends:
    mps = None


class _Op:
    def __init__(self, fn):
        self.default = fn


class _Namespace:
    pass


class _Ops:
    def __getattr__(self, namespace):
        space = _Namespace()
        setattr(self, namespace, space)
        return space


ops = _Ops()


def define(namespace, name, fn):
    setattr(getattr(ops, namespace), name, _Op(fn))


def work(reps):
    total = 0
    for _ in range({slowdown} if DATE >= {slow_from} else 1):
        for i in range(reps):
            total += i * i
    return total
'''

EXTENSION = '''\
import torch


def scale(x, reps):
    torch.work(reps)
    return [2 * v for v in x]


def steady(x, reps):
    total = 0
    for i in range(reps):
        total += i * i
    return [2 * v for v in x]


torch.define("speedops", "scale", scale)
torch.define("speedops", "steady", steady)
'''

RECIPES = '''\
import os


def inputs(dtype):
    if os.environ.get("SPEEDOPS_RECIPE_RAISES"):
        raise ValueError("the recipe is broken on purpose")
    return [[1.0, 2.0, 3.0], 2000]


def recipe():
    return {"inputs": inputs, "workloads": {"small": {"inputs": inputs}}}


RECIPES = {"scale": recipe(), "steady": recipe()}
'''



@dataclass
class SpeedIndex:
    root: Path      # the index (PEP 503)
    wheel: Path     # the extension
    project: Path   # matrix.yaml + recipes.py


def build_speed_index(root: Path) -> SpeedIndex:
    index, project = root / "index", root / "project"
    (index / "torch").mkdir(parents=True)
    project.mkdir()
    wheels = []
    for day in DATES:
        version = f"2.5.0.dev{day:%Y%m%d}+cpu"
        files = {"torch/__init__.py": TORCH.format(slowdown=SLOWDOWN,
                                                   slow_from=f"{SLOW_FROM:%Y%m%d}"),
                 "torch/version.py": f"__version__ = {version!r}\ngit_version = {'a' * 40!r}\n"}
        wheels.append(write_wheel(index, "torch", version, f"{PY}-{PY}-{HERE_PLATFORM}", files))
    anchors = "\n".join(f'<a href="../{urllib.parse.quote(p.name)}">{html.escape(p.name)}</a>'
                        for p in wheels)
    (index / "torch" / "index.html").write_text(f"<html><body>\n{anchors}\n</body></html>\n")
    wheel = write_wheel(root, "speedops", "1.0", "py3-none-any",
                        {"speedops/__init__.py": EXTENSION})
    (project / "matrix.yaml").write_text(matrix_yaml("speedops", ["scale", "steady"],
                                                     distribution="speedops", channel="nightly",
                                                     version="latest"))
    (project / "recipes.py").write_text(RECIPES)
    return SpeedIndex(index, wheel, project)
