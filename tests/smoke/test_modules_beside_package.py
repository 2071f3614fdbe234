"""A package whose import fails because a compiled module beside it (top-level, not inside the
package) was not built: smoke names that module, not only the package's import error.

The shape is torch-discounted-cumsum 1.1.0's (found by the trust corpus, tests/trust): the
package imports ``torch_discounted_cumsum_cpu`` and, on ImportError, JIT-compiles a source the
wheel does not ship, so its import fails with FileNotFoundError. Before, the module census ran
only when the package imported, and the one FAIL never named the module that was missing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import opforge

SRC = str(Path(opforge.__file__).resolve().parent.parent)

FILES = {
    "fallpkg/__init__.py": """
        try:
            import fallpkg_cpu
        except ImportError:  # the package's own fallback: compile the source it ships (not here)
            open(__file__.replace("__init__.py", "fallpkg_cpu.cpp")).read()
    """,
    "fallpkg/_inner.py": "def f(x):\n    return x\n",
    "fallpkg_near.py": "def near(x):\n    return x\n",
}


def _probe(root: Path, modules: list[dict]) -> dict:
    for name, text in FILES.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())
    spec = {"op_keys": {}, "default_keys": ["CPU"], "modules": modules}
    (root / "spec.json").write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{SRC}"}
    subprocess.run([sys.executable, "-c", "import sys; from opforge.smoke.probe.main import "
                    "main; sys.exit(main())", "--package", "fallpkg", "--namespace", "fallpkg",
                    "--spec", str(root / "spec.json"), "--out", str(root / "out.json")],
                   env=env, cwd=root, timeout=300, check=False)
    return json.loads((root / "out.json").read_text())


def test_a_module_beside_a_package_that_fails_to_import_is_still_checked(tmp_path):
    doc = _probe(tmp_path, [
        {"name": "fallpkg_cpu", "backend": "cpu", "load": "import", "functions": ["left"]},
        {"name": "fallpkg_near", "backend": "cpu", "load": "import", "functions": ["near"]},
        {"name": "fallpkg._inner", "backend": "cpu", "load": "import", "functions": ["f"]}])
    checks = {c["id"]: c for c in doc["checks"]}
    assert checks["import"]["status"] == "fail"
    assert "FileNotFoundError" in checks["import"]["message"]
    missing = checks["module:fallpkg_cpu"]
    assert missing["status"] == "fail"
    assert "fallpkg_cpu (cpu module" in missing["message"]
    assert "No module named 'fallpkg_cpu'" in missing["message"]
    assert "was not built" in missing["message"]
    assert checks["module:fallpkg_near"]["status"] == "pass"
    # inside the package that does not import: its import error would only repeat the package's
    assert "module:fallpkg._inner" not in checks
    assert [row["module"] for row in doc["modules"]] == ["fallpkg_cpu", "fallpkg_near"]
