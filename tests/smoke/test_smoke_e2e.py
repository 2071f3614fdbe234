"""End to end: real wheels, real environments, real pip, a new interpreter; assert the diagnosis.

Each case is a way an op extension breaks for its users; the test asserts the sentence the
user reads, not only the exit code.
"""

from __future__ import annotations

import json
import runpy
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from smoke_wheelkit import REPO, doctor_wheel, gcc, linked_env, torchvision_python, write_wheel

from opforge.cli import main
from opforge.matrix import load_matrix

pytestmark = pytest.mark.slow
# the doctored packages are ELF libraries built with gcc and linked with -soname
elf_only = pytest.mark.skipif(sys.platform != "linux" or shutil.which("gcc") is None,
                              reason="builds ELF shared libraries with gcc (Linux)")


def smoke(capsys, *argv: str, json_path: Path) -> tuple[int, dict, str]:
    rc = main(["smoke", *argv, "--json", str(json_path)])
    out = capsys.readouterr()
    return rc, json.loads(json_path.read_text()), out.out + out.err


def checks(doc: dict, **match) -> list[dict]:
    return [c for c in doc["checks"] if all(c.get(k) == v for k, v in match.items())]


def one(doc: dict, check_id: str) -> dict:
    found = [c for c in doc["checks"] if c["id"] == check_id]
    assert len(found) == 1, f"{check_id} not in {[c['id'] for c in doc['checks']]}"
    return found[0]


def test_good_cpu_wheel_passes_in_a_fresh_environment(cpu_wheels, tmp_path, capsys,
                                                      monkeypatch):
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("OPFORGE_TORCH_INDEX", "pypi")
    env_dir = tmp_path / "env"
    rc, doc, out = smoke(capsys, "--wheel", str(cpu_wheels.good), "--junit",
                         str(tmp_path / "junit.xml"), "--keep-env", "--env-dir", str(env_dir),
                         json_path=tmp_path / "r.json")
    failures = [f"{c['id']}: {c['message']}" for c in checks(doc, status="fail")]
    assert rc == 0, failures
    assert failures == []
    # the variant comes from the wheel's local version (+cpu) and every promise is checked
    assert doc["variant"] == "cpu"
    assert doc["expected_keys"] == ["CPU", "Meta", "Autograd", "AutocastCPU"]
    for op in load_matrix(REPO / "matrix.yaml").extension.ops:
        for key in doc["expected_keys"]:
            assert one(doc, f"census:{op}:{key}")["status"] == "pass"
        assert one(doc, f"run:{op}:cpu")["status"] == "pass"
        assert one(doc, f"fake:{op}")["status"] == "pass"
        assert one(doc, f"compile:{op}")["status"] == "pass"
    recipes = runpy.run_path(str(REPO / "extension" / "recipes.py"))["RECIPES"]
    autocast_ops = sorted(op for op, recipe in recipes.items() if recipe.get("autocast"))
    assert autocast_ops and all(one(doc, f"autocast:{op}:cpu")["status"] == "pass" for op in autocast_ops)
    # it ran where users run: installed wheel, fresh env, scratch cwd, not the checkout
    assert doc["runner"]["fresh_env"] is True
    assert "site-packages" in doc["import"]["package_dir"]
    assert not doc["environment"]["cwd"].startswith(str(Path(__file__).parents[2]))
    assert doc["environment"]["torch_matches_build"] is True
    # no GPU here: the accelerators are skipped-no-device, never passed
    for c in doc["checks"]:
        if c.get("device") in ("cuda", "mps"):
            assert (c["status"], c.get("reason")) == ("skip", "no-device"), c
    assert "PASS opforge_ops" in out and "kernel census" in out
    assert "::error" not in out
    suite = ET.parse(tmp_path / "junit.xml").getroot().find("testsuite")
    assert suite.get("failures") == "0" and int(suite.get("tests")) == len(doc["checks"])
    assert "PASS opforge_ops" in summary.read_text()

    # the probe's cost beside a bare import, printed for the record: speed is measured in
    # benchmarks, never asserted in a test (a loaded CI machine would make it flaky)
    python = doc["runner"]["python"]
    t0 = time.monotonic()
    subprocess.run([python, "-c", "import torch, opforge_ops"], check=True, cwd=tmp_path)
    bare = time.monotonic() - t0
    probe = doc["runner"]["probe_wall_s"]
    print(f"\nsmoke timing: create env {doc['runner']['create_env_s']} s, install "
          f"{doc['runner']['install_s']} s, probe {probe} s; bare import {bare:.2f} s; "
          f"builds {cpu_wheels.build_seconds}")


