"""One factory for the small projects tests make: a matrix.yaml and, when asked, a pure-Python
op package beside it and its recipes file.

``matrix_yaml(package, ops, ...)`` is the text of a matrix (``matrix_dict`` the data): one
platform and one variant, ``cpu``, unless ``platforms`` or ``variants`` say otherwise; an op is
a name or ``{name: {field: value}}``; ``modules`` are ``extension.modules`` (a compiled
extension's libraries); ``index=None`` and ``recipes=None`` leave those keys out.
``variant_entry(name, expected_keys, platforms=..., **fields)`` is one entry of ``variants``:
a CUDA one says ``cuda=`` and ``arch_list=``, another backend ``backend=`` and ``toolkit=``,
any other field of the entry (``build_env``, ``abi``, ...) is a keyword too.

``write_project(root, package, source, ops, recipes=...)`` writes ``root/<package>/__init__.py``
(``source``, dedented), ``root/recipes.py`` and ``root/matrix.yaml`` and returns ``root``;
``write_tree(root, {path: text})`` writes any other files (a setup.py, C++ sources), dedented.

Tests that check the matrix parser's own messages (file:line), or that a user's exact YAML
parses, keep their hand-written files: there the text is the subject.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import yaml

RUNNERS = {"linux-x86_64": "ubuntu-24.04", "macos-arm64": "macos-14",
           "windows-x86_64": "windows-2022"}
TORCH_INDEX = "https://download.pytorch.org/whl"


def variant_entry(name: str, expected_keys=("CPU",), *, platforms=("linux-x86_64",),
                  **fields) -> dict:
    return {"name": name, "platforms": list(platforms), **fields,
            "expected_keys": list(expected_keys)}


def matrix_dict(package: str, ops=(), *, path: str = ".", namespace: str | None = None,
                distribution: str | None = None, recipes: str | None = "recipes.py",
                modules: dict | None = None, channel: str = "stable",
                version: str = "2.13.0", index: str | None = TORCH_INDEX,
                python: str = "3.11", pr_python: str | None = None,
                platforms: tuple[str, ...] = ("linux-x86_64",),
                expected_keys: tuple[str, ...] = ("CPU",), variants: list | None = None) -> dict:
    extension: dict = {"path": path, "package": package}
    if distribution:
        extension["distribution"] = distribution
    extension["namespace"] = namespace or package
    if recipes:
        extension["recipes"] = recipes
    extension["ops"] = list(ops)
    if modules:
        extension["modules"] = modules
    if variants is None:
        variants = [variant_entry("cpu", expected_keys, platforms=platforms)]
    torch = {"channel": channel, "version": version}
    if index:
        torch["index"] = index
    matrix = {"extension": extension, "torch": torch, "pythons": [python]}
    if pr_python:
        matrix["pr_python"] = pr_python
    return {**matrix, "platforms": {p: {"runner": RUNNERS[p]} for p in platforms},
            "variants": variants}


def matrix_yaml(package: str, ops=(), **fields) -> str:
    return yaml.safe_dump(matrix_dict(package, ops, **fields), sort_keys=False,
                          default_flow_style=None)


def write_tree(root: Path, files: dict[str, str]) -> Path:
    """``root`` with each ``{path: text}`` written, dedented, its leading blank lines dropped."""
    for name, text in files.items():
        file = root / name
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return root


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
