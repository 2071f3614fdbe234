"""actions/cache (and its restore / save halves), locally: a persistent runner's disk.

Nothing is copied: the cached paths hold what the last run on this host left. The action and
its restore half report cache-hit when every path exists (restore also cache-matched-key);
save succeeds. A missing key or path fails, as on GitHub. ``sys.argv[1]``: cache | restore |
save.
"""

import os
import sys
from pathlib import Path

mode = sys.argv[1] if len(sys.argv) > 1 else "cache"
key = os.environ.get("INPUT_KEY", "").strip()
paths = [line.strip() for line in os.environ.get("INPUT_PATH", "").splitlines() if line.strip()]
if not key or not paths:
    sys.exit(f"cache stand-in ({mode}): actions/cache needs `key` and `path`")
kept = [p for p in paths if Path(os.path.expanduser(p)).exists()]
print(f"cache {mode} {key}: the runner's disk keeps "
      f"{', '.join(kept) or 'none of ' + ', '.join(paths)}")
if mode != "save":
    hit = len(kept) == len(paths)
    with open(os.environ["GITHUB_OUTPUT"], "a") as out:
        out.write(f"cache-hit={'true' if hit else 'false'}\n")
        if mode == "restore":  # actions/cache/restore's output; actions/cache has none
            out.write(f"cache-matched-key={key if hit else ''}\n")