def test_wheel_without_its_compiled_library_names_the_missing_file(
        cpu_wheels, torch_2_13, tmp_path, capsys):
    wheel = doctor_wheel(cpu_wheels.good, tmp_path / "doctored",
                         lambda name: name.startswith("opforge_ops/_C") and ".so" in name)
    python = linked_env(tmp_path / "env", torch_2_13, wheel)
    rc, doc, out = smoke(capsys, "--python", str(python), "--variant", "cpu",
                         json_path=tmp_path / "r.json")
    assert rc == 1
    check = one(doc, "import")
    assert check["status"] == "fail" and check["kind"] == "no_library"
    assert "opforge_ops has no compiled library" in check["message"]
    assert "rebuild the wheel" in check["message"]
    # the ops are then missing too, and said so with the error a user would see
    assert "operator opforge::nms does not exist" in one(doc, "census:nms")["message"]
    # the cause comes first; the import check is its symptom, listed under it
    assert "FAIL import error: import opforge_ops fails: opforge_ops has no compiled library" in out


def test_kernel_left_out_of_the_build_is_named_by_op_and_key(cpu_wheels, torch_2_13,
                                                             tmp_path, capsys):
    python = linked_env(tmp_path / "env", torch_2_13, cpu_wheels.omitted)
    rc, doc, out = smoke(capsys, "--python", str(python), json_path=tmp_path / "r.json")
    assert rc == 1
    # no --variant: the installed build record says cpu, and cpu's promises are checked
    assert (doc["variant"], doc["variant_source"]) == ("cpu", "opforge-ops build record")
    assert doc["expected_keys"] == ["CPU", "Meta", "Autograd", "AutocastCPU"]
    assert one(doc, "import")["status"] == "pass"
    failed = {c["id"] for c in checks(doc, category="census", status="fail")}
    assert failed == {"census:roi_align:CPU", "census:_roi_align_backward:CPU"}
    msg = one(doc, "census:roi_align:CPU")["message"]
    assert msg.startswith("roi_align has no CPU kernel")
    assert "Could not run 'opforge::roi_align' with arguments from the 'CPU' backend" in msg
    run = one(doc, "run:roi_align:cpu")
    assert run["status"] == "fail" and run["explained_by"] == "census: roi_align has no CPU kernel"
    assert one(doc, "census:nms:CPU")["status"] == "pass"
    assert one(doc, "run:nms:cpu")["status"] == "pass"
    assert "MISSING" in out and "FAIL census:roi_align:CPU" in out


def test_wheel_beside_another_torch_says_what_happened(cpu_wheels, torch_2_14, tmp_path, capsys):
    python = linked_env(tmp_path / "env", torch_2_14, cpu_wheels.good)
    rc, doc, out = smoke(capsys, "--python", str(python), "--variant", "cpu",
                         json_path=tmp_path / "r.json")
    assert doc["environment"]["torch_version"].startswith("2.14.1")
    match = one(doc, "torch-match")
    assert match["status"] == "warn"
    assert "built against torch 2.13.0" in match["message"]
    assert "torch 2.14.1" in match["message"]
    imported = one(doc, "import")
    if imported["status"] == "fail":
        # the common outcome: C++ symbols moved between releases
        assert imported["kind"] == "abi_drift"
        assert "ABI drift" in imported["message"] and "needs symbol" in imported["message"]
        assert "pip install torch==2.13.0" in imported["message"]
        assert rc == 1
    else:
        assert "and it loads" in match["message"]
    # a load failure is the cause (torch-match stays a warning of its own); else the wrong torch
    assert ("WARN torch-match" if imported["status"] == "fail" else "WARN wrong torch: torch 2.14.1") \
        in out


