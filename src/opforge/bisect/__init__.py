"""``opforge bisect``: the PyTorch nightly (and commit range) where a regression appeared.

app.py      the application: what was asked checked, then a bisect, a --resume or a round run
search.py   the pure search (good / bad / skip like git bisect; rounds of K for --plan; no I/O)
index.py    the nightly index (PEP 503 / 691, https, file://, a directory), wheel choice, downloads
releases.py released versions (and release candidates) on a release index
levels.py   releases -> nightlies -> commits, and the rounds of a fanned-out bisect
overlay.py  --by-commit: a commit's Python over the bad nightly's binaries
envs.py     one cached environment per nightly, release or commit; background prefetch
cache.py    the cache's size, listing and least-recently-used eviction (`opforge cache`)
probe.py    running the test and turning its exit into a verdict
params.py   what was asked: parameters, endpoint forms, reproduce and rerun commands
session.py  one bisect run: endpoints, walk-back, the loop, each step saved
state.py    the atomic state file (--resume) and the JSON-lines step log
commits.py  nightly commits -> main-branch commits (--pytorch-repo)
report.py   progress display and the final report (rich, --json, --markdown)
extension.py  the glue to `opforge build` / `opforge smoke` (default and --wheel modes)
"""
