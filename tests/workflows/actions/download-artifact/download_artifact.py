"""actions/download-artifact, locally: OPFORGE_ACT_ARTIFACTS/<name>/ into the workspace."""

import hashlib
import os
import shutil
import sys
from pathlib import Path

name = os.environ["INPUT_NAME"]
store = Path(os.environ["OPFORGE_ACT_ARTIFACTS"]) / name
if not store.is_dir():
    sys.exit(f"download-artifact stand-in: no artifact {name!r} in this run")
target = Path(os.environ["GITHUB_WORKSPACE"]) / os.environ.get("INPUT_PATH", ".")
shutil.copytree(store, target, dirs_exist_ok=True)
for f in sorted(p for p in store.rglob("*") if p.is_file()):
    digest = hashlib.sha256((target / f.relative_to(store)).read_bytes()).hexdigest()
    print(f"downloaded {f.relative_to(store)} into {target} sha256={digest}")
