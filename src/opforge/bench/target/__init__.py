"""The bench's side inside the environment under test: ``bench`` (time the recipes' workloads
against their references, one JSON document out) and ``serve`` (bisect by speed's workload
server). Like the smoke probe they import the standard library, torch, the extension's recipes
file and the probe (``opforge.smoke.probe``) only: ``opforge.smoke.archive`` ships them with it.
"""
