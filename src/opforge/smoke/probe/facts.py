"""What the installed package says about its build: opforge's build record, else its torch pin.

The build record is ``<dist>.dist-info/opforge-build.json``, stamped by ``opforge build`` and
read through importlib.metadata, without importing the package.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re

RECORD_NAME = "opforge-build.json"


def package_dir(package: str) -> str | None:
    """The package's directory, found without executing it."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return list(spec.submodule_search_locations)[0]
    return os.path.dirname(spec.origin) if spec.origin else None


def read_build_facts(package: str, pkg_dir: str | None = None) -> dict:
    """The distribution that provides ``package``, its build record and its torch requirement."""
    facts: dict = {"build_info": None, "distribution": None, "distribution_version": None,
                   "torch_requirement": None, "built_against_torch": None, "source": None}
    try:
        dists = importlib.metadata.packages_distributions().get(package, [])
    except Exception:  # noqa: BLE001 - a broken metadata directory must not stop the probe
        dists = []
    for dist_name in dists:
        try:
            dist = importlib.metadata.distribution(dist_name)
        except importlib.metadata.PackageNotFoundError:
            continue
        facts["distribution"] = dist.metadata["Name"]
        facts["distribution_version"] = dist.version
        for req in dist.requires or []:
            # "torch==2.13.0", "torch (>=2.14.0)"; requirements behind a marker (extras) do not count
            m = re.match(r"^\s*torch\s*\(?\s*([=<>!~][^;()]*)\)?\s*$", req)
            if m:
                facts["torch_requirement"] = "torch" + re.sub(r"\s+", "", m.group(1))
        try:
            text = dist.read_text(RECORD_NAME)
        except OSError as exc:
            text, facts["build_info_error"] = None, f"{RECORD_NAME}: {exc}"
        if text:
            try:
                facts["build_info"] = json.loads(text)
            except ValueError as exc:
                facts["build_info_error"] = f"{dist_name} {RECORD_NAME}: {exc}"
        break
    info = facts["build_info"] or {}
    if info.get("torch_version"):
        facts["built_against_torch"] = info["torch_version"]
        facts["source"] = f"{facts['distribution']} build record ({RECORD_NAME})"
    elif facts["torch_requirement"]:
        pin = re.match(r"^torch\s*==\s*([\w.+!-]+)$", facts["torch_requirement"])
        if pin:
            facts["built_against_torch"] = pin.group(1)
            facts["source"] = f"{facts['distribution']} wheel pin {facts['torch_requirement']}"
    return facts
