"""actions/upload-artifact, locally: copy the matched files into OPFORGE_ACT_ARTIFACTS/<name>/."""

import glob
import hashlib
import os
import shutil
import sys
from pathlib import Path

name = os.environ["INPUT_NAME"]
workspace = Path(os.environ["GITHUB_WORKSPACE"])
store = Path(os.environ["OPFORGE_ACT_ARTIFACTS"]) / name
patterns = [line.strip() for line in os.environ["INPUT_PATH"].splitlines() if line.strip()]
matched = [Path(p) for pattern in patterns
           for p in glob.glob(str(workspace / pattern), recursive=True)]
files = [p for p in matched if p.is_file()] + \
    [f for p in matched if p.is_dir() for f in p.rglob("*") if f.is_file()]
if not files:
    message = f"upload-artifact stand-in: no files match {patterns}"
    if os.environ.get("INPUT_IF_NO_FILES_FOUND", "warn") == "error":
        sys.exit(message)
    print(message + ": nothing uploaded")
    sys.exit(0)
if store.exists():
    sys.exit(f"upload-artifact stand-in: artifact {name!r} already exists in this run")
base = Path(os.path.commonpath([str(p.parent) for p in files]))
for f in files:
    dst = store / f.relative_to(base)
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(f, dst)
    digest = hashlib.sha256(dst.read_bytes()).hexdigest()
    print(f"uploaded {f.relative_to(base)} to {name} sha256={digest}")
