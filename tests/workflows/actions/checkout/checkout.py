"""actions/checkout, locally: copy the files git lists in OPFORGE_ACT_SOURCE into the workspace."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

source = Path(os.environ.get("OPFORGE_ACT_SOURCE", ""))
if not (source / ".git").exists():
    sys.exit(f"checkout stand-in: OPFORGE_ACT_SOURCE={source} is not a git checkout")
workspace = Path(os.environ["GITHUB_WORKSPACE"])
# a fresh job starts from an empty workspace: say what was there, so a replay can tell
left = sorted(p.name for p in workspace.iterdir()) if workspace.is_dir() else []
print(f"workspace before checkout: {', '.join(left) if left else 'empty'}")
listed = subprocess.run(["git", "-C", str(source), "ls-files", "-co", "--exclude-standard", "-z"],
                        capture_output=True, text=True, check=True).stdout
count = 0
for rel in sorted({f for f in listed.split("\0") if f}):
    src = source / rel
    if not src.is_file() or src.is_symlink():
        continue
    dst = workspace / rel
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src, dst)
    count += 1
print(f"checked out {count} files of {source} into {workspace}")
