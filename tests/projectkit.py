"""One factory for the small projects tests make: a matrix.yaml and, when asked, a pure-Python
op package beside it and its recipes file.

``matrix_yaml(package, ops, ...)`` is the text of a one-platform, one-variant matrix (the
variant ``cpu`` unless ``variants`` says otherwise); an op is a name or ``{name: {field:
value}}``. ``write_project(root, package, source, ops, recipes=...)`` writes
``root/<package>/__init__.py`` (``source``, dedented), ``root/recipes.py`` and
``root/matrix.yaml`` and returns ``root``. Tests that check the matrix parser's own messages
(file:line) keep their hand-written files: there the text is the subject.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import yaml

RUNNERS = {"linux-x86_64": "ubuntu-24.04", "macos-arm64": "macos-14",
           "windows-x86_64": "windows-2022"}


def matrix_dict(package: str, ops=(), *, namespace: str | None = None,
                distribution: str | None = None, recipes: str | None = "recipes.py",
                modules: dict | None = None, channel: str = "stable",
                version: str = "2.13.0", python: str = "3.11",
                platforms: tuple[str, ...] = ("linux-x86_64",),
                expected_keys: tuple[str, ...] = ("CPU",), variants: list | None = None) -> dict:
    extension: dict = {"path": ".", "package": package}
    if distribution:
        extension["distribution"] = distribution
    extension["namespace"] = namespace or package
    if recipes:
        extension["recipes"] = recipes
    extension["ops"] = list(ops)
    if modules:
        extension["modules"] = modules
    if variants is None:
        variants = [{"name": "cpu", "platforms": list(platforms),
                     "expected_keys": list(expected_keys)}]
    return {"extension": extension,
            "torch": {"channel": channel, "version": version,
                      "index": "https://download.pytorch.org/whl"},
            "pythons": [python],
            "platforms": {p: {"runner": RUNNERS[p]} for p in platforms},
            "variants": variants}


def matrix_yaml(package: str, ops=(), **fields) -> str:
    return yaml.safe_dump(matrix_dict(package, ops, **fields), sort_keys=False,
                          default_flow_style=None)


def write_project(root: Path, package: str, source: str, ops=(), *, recipes: str | None = None,
                  matrix: str = "matrix.yaml", **fields) -> Path:
    """``root`` with the package, its recipes (when given) and the matrix naming them."""
    (root / package).mkdir(parents=True, exist_ok=True)
    (root / package / "__init__.py").write_text(textwrap.dedent(source), encoding="utf-8")
    if recipes is not None:
        (root / "recipes.py").write_text(textwrap.dedent(recipes), encoding="utf-8")
    (root / matrix).write_text(matrix_yaml(package, ops, recipes="recipes.py" if recipes
                                           is not None else None, **fields), encoding="utf-8")
    return root
