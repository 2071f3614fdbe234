"""opforge smoke probe: runs inside the environment under test and writes one JSON document.

A package of modules, each one seam: ``common`` (the report), ``facts`` (what the build
record says), ``load`` (import and dlopen diagnosis), ``census`` (op x dispatch key),
``devices``, ``recipes`` (the extension's recipes file), ``runs`` (calling the ops),
``checks`` (the table of checks run on each op, and their functions), ``values`` (comparing
results), ``crashes`` (the call a dying probe was in, and what the next probe says of it)
and ``main``. It imports only the standard library, torch and the extension's
recipes file, so it runs on any target without opforge installed: ``opforge.smoke.archive``
ships it as one zip archive, run as ``python probe.pyz --spec SPEC --out OUT``. docs/smoke.md documents the JSON.
"""

from .census import has_key, missing_key_message, namespace_ops, run_census
from .common import Report
from .devices import probe_devices
from .facts import read_build_facts
from .load import classify_load_error, probe_import
from .main import main, parse_args, probe

__all__ = ["Report", "classify_load_error", "has_key", "main", "missing_key_message",
           "namespace_ops", "parse_args", "probe", "probe_devices", "probe_import",
           "read_build_facts", "run_census"]
