"""The dispatch-key vocabulary is defined once (opforge.dispatch_keys); the probe's copy agrees."""

from __future__ import annotations

import ast
from pathlib import Path

from opforge import dispatch_keys
from opforge.smoke.probe import common as probe_common

PROBE = Path(probe_common.__file__).parent


def test_the_probes_copy_of_the_vocabulary_is_opforges():
    for name in ("BACKEND_KEYS", "DEVICE_KEY", "AUTOCAST_KEY", "OBSERVED_KEYS"):
        assert getattr(probe_common, name) == getattr(dispatch_keys, name), name


def test_every_named_key_is_a_torch_dispatch_key():
    named = {*dispatch_keys.BACKEND_KEYS, *dispatch_keys.DEVICE_KEY.values(),
             *dispatch_keys.AUTOCAST_KEY.values(), *dispatch_keys.OBSERVED_KEYS}
    assert named <= dispatch_keys.DISPATCH_KEYS, named - dispatch_keys.DISPATCH_KEYS


def test_backward_keys_are_the_backends_and_meta():
    keys = ("CPU", "CUDA", "Meta", "Autograd", "AutocastCPU", "AutocastCUDA")
    assert dispatch_keys.backward_keys(keys) == ("CPU", "CUDA", "Meta")
    assert dispatch_keys.device_of("AutogradCUDA") == "cuda"
    assert dispatch_keys.device_of("AutocastMPS") == "mps"
    assert dispatch_keys.device_of("Meta") is None


def test_no_other_module_spells_the_vocabulary_out():
    """A tuple or dict of backend keys written anew elsewhere is a sixth definition."""
    src = Path(dispatch_keys.__file__).parent
    allowed = {src / "dispatch_keys.py", PROBE / "common.py"}
    spelled = []
    for path in sorted(src.rglob("*.py")):
        if path in allowed:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                values = {e.value for e in node.elts if isinstance(e, ast.Constant)}
            elif isinstance(node, ast.Dict):
                values = {v.value for v in node.values if isinstance(v, ast.Constant)}
            else:
                continue
            if {"CPU", "CUDA", "MPS"} <= values:
                spelled.append(f"{path.relative_to(src)}:{node.lineno}")
    # scan/model.py's composite aliases say what an alias stands for, not which keys exist
    assert spelled == [p for p in spelled if p.startswith("scan/model.py:")], spelled