def _linked_library_package(tmp_path: Path, missing: str, soname: str,
                            swallow: bool = False) -> Path:
    """A package whose _ext.so links ``soname`` (built here, then left out of the wheel);
    ``swallow``: its __init__ hides the load error, as torchvision's extension loader does."""
    build = tmp_path / "build"
    build.mkdir()
    (build / "dep.c").write_text("int dep_answer(void) { return 42; }\n")
    (build / "ext.c").write_text("int dep_answer(void);\nint ext_answer(void) "
                                 "{ return dep_answer(); }\n")
    gcc("-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(build / soname),
        str(build / "dep.c"))
    gcc("-shared", "-fPIC", "-o", str(build / "_ext.so"), str(build / "ext.c"),
        str(build / soname), "-Wl,--no-as-needed")
    init = ("import ctypes, os\n"
            "_lib = ctypes.CDLL(os.path.join(os.path.dirname(__file__), '_ext.so'))\n")
    if swallow:
        init = "try:\n" + "".join(f"    {line}\n" for line in init.splitlines()) + \
            "except OSError:\n    _lib = None\n"
    return write_wheel(tmp_path / f"{missing}-1.0-py3-none-linux_x86_64.whl",
                       {f"{missing}/__init__.py": init.encode(),
                        f"{missing}/_ext.so": (build / "_ext.so").read_bytes()},
                       dist=missing, version="1.0")


@elf_only
def test_library_linking_a_missing_library_is_named(torch_2_13, tmp_path, capsys):
    wheel = _linked_library_package(tmp_path, "linkpkg", "libfoo.so.1")
    python = linked_env(tmp_path / "env", torch_2_13, wheel)
    rc, doc, out = smoke(capsys, "--python", str(python), "--package", "linkpkg",
                         "--namespace", "linkpkg", json_path=tmp_path / "r.json")
    assert rc == 1
    check = one(doc, "import")
    assert check["kind"] == "missing_library"
    assert "_ext.so links libfoo.so.1, which is neither installed on this system nor bundled " \
           "in the wheel" in check["message"]
    assert "auditwheel repair" in check["message"]


@elf_only
def test_cuda_extension_beside_cpu_torch_is_named(torch_2_13, tmp_path, capsys):
    wheel = _linked_library_package(tmp_path, "cudapkg", "libc10_cuda.so")
    python = linked_env(tmp_path / "env", torch_2_13, wheel)
    rc, doc, out = smoke(capsys, "--python", str(python), "--package", "cudapkg",
                         "--namespace", "cudapkg", json_path=tmp_path / "r.json")
    assert rc == 1
    check = one(doc, "import")
    assert check["kind"] == "cuda_extension_cpu_torch"
    assert "links libc10_cuda.so, a CUDA library, but torch 2.13.0+cpu is a CPU build" \
           in check["message"]


def test_python_error_in_the_package_is_located(torch_2_13, tmp_path, capsys):
    wheel = write_wheel(tmp_path / "pyerr-1.0-py3-none-any.whl",
                        {"pyerr/__init__.py": b"from . import helpers\n",
                         "pyerr/helpers.py": b"import torch\nVALUE = torch.nonexistent_attr\n"},
                        dist="pyerr", version="1.0")
    python = linked_env(tmp_path / "env", torch_2_13, wheel)
    rc, doc, _ = smoke(capsys, "--python", str(python), "--package", "pyerr",
                       "--namespace", "pyerr", json_path=tmp_path / "r.json")
    assert rc == 1
    check = one(doc, "import")
    assert check["kind"] == "python_error"  # nothing compiled, nothing failed to load
    assert "AttributeError" in check["message"] and "helpers.py:2" in check["message"]


def test_interpreter_crash_during_import_is_reported(torch_2_13, tmp_path, capsys):
    wheel = write_wheel(tmp_path / "crashpkg-1.0-py3-none-any.whl",
                        {"crashpkg/__init__.py": b"import os\nos.abort()\n"},
                        dist="crashpkg", version="1.0")
    python = linked_env(tmp_path / "env", torch_2_13, wheel)
    rc, doc, _ = smoke(capsys, "--python", str(python), "--package", "crashpkg",
                       "--namespace", "crashpkg", json_path=tmp_path / "r.json")
    assert rc == 1
    assert "the interpreter died with SIGABRT while probing" in one(doc, "probe")["message"]


