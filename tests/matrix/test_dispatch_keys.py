"""The dispatch-key vocabulary is defined once (opforge.dispatch_keys); the probe's copy agrees."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

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


def test_device_types_map_to_the_keys_torch_maps_them_to():
    torch = pytest.importorskip("torch")
    for device, key in dispatch_keys.DEVICE_TYPE_KEY.items():
        assert torch._C._dispatch_key_for_device(device) == key, device
    for device in dispatch_keys.RETIRED_DEVICE_TYPES:
        with pytest.raises(RuntimeError):
            torch._C._dispatch_key_for_device(device)
    # torch names every device type it parses when it refuses one: none is missing here
    with pytest.raises(RuntimeError) as refused:
        torch._C._dispatch_key_for_device("no_such_device")
    listed = re.search(r"Expected one of (.*?) device type", str(refused.value))
    assert listed, refused.value
    named = {d.strip() for d in listed.group(1).split(",")}
    assert named == {*dispatch_keys.DEVICE_TYPE_KEY, *dispatch_keys.RETIRED_DEVICE_TYPES}


def test_c10_only_keys_are_keys_torch_takes_but_does_not_list():
    torch = pytest.importorskip("torch")
    listed = set(torch._C.DispatchKey.__members__)
    assert dispatch_keys.DISPATCH_KEYS <= listed
    for key in dispatch_keys.C10_ONLY_KEYS:
        assert key not in listed and torch._C._parse_dispatch_key(key) is not None, key


# what torch.library makes of each name, in a process whose PrivateUse1 is renamed "npu"
_TORCH_LIBRARY = """
import json, sys, warnings
import torch
warnings.simplefilter("ignore")
torch.utils.rename_privateuse1_backend("npu")
lib = torch.library.Library("devtypes_probe", "DEF")
out = {}
for i, name in enumerate(json.loads(sys.argv[1])):
    lib.define(f"op{i}(Tensor x) -> Tensor")
    try:
        torch.library.impl(f"devtypes_probe::op{i}", name, lambda x: x, lib=lib)
    except Exception:
        out[name] = None
        continue
    dump = torch._C._dispatch_dump(f"devtypes_probe::op{i}")
    out[name] = [line.split(":")[0].replace("[alias]", "") for line in dump.splitlines()
                 if ": registered at" in line and not line.startswith("debug:")]
print(json.dumps(out))
"""


def test_kernel_key_reads_each_name_as_torch_library_does():
    """Every name torch.library.impl takes lands where kernel_key says; every name it
    refuses, kernel_key refuses (a renamed PrivateUse1 backend taken as renamed)."""
    pytest.importorskip("torch")
    names = [*dispatch_keys.DEVICE_TYPE_KEY, *dispatch_keys.RETIRED_DEVICE_TYPES, "npu",
             "default", "CPU", "AutocastCUDA", "CompositeImplicitAutograd", "PrivateUse1",
             "FPGA", "Cuda", "cuda:0", "NPU", "AutogradNPU", "Npu", "npu:0", "MKLDNN", "VULKAN"]
    ran = subprocess.run([sys.executable, "-c", _TORCH_LIBRARY, json.dumps(names)],
                         capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr
    registered = json.loads(ran.stdout)
    for name in names:
        key, how = dispatch_keys.kernel_key(name)
        if registered[name] is None:
            assert key is None, (name, how)
        else:
            assert registered[name] == [key], (name, key, registered[name])
    assert dispatch_keys.kernel_key("npu") == ("PrivateUse1", "renamed")
    assert dispatch_keys.kernel_key("hpu") == ("HPU", "device")
    assert dispatch_keys.kernel_key("AutogradNPU") == ("AutogradPrivateUse1", "renamed key")
    assert {dispatch_keys.renamed_backend(n) for n in ("npu", "NPU", "AutogradNPU")} == {"npu"}


def test_device_type_of_names_the_device_a_key_serves():
    assert dispatch_keys.device_type_of("HPU") == "hpu"
    assert dispatch_keys.device_type_of("AutocastHPU") == "hpu"
    assert dispatch_keys.device_type_of("SparseCsrXPU") == "xpu"
    assert dispatch_keys.device_type_of("AutogradPrivateUse1") == "privateuseone"
    assert dispatch_keys.device_type_of("CPU") == "cpu"
    for key in ("Meta", "Autograd", "CompositeExplicitAutograd", "BackendSelect"):
        assert dispatch_keys.device_type_of(key) is None, key
