"""Causes that need no C++ build: Python registrations, libraries that cannot load (made by gcc
from a few lines of C: a CUDA library linked and left out, a too-new glibc, a file that is not
ELF, another Python's extension module), an empty namespace, the wrong torch.

The packages (causes_corpus.py) are real wheels installed with pip into one environment beside
the test session's torch; each test smoke-tests one with a new interpreter.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
from causes_corpus import LOADING_INIT, SOURCES, broken_binaries, drifted_binary
from causes_kit import first_lines, smoke, the_cause
from smoke_wheelkit import linked_env, write_wheel

from opforge.smoke import report

PINNED = (b"import torch\n_lib = torch.library.Library('pinned', 'DEF')\n"
          b"_lib.define('twice(Tensor x) -> Tensor')\n"
          b"_lib.impl('twice', lambda x: x * 2, 'CPU')\n"
          b"_lib.impl('twice', lambda x: x.new_empty(x.shape), 'Meta')\n")


@pytest.fixture(scope="module")
def python(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("causes-binaries")
    files = broken_binaries(work / "gcc")
    for name in ("pyreg", "nothing"):  # pure Python: no build
        files[f"{name}/__init__.py"] = textwrap.dedent(SOURCES[f"{name}/__init__.py"]).encode()
    broken = write_wheel(work / "broken_plants-1.0-cp311-cp311-linux_x86_64.whl", files,
                         dist="broken-plants", version="1.0")
    pinned = write_wheel(work / "pinned_plant-1.0-cp311-cp311-linux_x86_64.whl",
                         {"pinned/__init__.py": PINNED, "driftsym/__init__.py": LOADING_INIT,
                          "driftsym/_C.so": drifted_binary(work / "gcc")},
                         dist="pinned-plant", version="1.0", requires=("torch==2.12.0",))
    return linked_env(work / "env", Path(sys.executable), broken, pinned)


def test_python_registration_for_an_undefined_op_names_the_nearest(python, tmp_path, capsys):
    rc, doc, out = smoke(capsys, python, "pyreg", "--expect-keys", "CPU,Meta",
                         json_path=tmp_path / "r.json")
    assert rc == 1
    cause = the_cause(doc, "python_registration")
    assert cause["op"] == "pyreg::scaled_ad" and cause["nearest"] == "pyreg::scaled_add"
    assert cause["api"] == "register_fake"
    assert any("site-packages/pyreg/__init__.py:" in e for e in cause["evidence"])  # its line
    assert any("import pyreg fails" in e for e in cause["evidence"])
    assert [c["class"] for c in doc["causes"]] == ["python_registration"]  # no fake: a symptom
    assert first_lines(out)[0] == ("FAIL python registration: register_fake for pyreg::scaled_ad, "
                                   "which the library does not define; did you mean "
                                   "pyreg::scaled_add?")


def test_a_namespace_nothing_registers_fails_in_every_report(python, tmp_path, capsys):
    rc, doc, _ = smoke(capsys, python, "nothing", "--junit", str(tmp_path / "j.xml"),
                       json_path=tmp_path / "r.json")
    assert rc == 1  # no promised keys, no declared ops: still a failure
    cause = the_cause(doc, "empty_namespace")
    assert cause["title"].startswith("torch.ops.nothing has no ops after import nothing")
    assert "registered no op schema in any namespace" in cause["evidence"][0]
    assert 'name="cause:empty_namespace"' in (tmp_path / "j.xml").read_text()
    assert "**FAIL empty namespace**: torch.ops.nothing has no ops" in report.step_summary(doc)


@pytest.mark.parametrize("package, kind, words", [
    ("cudaside", "cuda_extension_cpu_torch", ["links libc10_cuda.so",
                                              "a CUDA build of the extension was installed "
                                              "beside a CPU torch"]),
    ("newglibc", "runtime_too_new", ["needs GLIBC_9.9", "built on a newer system"]),
    ("notelf", "not_a_library", ["is not a loadable library for this machine"]),
    ("oldpy", "other_python", ["extension module for CPython 3.9", "Python 3.11"
                               if sys.version_info[:2] == (3, 11) else "Python 3."]),
])
def test_library_that_cannot_load_is_classified(python, tmp_path, capsys, package, kind, words):
    rc, doc, out = smoke(capsys, python, package, "--expect-keys", "CPU",
                         json_path=tmp_path / "r.json")
    assert rc == 1
    cause = the_cause(doc, "load_error")
    assert cause["kind"] == kind and package in cause["library"]
    for word in words:
        assert word in cause["title"]
    assert cause["fix"]
    # the import failure and the empty namespace are its symptoms, not causes of their own
    assert [c["class"] for c in doc["causes"]] == ["load_error"]
    assert "import" in cause["explains"]
    assert first_lines(out)[0].startswith("FAIL load error: ")
    assert "FAIL import:" not in out


def test_undefined_symbol_names_it_demangled_with_both_torches(python, tmp_path, capsys):
    rc, doc, out = smoke(capsys, python, "driftsym", json_path=tmp_path / "r.json")
    assert rc == 1
    cause = the_cause(doc, "load_error")
    assert cause["kind"] == "abi_drift"
    assert cause["title"].startswith("ABI drift: _C.so needs symbol "
                                     "c10::opforge_planted_removed()")
    assert "built against torch 2.12.0, running torch 2.13.0" in " ".join(cause["evidence"])
    assert "pip install torch==2.12.0" in cause["fix"]
    assert not [c for c in doc["causes"] if c["class"] == "wrong_torch"]  # said once


def test_wheel_beside_another_torch_is_a_cause_that_keeps_its_warning(python, tmp_path, capsys):
    rc, doc, out = smoke(capsys, python, "pinned", "--expect-keys", "CPU,Meta",
                         json_path=tmp_path / "r.json")
    assert rc == 0  # it loads: a warning, as documented
    cause = the_cause(doc, "wrong_torch")
    assert cause["status"] == "warn"
    assert "not the torch pinned was built for (2.12.0)" in cause["title"]
    assert "pip install the torch the wheel pins (torch==2.12.0)" in cause["fix"]
    assert cause["explains"] == ["torch-match"]
    assert first_lines(out)[0].startswith("WARN wrong torch: torch 2.13.0")


def test_healthy_torchvision_under_a_wrong_namespace_fails_naming_its_own(tmp_path, capsys):
    """A census of zero ops never passes: torchvision's ops are named where they are."""
    from smoke_wheelkit import torchvision_python

    rc, doc, out = smoke(capsys, torchvision_python(), "torchvision", namespace="wrongns",
                         json_path=tmp_path / "r.json")
    assert rc == 1
    cause = the_cause(doc, "namespace_mismatch")
    assert cause["found"] == "torchvision" and {"nms", "roi_align"} <= set(cause["ops"])
    assert first_lines(out)[0] == ("FAIL namespace mismatch: the package registered its ops "
                                   "under torchvision, not wrongns: torch.ops.wrongns has none")
