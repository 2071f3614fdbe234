"""opforge init reads every device type torch.library takes, the way torch reads it (issue 37
part 3): ``register_kernel(op, "hpu")`` is an HPU kernel, ``"npu"`` the renamed PrivateUse1
backend's; a kernel for a device no variant builds is recorded and reported, never an error."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from projectkit import write_tree

from opforge.cli import main
from opforge.dispatch_keys import device_type_of
from opforge.matrix import load_matrix
from opforge.scan import scan_extension


@pytest.fixture(autouse=True)
def released_opforge(monkeypatch):
    from opforge import _release

    monkeypatch.setattr(_release, "WORKFLOWS_COMMIT", "f" * 40)


PYPROJECT = """
    [build-system]
    requires = ["setuptools"]
    build-backend = "setuptools.build_meta"
    [project]
    name = "devops"
    version = "0.1"
"""
# a Python-defined package whose kernels name devices the way torch.library's users do; it
# imports and registers on a CPU-only torch (the test below asks the real dispatcher)
DEVOPS = {
    "pyproject.toml": PYPROJECT,
    "devops/__init__.py": """
        import types

        import torch

        # what a device's own package does when it is imported (torch_npu: "npu", torch.npu)
        torch.utils.rename_privateuse1_backend("npu")
        _npu = types.ModuleType("torch.npu")
        _npu.is_available = lambda: False
        _npu.device_count = lambda: 0
        torch._register_device_module("npu", _npu)

        lib = torch.library.Library("devops", "DEF")
        lib.define("scale(Tensor x, float a) -> Tensor")
        lib.define("shift(Tensor x, float b) -> Tensor")
        lib.define("rowsum(Tensor x) -> Tensor")


        def _scale(x, a):
            return x * a


        torch.library.register_kernel("devops::scale", "cpu", _scale)
        torch.library.register_kernel("devops::scale", "hpu", _scale)
        torch.library.register_kernel("devops::scale", ("xpu", "npu"), _scale)


        @torch.library.impl("devops::shift", ["cpu", "privateuseone", "meta"])
        def _shift(x, b):
            return x + b


        lib.impl("rowsum", lambda x: x.sum(-1), "CPU")
        lib.impl("rowsum", lambda x: x.sum(-1), "AutogradNPU")


        @torch.library.custom_op("devops::blend", mutates_args=(),
                                 device_types=("cpu", "hpu", "mtia"))
        def blend(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return x + y
    """,
}


def test_init_accepts_every_device_type_and_records_the_unbuilt_ones(tmp_path, capsys):
    root = write_tree(tmp_path / "devops", DEVOPS)
    assert main(["init", str(root)]) == 0
    err = capsys.readouterr().err
    assert "error" not in err
    matrix = load_matrix(root / "matrix.yaml")
    cpu = matrix.variant("cpu")
    assert [v.name for v in matrix.variants] == ["cpu"]
    assert cpu.expected_keys == ("CPU", "Meta", "Autograd")
    # what each op is checked for: what it has of what the cpu variant builds, nothing more
    assert matrix.extension.op_keys(cpu) == {"scale": ("CPU",), "shift": ("CPU", "Meta"),
                                             "rowsum": ("CPU",),
                                             "blend": ("CPU", "Meta", "Autograd")}
    text = (root / "matrix.yaml").read_text()
    assert "- scale: {remove: [Meta, Autograd]}  # devops/__init__.py; also registers HPU, " \
        "PrivateUse1, XPU (no variant builds hpu, npu, xpu)\n" in text
    assert "also registers HPU, MTIA (no variant builds hpu, mtia)" in text
    assert "also registers AutogradPrivateUse1 (no variant builds npu)" in text
    # reported once, with where 'npu' was read and what it was read as
    assert "devops/__init__.py:24: 'npu' is not one of torch's device types nor dispatch " \
        "keys: read as the PrivateUse1 backend renamed 'npu'" in err
    assert err.count("renamed 'npu'") == 1
    assert "kernels for devices no variant builds, so none expects them" in err
    assert "HPU (hpu): scale, blend" in err and "XPU (xpu): scale" in err
    assert "PrivateUse1 (npu): scale, shift" in err and "MTIA (mtia): blend" in err


_REGISTERED = """
import json, sys, warnings
import torch
warnings.simplefilter("ignore")
import devops
out = {}
for op in sys.argv[1:]:
    dump = torch._C._dispatch_dump(f"devops::{op}")
    out[op] = sorted(line.split(":")[0].replace("[alias]", "") for line in dump.splitlines()
                     if ": registered at" in line and not line.startswith("debug:"))
print(json.dumps(out))
"""


def test_the_scan_reads_the_keys_torch_registers(tmp_path):
    """The package really imports and registers on this torch: the dispatcher's kernels of
    each op, per device, are exactly the keys the scan read from its source."""
    pytest.importorskip("torch")
    root = write_tree(tmp_path / "devops", DEVOPS)
    ops = scan_extension(root).namespaces["devops"]
    ran = subprocess.run([sys.executable, "-c", _REGISTERED, *ops], capture_output=True,
                         text=True, timeout=300, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(root)})
    assert ran.returncode == 0, ran.stderr
    registered = json.loads(ran.stdout)

    def per_device(keys):
        return {k for k in keys if device_type_of(k) is not None or k == "Meta"}

    for name, op in ops.items():
        assert per_device(op.keys) == per_device(registered[name]), name
    assert per_device(registered["scale"]) == {"CPU", "HPU", "XPU", "PrivateUse1"}


def test_cxx_kernels_for_a_device_no_variant_builds_are_reported_not_expected(tmp_path, capsys):
    root = write_tree(tmp_path / "cxxdev", {
        "pyproject.toml": PYPROJECT.replace('"devops"', '"cxxdev"'),
        "cxxdev/__init__.py": "import torch\n",
        "csrc/ops.cpp": """
            #include <torch/library.h>
            TORCH_LIBRARY(cxxdev, m) { m.def("twice(Tensor x) -> Tensor"); }
            TORCH_LIBRARY_IMPL(cxxdev, CPU, m) { m.impl("twice", &twice_cpu); }
            TORCH_LIBRARY_IMPL(cxxdev, PrivateUse1, m) { m.impl("twice", &twice_device); }
            TORCH_LIBRARY_IMPL(cxxdev, AutogradXPU, m) { m.impl("twice", &twice_grad); }
        """,
    })
    assert main(["init", str(root)]) == 0
    err = capsys.readouterr().err
    matrix = load_matrix(root / "matrix.yaml")
    # an XPU autograd kernel is XPU's, not every device's Autograd
    assert matrix.variant("cpu").expected_keys == ("CPU",)
    assert "AutogradXPU (xpu): twice; PrivateUse1 (privateuseone): twice" in err
    assert "also registers AutogradXPU, PrivateUse1 (no variant builds xpu, privateuseone)" in \
        (root / "matrix.yaml").read_text()


def test_a_name_torch_library_refuses_is_a_note_not_an_error(tmp_path, capsys):
    root = write_tree(tmp_path / "refused", {
        "pyproject.toml": PYPROJECT.replace('"devops"', '"refused"'),
        "refused/__init__.py": """
            import torch
            lib = torch.library.Library("refused", "DEF")
            lib.define("f(Tensor x) -> Tensor")
            torch.library.register_kernel("refused::f", "cpu", lambda x: x)
            torch.library.impl("refused::f", "mkldnn", lambda x: x)
            torch.library.impl("refused::f", "Cuda", lambda x: x)
            lib.impl("f", lambda x: x, "cuda")
            torch.library.register_autocast("refused::f", "meta", torch.float32)
        """,
    })
    assert main(["init", str(root)]) == 0
    err = capsys.readouterr().err
    assert "refused/__init__.py:5: 'mkldnn' is a retired caffe2 device type with no dispatch " \
        "key, so torch.library refuses it (no key counted)" in err
    assert "refused/__init__.py:6: 'Cuda' is neither a dispatch key nor a device type (did " \
        "you mean 'cuda'?)" in err
    assert "refused/__init__.py:7: Library.impl takes a dispatch key, not 'cuda' (did you " \
        "mean 'CUDA'?)" in err
    assert "refused/__init__.py:8: 'meta' is not a device type torch has autocast for" in err
    ops = scan_extension(root).namespaces["refused"]
    assert ops["f"].keys == {"CPU"}


@pytest.mark.slow
def test_the_package_is_green_on_its_first_run(tmp_path):
    """init -> build cpu -> smoke, unedited: kernels for hpu, xpu, mtia and a renamed npu make
    no red (the package is healthy), the census checks what the cpu wheel must hold."""
    from adopt_cli import ok, opforge_cli

    root = write_tree(tmp_path / "devops", DEVOPS)
    (root / ".git").mkdir()
    ok(opforge_cli("init", ".", "--workflows-ref", "c" * 40, cwd=root), "init")
    ok(opforge_cli("build", "--variant", "cpu", cwd=root), "build")
    smoke = ok(opforge_cli("smoke", "--variant", "cpu", "--json", str(tmp_path / "smoke.json"),
                           cwd=root), "smoke")
    assert "PASS devops" in smoke.stdout + smoke.stderr
    report = json.loads((tmp_path / "smoke.json").read_text())
    census = {row["op"]: row["expected"] for row in report["census"]["ops"]}
    assert census == {"scale": ["CPU"], "shift": ["CPU", "Meta"], "rowsum": ["CPU"],
                      "blend": ["CPU", "Meta", "Autograd"]}
    assert not [c for c in report["checks"] if c["status"] == "fail"]