def test_package_that_is_not_installed(torch_2_13, capsys, tmp_path):
    rc, doc, _ = smoke(capsys, "--python", str(torch_2_13), "--package", "no_such_pkg_xyz",
                       "--namespace", "nope", json_path=tmp_path / "r.json")
    assert rc == 1
    check = one(doc, "import")
    assert check["kind"] == "not_installed"
    assert "no package 'no_such_pkg_xyz' is importable" in check["message"]


@elf_only
def test_undefined_torch_symbol_with_another_build_torch_is_abi_drift(torch_2_13, tmp_path,
                                                                      capsys):
    """Deterministic drift: the library needs a c10 symbol this torch does not export."""
    build = tmp_path / "build"
    build.mkdir()
    (build / "ext.c").write_text("void _ZN3c1021opforge_tests_removedEv(void);\n"
                                 "void ext_call(void) { _ZN3c1021opforge_tests_removedEv(); }\n")
    gcc("-shared", "-fPIC", "-o", str(build / "_C.so"), str(build / "ext.c"))
    info = json.dumps({"schema": 1, "variant": "cpu", "torch_version": "2.12.0",
                       "libraries": [{"path": "driftpkg/_C.so", "backends": ["cpu"]}]})
    init = b"import ctypes, os, torch\nctypes.CDLL(os.path.join(os.path.dirname(__file__), '_C.so'))\n"
    wheel = write_wheel(tmp_path / "driftpkg-1.0-py3-none-linux_x86_64.whl",
                        {"driftpkg/__init__.py": init, "driftpkg/_C.so": (build / "_C.so").read_bytes(),
                         "driftpkg-1.0.dist-info/opforge-build.json": info.encode()},
                        dist="driftpkg", version="1.0", requires=("torch==2.12.0",))
    python = linked_env(tmp_path / "env", torch_2_13, wheel)
    rc, doc, _ = smoke(capsys, "--python", str(python), "--package", "driftpkg",
                       "--namespace", "driftpkg", json_path=tmp_path / "r.json")
    assert rc == 1
    check = one(doc, "import")
    assert check["kind"] == "abi_drift"
    assert "ABI drift: _C.so needs symbol c10::opforge_tests_removed()" in check["message"]
    assert "built against torch 2.12.0 (driftpkg build record (opforge-build.json)), running " \
           "torch 2.13.0" in check["message"]
    assert "pip install torch==2.12.0" in check["message"]
    assert one(doc, "torch-match")["status"] == "warn"


def test_torchvision_report_is_truthful(tmp_path, capsys):
    """The probe is not opforge-specific: torchvision's namespace, schemas and kernels."""
    python = torchvision_python()
    rc, doc, out = smoke(capsys, "--python", str(python), "--package", "torchvision",
                         "--namespace", "torchvision", "--expect-keys", "CPU,CUDA,Meta",
                         "--ops", "nms,roi_align,roi_pool,deform_conv2d",
                         # torchvision's schemas are the extension's: its recipes call them
                         "--recipes", str(REPO / "extension" / "recipes.py"),
                         json_path=tmp_path / "r.json")
    assert rc == 0, [c["message"] for c in checks(doc, status="fail")]
    # CUDA kernels are registered, but there is no CUDA device here: skipped, never passed
    assert one(doc, "census:nms:CUDA")["status"] == "pass"
    assert one(doc, "run:nms:cuda")["reason"] == "no-device"
    mps_row = next(r for r in doc["census"]["ops"] if r["op"] == "roi_align")
    assert mps_row["keys"]["MPS"]["status"] == "absent"
    assert one(doc, "run:roi_align:cpu")["status"] == "pass"
    assert one(doc, "compile:deform_conv2d")["status"] == "pass"
    # ops found in the namespace beyond the declared ones are taken into the census too
    qnms = next(r for r in doc["census"]["ops"] if r["op"] == "qnms")
    assert qnms["declared"] is False and qnms["keys"]["CPU"]["status"] == "present"


