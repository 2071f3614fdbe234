"""``opforge bench``: time a wheel's ops against their references, where users run them.

target/       runs in the environment under test (shipped in the probe archive): ``bench``
              times the recipes' workloads, ``serve`` answers bisect by speed's timing requests
run.py        the command's application: baselines chosen, the environment made, the report
selection.py  --ops / --workloads against the names the recipes file writes (before any env)
report.py     the bench document as a terminal table, Markdown with charts, an exit code
compare.py    a run against a baseline: which side of each row moved, FAIL only when ours did
baselines.py  baseline files: where they live, read (checked), written (locked, whole)
"""
