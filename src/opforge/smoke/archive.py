"""The code that runs inside the environment under test, shipped there as one zip archive.

The smoke probe (``opforge.smoke.probe``), the bench's side (``opforge.bench.target``: the
benchmark and bisect's workload server) and derive's trial calls (``opforge.recipes.target``)
import the standard library, torch and the
extension's recipes file only, so they run on any target without opforge installed. The
archive keeps their layout under a private top-level name, ``_opforge`` (no user's package is
called that), so the bench's relative imports of the probe resolve there as in the source tree.

``python probe.pyz ARGS`` runs the smoke probe, ``probe.pyz bench ARGS`` the benchmark,
``probe.pyz serve ARGS`` the workload server of bisect by speed, ``probe.pyz derive ARGS``
the trial calls of ``opforge recipes --derive`` (``opforge.recipes.target``).
"""

from __future__ import annotations

import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # src/opforge
# the packages shipped, as paths under ROOT; each parent gets an empty __init__.py
PACKAGES = ("smoke/probe", "bench/target", "recipes/target")
ARCHIVE_NAME = "_opforge"
MODES = {"bench": "bench.target.bench", "serve": "bench.target.serve",
         "derive": "recipes.target.trial"}
DEFAULT_MODE = "smoke.probe.main"

_MAIN = f"""\
import sys
from importlib import import_module

MODES = {MODES!r}
module = MODES.get(sys.argv[1]) if len(sys.argv) > 1 else None
argv = sys.argv[2:] if module else sys.argv[1:]
main = import_module("{ARCHIVE_NAME}." + (module or "{DEFAULT_MODE}")).main
sys.exit(main(argv))
"""


def probe_archive(target: Path) -> Path:
    """The shipped packages as one runnable zip archive at ``target``."""
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("__main__.py", _MAIN)
        parents = sorted({"/".join(package.split("/")[:i]) for package in PACKAGES
                          for i in range(len(package.split("/")))})
        for parent in parents:  # the real ones import what the target has not got
            archive.writestr(f"{ARCHIVE_NAME}/{parent + '/' if parent else ''}__init__.py", "")
        for package in PACKAGES:
            for source in sorted((ROOT / package).glob("*.py")):
                archive.write(source, f"{ARCHIVE_NAME}/{package}/{source.name}")
    return target