def test_ops_of_any_namespace_without_a_recipe_are_census_only(torch_2_13, tmp_path, capsys):
    """A Python-defined op library: census against the promised keys, runs only by recipe."""
    init = (b"import torch\n"
            b"_lib = torch.library.Library('pyops', 'DEF')\n"
            b"_lib.define('twice(Tensor x) -> Tensor')\n"
            b"_lib.impl('twice', lambda x: x * 2, 'CPU')\n"
            b"_lib.define('nms(Tensor boxes) -> Tensor')\n"  # a recipe's name, another schema
            b"_lib.impl('nms', lambda b: b[:, 0].argsort(), 'CompositeExplicitAutograd')\n")
    wheel = write_wheel(tmp_path / "pyops-1.0-py3-none-any.whl", {"pyops/__init__.py": init},
                        dist="pyops", version="1.0")
    python = linked_env(tmp_path / "env", torch_2_13, wheel)
    rc, doc, out = smoke(capsys, "--python", str(python), "--package", "pyops",
                         "--namespace", "pyops", "--expect-keys", "CPU,Meta",
                         json_path=tmp_path / "r.json")
    assert rc == 1
    assert one(doc, "census:twice:CPU")["status"] == "pass"
    meta = one(doc, "census:twice:Meta")
    assert meta["status"] == "fail" and "twice has no Meta (fake) kernel" in meta["message"]
    # CompositeExplicitAutograd serves every backend and Meta
    nms_cpu = one(doc, "census:nms:CPU")
    assert nms_cpu["status"] == "pass" and "via CompositeExplicitAutograd" in nms_cpu["message"]
    assert one(doc, "run:twice")["reason"] == "no-recipe"
    assert one(doc, "run:nms")["status"] == "warn"  # says so, without failing the run
    assert "census only (no recipe says how to call it): nms, twice" in out


def test_requirement_beside_a_forced_torch_reports_the_pin_it_breaks(tmp_path, capsys,
                                                                     monkeypatch):
    """--requirement and --torch: torch first, then the package without its dependencies."""
    monkeypatch.setenv("OPFORGE_TORCH_INDEX", "pypi")
    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    init = (b"import torch\n_lib = torch.library.Library('pinpkg', 'DEF')\n"
            b"_lib.define('twice(Tensor x) -> Tensor')\n"
            b"_lib.impl('twice', lambda x: x * 2, 'CPU')\n")
    wheel = write_wheel(tmp_path / "pinpkg-1.0-py3-none-any.whl", {"pinpkg/__init__.py": init},
                        dist="pinpkg", version="1.0", requires=("torch==2.12.0",))
    rc, doc, out = smoke(capsys, "--requirement", str(wheel), "--torch", "torch==2.13.0",
                         "--package", "pinpkg", "--namespace", "pinpkg", "--expect-keys", "CPU",
                         json_path=tmp_path / "r.json")
    assert rc == 0, [c["message"] for c in checks(doc, status="fail")]
    assert doc["runner"]["installs"][0].startswith("pip install torch==2.13.0")
    assert doc["runner"]["installs"][1] == f"pip install --no-deps {wheel}"
    match = one(doc, "torch-match")
    assert match["status"] == "warn"
    assert match["message"].startswith("pinpkg was built against torch 2.12.0 (pinpkg wheel pin "
                                       "torch==2.12.0) but torch 2.13.0+cpu is running, and it "
                                       "loads")
    assert one(doc, "census:twice:CPU")["status"] == "pass"
    assert "::warning" not in out  # not in GitHub Actions: no annotations


@elf_only
def test_package_that_hides_its_load_failure_still_fails(torch_2_13, tmp_path, capsys):
    wheel = _linked_library_package(tmp_path, "hidepkg", "libbar.so.2", swallow=True)
    python = linked_env(tmp_path / "env", torch_2_13, wheel)
    rc, doc, _ = smoke(capsys, "--python", str(python), "--package", "hidepkg",
                       "--namespace", "hidepkg", json_path=tmp_path / "r.json")
    assert rc == 1
    check = one(doc, "import")
    assert doc["import"]["ok"] is True
    assert check["status"] == "fail" and check["kind"] == "missing_library"
    assert check["message"].startswith("import hidepkg succeeded but hid a load failure: "
                                       "_ext.so links libbar.so.2")


