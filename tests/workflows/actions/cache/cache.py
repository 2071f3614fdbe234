"""actions/cache, locally: a persistent runner's disk; report which cached paths exist."""

import os
import sys
from pathlib import Path

key = os.environ.get("INPUT_KEY", "").strip()
paths = [line.strip() for line in os.environ.get("INPUT_PATH", "").splitlines() if line.strip()]
if not key or not paths:
    sys.exit("cache stand-in: actions/cache needs `key` and `path`")
kept = [p for p in paths if Path(os.path.expanduser(p)).exists()]
print(f"cache {key}: the runner's disk keeps {', '.join(kept) or 'none of ' + ', '.join(paths)}")
with open(os.environ["GITHUB_OUTPUT"], "a") as out:
    out.write(f"cache-hit={'true' if len(kept) == len(paths) else 'false'}\n")
