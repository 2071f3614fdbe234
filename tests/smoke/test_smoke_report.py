"""The report: table, JUnit XML, step summary, annotations and exit code from a probe document."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path

from rich.console import Console

from opforge.smoke import report


def document(*checks: dict) -> dict:
    return {
        "schema": 1, "package": "pkg", "namespace": "ns", "expected_keys": ["CPU", "Meta"],
        "environment": {"torch_version": "2.13.0+cpu", "python": "3.11"},
        "build": {"built_against_torch": "2.13.0"},
        "devices": {"cpu": {"present": True}, "cuda": {"present": False}},
        "census": {"keys": ["CPU", "Meta", "CUDA"], "ops": [
            {"op": "nms", "found": True, "keys": {"CPU": {"status": "ok"},
                                                   "Meta": {"status": "missing"},
                                                   "CUDA": {"status": "absent"}}}]},
        "checks": list(checks), "summary": {"duration_s": 1.5},
    }


PASS = {"id": "run:nms:cpu", "category": "run", "status": "pass", "message": "ok", "op": "nms",
        "device": "cpu"}
NODEV = {"id": "run:nms:cuda", "category": "run", "status": "skip", "message": "skipped-no-device",
         "op": "nms", "device": "cuda", "reason": "no-device"}
FAIL = {"id": "census:nms:Meta", "category": "census", "status": "fail", "op": "nms",
        "key": "Meta", "message": "nms has no Meta (fake) kernel: 100% broken\nsecond line"}
WARN = {"id": "torch-match", "category": "environment", "status": "warn",
        "message": "built against torch 2.13.0, running 2.14.1"}


def test_exit_code_is_one_only_for_failures():
    assert report.exit_code(document(PASS, NODEV, WARN)) == 0
    assert report.exit_code(document(PASS, FAIL)) == 1


def test_skipped_no_device_is_counted_as_skipped_not_passed():
    line = report.headline(document(PASS, NODEV))
    assert line.startswith("PASS pkg (ns): 1 passed, 0 failed, 0 warnings, 1 skipped")
    assert "(1 skipped-no-device)" in line


def test_junit_has_one_case_per_check_with_failure_and_skip(tmp_path):
    path = tmp_path / "out" / "junit.xml"
    report.write_junit(document(PASS, NODEV, FAIL, WARN), path)
    suite = ET.parse(path).getroot().find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("4", "1", "1")
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    assert cases["census:nms:Meta"].find("failure").get("message").startswith("nms has no Meta")
    assert cases["run:nms:cuda"].find("skipped") is not None
    assert "WARNING" in cases["torch-match"].find("system-out").text
    assert cases["run:nms:cpu"].get("classname") == "smoke.run"


def test_annotations_escape_newlines_and_percent():
    lines = report.annotations(document(PASS, FAIL, WARN))
    assert lines[0].startswith("::error title=opforge smoke pkg%3A census%3Anms%3AMeta::")
    assert "100%25 broken%0Asecond line" in lines[0]
    assert lines[1].startswith("::warning ")
    assert len(lines) == 2


def test_publish_writes_summary_and_annotations_only_when_asked(tmp_path):
    printed = []
    summary = tmp_path / "summary.md"
    report.publish_github(document(FAIL), environ={}, print_fn=printed.append)
    assert printed == [] and not summary.exists()
    report.publish_github(document(FAIL), print_fn=printed.append,
                          environ={"GITHUB_STEP_SUMMARY": str(summary), "GITHUB_ACTIONS": "true"})
    text = summary.read_text()
    assert "**FAIL pkg (ns)" in text and "| `nms` | ✅ | ❌ MISSING | · |" in text
    assert printed and printed[0].startswith("::error ")


def test_terminal_table_shows_census_runs_and_problems():
    console = Console(record=True, width=160)
    report.render_terminal(document(PASS, NODEV, FAIL), console=console)
    text = console.export_text()
    assert "kernel census" in text and "MISSING" in text
    assert "no device" in text  # the cuda column of the runs table
    assert "FAIL census:nms:Meta: nms has no Meta (fake) kernel" in text
    assert text.strip().splitlines()[-1].startswith("FAIL pkg (ns): 1 passed, 1 failed")


def test_probe_that_died_is_a_failure_with_the_signal(tmp_path):
    from opforge.smoke.runner import ProbeRequest, _read_document

    doc = _read_document(tmp_path / "missing.json", -6, "Fatal Python error: Aborted\n",
                         ProbeRequest("pkg", "ns"), 60)
    assert report.exit_code(doc) == 1
    assert doc["checks"][0]["message"].startswith("the interpreter died with SIGABRT")
    assert "Fatal Python error: Aborted" in doc["checks"][0]["message"]


def _with_cause(doc: dict) -> dict:
    from opforge.smoke.probe.causes import add_cause

    add_cause(doc, "orphan_kernels", "CPU kernels registered for namespace nz, which has no "
              "schemas (a TORCH_LIBRARY_IMPL(nz, ...) typo?); did you mean ns?",
              ["orphan kernels: nz::nms", "registered at ops.cpp:9", "ns defines nms",
               "a fourth line"], "TORCH_LIBRARY_IMPL(ns, ...) instead of TORCH_LIBRARY_IMPL(nz, ...)",
              explains=["census:nms:Meta", "run:nms:cpu"])
    return doc


def test_causes_come_first_in_five_lines_and_their_symptoms_are_not_repeated():
    doc = _with_cause(document(PASS, FAIL, WARN))
    assert doc["causes"][0]["explains"] == [FAIL["id"]]  # a passing check explains nothing
    console = Console(record=True, width=200)
    report.render_terminal(doc, console=console)
    lines = [line for line in console.export_text().splitlines() if line.strip()]
    start = next(i for i, line in enumerate(lines) if line.startswith("FAIL"))
    block = lines[start:start + 6]
    assert block[0].startswith("FAIL orphan kernels: CPU kernels registered for namespace nz")
    assert block[1:4] == ["  orphan kernels: nz::nms", "  registered at ops.cpp:9",
                          "  ns defines nms (+1 more in the JSON report)"]
    assert block[4].startswith("  fix: TORCH_LIBRARY_IMPL(ns, ...)")
    assert block[5].strip().startswith("explains 1 failed check (1 census; ops nms)")
    text = "\n".join(lines)
    assert "FAIL census:nms:Meta" not in text  # under its cause, not repeated
    assert "WARN torch-match" in text  # not explained: still listed
    assert report.exit_code(doc) == 1


def test_cause_is_one_junit_case_and_a_summary_block(tmp_path):
    doc = _with_cause(document(PASS))
    report.write_junit(doc, tmp_path / "j.xml")
    cases = {c.get("name"): c for c in ET.parse(tmp_path / "j.xml").getroot().iter("testcase")}
    failure = cases["cause:orphan_kernels"].find("failure").get("message")
    assert failure.startswith("CPU kernels registered for namespace nz") and "fix: " in failure
    summary = report.step_summary(doc)
    assert "**FAIL orphan kernels**: CPU kernels registered for namespace nz" in summary
    assert "- fix: TORCH_LIBRARY_IMPL(ns, ...)" in summary


def test_wheel_without_device_code_for_a_promised_arch_is_a_cause(tmp_path):
    import struct
    import subprocess

    from smoke_wheelkit import write_wheel

    from opforge.matrix import load_matrix
    from opforge.smoke.runner import device_code_cause

    def fatbin(arch: int) -> bytes:  # one cubin entry (the layout opforge.wheels reads)
        payload = b"\0" * 24
        entry = struct.pack("<HHIQII HH I", 2, 0x0101, 64, len(payload), len(payload), 0, 0, 0,
                            arch).ljust(64, b"\0") + payload
        return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(entry)) + entry

    # a real shared library (gcc) whose data holds an sm_80-only fat binary
    source = tmp_path / "dev.c"
    source.write_text("__attribute__((used)) const unsigned char fatbin[] = {"
                      + ", ".join(str(b) for b in fatbin(80)) + "};\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(tmp_path / "_C.so"), str(source)],
                   check=True)
    lib = (tmp_path / "_C.so").read_bytes()
    wheel = write_wheel(tmp_path / "gpuops-1.0+cu130-cp311-cp311-manylinux_2_28_x86_64.whl",
                        {"gpuops/_C.so": lib}, dist="gpuops", version="1.0+cu130")
    cu130 = load_matrix(Path(__file__).parents[1] / "matrix" / "fixtures" / "matrix.yaml") \
        .variant("cu130")
    doc = document(PASS)
    device_code_cause(doc, wheel, replace(cu130, options=(("arch_list", "8.0;9.0+PTX"),)))
    cause = doc["causes"][0]
    assert cause["class"] == "device_code" and cause["missing"] == ["sm_90", "compute_90"]
    assert "no kernel image is available" in cause["title"]
    assert "gpuops/_C.so: sm_80" in cause["evidence"]
    assert report.exit_code(doc) == 1
    fine = document(PASS)
    device_code_cause(fine, wheel, replace(cu130, options=(("arch_list", "8.0"),)))
    assert "causes" not in fine


def test_annotations_are_the_causes_and_the_unexplained_problems():
    doc = _with_cause(document(PASS, FAIL, WARN))
    lines = report.annotations(doc)
    assert len(lines) == 2
    assert lines[0].startswith("::error title=opforge smoke pkg%3A cause%3Aorphan_kernels::")
    assert lines[1].startswith("::warning title=opforge smoke pkg%3A torch-match::")
