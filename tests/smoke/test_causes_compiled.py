"""Each planted C++ extension (causes_corpus.py): smoke names its cause, with the evidence.

One wheel holds every plant (built once, through the compiler cache); it is installed with pip
into one environment beside the test session's torch, and each test smoke-tests one package
of it with a new interpreter, as a user's CI would.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from causes_kit import corpus_wheel, first_lines, smoke, the_cause
from smoke_wheelkit import linked_env

OPS = "--ops=scaled_add,scaled_mul,clamp01"


@pytest.fixture(scope="module")
def python(tmp_path_factory) -> Path:
    return linked_env(tmp_path_factory.mktemp("causes") / "env", Path(sys.executable),
                      corpus_wheel())


def test_schemas_under_another_namespace_are_named_with_their_ops(python, tmp_path, capsys):
    rc, doc, out = smoke(capsys, python, "myops", "--expect-keys", "CPU,Meta,Autograd", OPS,
                         json_path=tmp_path / "r.json")
    assert rc == 1
    cause = the_cause(doc, "namespace_mismatch")
    assert cause["found"] == "my_ops" and cause["configured"] == "myops"
    assert cause["ops"] == ["clamp01", "scaled_add", "scaled_mul"]
    assert "(a near-miss spelling)" in cause["title"]
    assert any("register_fake('myops::scaled_add')" in e for e in cause["evidence"])
    assert "TORCH_LIBRARY(myops, m)" in cause["fix"] and "--namespace my_ops" in cause["fix"]
    # one cause: no orphan-kernel block for myops (it is evidence here), no red herrings
    assert [c["class"] for c in doc["causes"]] == ["namespace_mismatch"]
    assert all(c.get("explained_by_cause") == cause["id"] for c in doc["checks"]
               if c["status"] == "fail" and c["category"] != "cause")
    # each op "not registered": said once, under the cause
    assert cause["explains"] == ["census:scaled_add", "census:scaled_mul", "census:clamp01"]
    # the cause's block, up to its "explains" line: a long site-packages path (a deep TMPDIR,
    # an xdist worker's folder) wraps the evidence over more lines, so no fixed line count
    top = first_lines(out, 12)
    assert top[0].startswith("FAIL namespace mismatch: the package registered its ops under "
                             "my_ops (a near-miss spelling), not myops")
    block = top[:next((i for i, line in enumerate(top) if line.strip().startswith("explains")),
                      len(top))]
    assert any(line.strip().startswith("fix: TORCH_LIBRARY(myops, m)") for line in block), out
    assert "FAIL census:" not in out and "Autograd kernel" not in out


def test_impl_for_a_misspelt_namespace_and_op_are_orphans(python, tmp_path, capsys):
    rc, doc, out = smoke(capsys, python, "implz", "--expect-keys", "CPU", OPS,
                         json_path=tmp_path / "r.json")
    assert rc == 1
    by_ns = {c["namespace"]: c for c in doc["causes"] if c["class"] == "orphan_kernels"}
    typo = by_ns["implzz"]
    assert typo["nearest"] == "implz" and typo["orphans"] == ["scaled_add", "scaled_mul"]
    assert "TORCH_LIBRARY_IMPL(implz, ...) instead of TORCH_LIBRARY_IMPL(implzz, ...)" in typo["fix"]
    assert any("implz.cpp" in e for e in typo["evidence"])  # where the kernels were registered
    name = by_ns["implz"]
    assert name["orphans"] == ["clampp01"] and name["nearest"] == ["clamp01"]
    assert "clampp01 -> clamp01" in name["title"]
    # the three "has no CPU kernel" census failures are grouped under the two causes
    explained = set(typo["explains"]) | set(name["explains"])
    assert {"census:scaled_add:CPU", "census:scaled_mul:CPU", "census:clamp01:CPU"} <= explained
    assert "FAIL census:" not in out


def test_configured_namespace_with_no_ops_fails_and_names_where_they_went(python, tmp_path,
                                                                          capsys):
    rc, doc, out = smoke(capsys, python, "fakeless", namespace="wrongns",
                         json_path=tmp_path / "r.json")
    assert rc == 1  # a census of zero ops never passes
    cause = the_cause(doc, "namespace_mismatch")
    assert cause["found"] == "fakeless" and cause["ops"] == ["clamp01", "scaled_mul"]
    assert "(a near-miss spelling)" not in cause["title"]


def test_library_the_import_never_loads_is_named_with_the_missing_import(python, tmp_path,
                                                                         capsys):
    rc, doc, _ = smoke(capsys, python, "lazyops", "--expect-keys", "CPU", OPS,
                       json_path=tmp_path / "r.json")
    assert rc == 1
    cause = the_cause(doc, "library_not_loaded")
    assert Path(cause["library"]).name.startswith("_C.") and "lazyops" in cause["library"]
    assert "import lazyops._C" in cause["fix"] and "torch.ops.load_library" in cause["fix"]
    assert any("lazyops::scaled_add" in e for e in cause["evidence"])


def test_two_libraries_defining_one_namespace_name_both_sources(python, tmp_path, capsys):
    rc, doc, out = smoke(capsys, python, "twice", "--expect-keys", "CPU",
                         json_path=tmp_path / "r.json")
    assert rc == 1
    cause = the_cause(doc, "duplicate_namespace")
    assert cause["namespace"] == "twice"
    assert "twice_a.cpp:2" in cause["evidence"][0] and "twice_b.cpp:2" in cause["evidence"][1]
    assert "TORCH_LIBRARY_FRAGMENT(twice, m)" in cause["fix"]
    assert first_lines(out)[0].startswith("FAIL duplicate namespace: namespace twice is defined "
                                          "twice")


@pytest.mark.parametrize("promised, status", [("CPU,Meta", "fail"), ("CPU", "warn")])
def test_op_without_fake_kernel_is_named(python, tmp_path, capsys, promised, status):
    rc, doc, _ = smoke(capsys, python, "fakeless", "--expect-keys", promised,
                       json_path=tmp_path / "r.json")
    assert rc == (1 if status == "fail" else 0)
    cause = the_cause(doc, "missing_fake")
    assert cause["status"] == status and cause["ops"] == ["clamp01"]  # scaled_mul has one
    assert 'register_fake("fakeless::clamp01")' in cause["fix"]
    if status == "fail":
        assert cause["explains"] == ["census:clamp01:Meta"]