def test_package_imported_from_the_source_tree_is_caught(torch_2_13, tmp_path, capsys,
                                                         monkeypatch):
    tree = REPO / "build" / "smoke-tests" / "checkout-import"
    shutil.rmtree(tree, ignore_errors=True)
    (tree / "treepkg").mkdir(parents=True)
    (tree / "treepkg" / "__init__.py").write_text("")
    monkeypatch.setenv("PYTHONPATH", str(tree))  # --python keeps the user's environment
    try:
        rc, doc, _ = smoke(capsys, "--python", str(torch_2_13), "--package", "treepkg",
                           "--namespace", "treepkg", json_path=tmp_path / "r.json")
    finally:
        shutil.rmtree(tree, ignore_errors=True)
    assert rc == 1
    assert one(doc, "import-location")["message"].startswith(
        f"treepkg was imported from the source tree ({tree / 'treepkg'}")


def test_interpreter_without_torch_says_so(tmp_path, capsys):
    from opforge.venv import create_venv

    python = create_venv(tmp_path / "bare")
    rc, doc, _ = smoke(capsys, "--python", str(python), "--package", "anything",
                       "--namespace", "anything", json_path=tmp_path / "r.json")
    assert rc == 1
    check = one(doc, "import-torch")
    assert check["message"].startswith(f"import torch fails in {python}: ModuleNotFoundError")


RECIPES_WITH_MISTAKES = '''\
import torch


def twice_inputs(dtype):
    return [torch.arange(4, dtype=dtype)]


def broken_inputs(dtype):
    return [torch.ones(2, dtype=dtype) / 0 + undefined_name]  # line 9: the recipe's own bug


def wrong_answer(call, args, out):
    return "not what the maintainer expected"


RECIPES = {
    "twice": {"inputs": twice_inputs, "expected": [0.0, 2.0, 4.0, 6.0], "grad": [0]},
    "thrice": {"inputs": broken_inputs},
    "halve": {"inputs": twice_inputs, "check": wrong_answer},
    "gone": {"inputs": twice_inputs},
}
'''


def test_recipes_file_drives_the_runs_and_its_mistakes_name_file_and_line(torch_2_13, tmp_path,
                                                                          capsys):
    """The probe knows no op: the recipes say how to call each one; a raising recipe is that
    recipe's failure with its file:line, an op without one is census only."""
    init = (b"import torch\n"
            b"_lib = torch.library.Library('recipeops', 'DEF')\n"
            b"for _name, _f in (('twice', 2), ('thrice', 3), ('halve', 0.5), ('quad', 4)):\n"
            b"    _lib.define(_name + '(Tensor x) -> Tensor')\n"
            b"    _lib.impl(_name, (lambda f: lambda x: x * f)(_f), 'CompositeImplicitAutograd')\n")
    wheel = write_wheel(tmp_path / "recipeops-1.0-py3-none-any.whl",
                        {"recipeops/__init__.py": init}, dist="recipeops", version="1.0")
    recipes = tmp_path / "my_recipes.py"
    recipes.write_text(RECIPES_WITH_MISTAKES)
    python = linked_env(tmp_path / "env", torch_2_13, wheel)
    rc, doc, out = smoke(capsys, "--python", str(python), "--package", "recipeops",
                         "--namespace", "recipeops", "--expect-keys", "CPU",
                         "--recipes", str(recipes), json_path=tmp_path / "r.json")
    assert rc == 1
    assert one(doc, "run:twice:cpu")["status"] == "pass"
    assert one(doc, "run:twice:cpu:backward")["status"] == "pass"
    broken = one(doc, "recipe:thrice")
    assert broken["status"] == "fail" and f"{recipes}:9" in broken["message"]
    assert "recipe 'thrice' inputs raised NameError" in broken["message"]
    halve = one(doc, "run:halve:cpu")
    assert halve["status"] == "fail" and "not what the maintainer expected" in halve["message"]
    assert one(doc, "run:quad")["reason"] == "no-recipe"
    assert "recipe for gone, which is not an op" in one(doc, "recipe:gone")["message"]
    # the probe itself carried on: every op has its census
    assert {r["op"] for r in doc["census"]["ops"]} == {"twice", "thrice", "halve", "quad"}
