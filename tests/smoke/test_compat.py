"""`opforge smoke --compat`: its arguments, the load-failure diagnosis, the combined report.

The end-to-end runs (a real stable wheel beside torch 2.13.0 and 2.14.1, and the planted
violation) are in tests/builds/test_stable_e2e.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from opforge import abi
from opforge.cli import main
from opforge.smoke import compat, report
from opforge.smoke.runner import ProbeRequest, Target

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def wheel(tmp_path) -> Path:
    path = tmp_path / "opforge_ops-0.1.0-cp310-abi3-linux_x86_64.whl"  # names no variant
    path.write_bytes(b"")
    return path


@pytest.mark.parametrize("extra, message", [
    (["--variant", "cpu"], "variant 'cpu' is abi: legacy; its wheel pins one torch"),
    (["--compat-torch", "2.13.0,two"],
     "'two' is not a torch release (2.13.0) nor one of floor, matrix, latest, nightly"),
    (["--compat-torch", "floor,2.14.1"], "'floor' is the floor or build torch of a stable variant"),
    (["--variant", "cpu", "--compat-torch", "matrix"],
     "floor and matrix name a stable variant's torches; 'cpu' is abi: legacy"),
    ([], "--compat needs --variant V (a stable-ABI variant: its compat_torch list)"),
    (["--variant", "cpu_stable", "--torch", "torch==2.13.0"],
     "--compat chooses each environment's torch: drop --torch"),
])
def test_bad_compat_arguments_exit_2_with_one_line(wheel, extra, message, capsys):
    argv = ["smoke", "--compat", "--wheel", str(wheel), "--file", str(ROOT / "matrix.yaml"),
            "--package", "opforge_ops", "--namespace", "opforge", *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("opforge smoke: error: ") and message in err[0]


@pytest.mark.parametrize("given, expected", [
    (None, ["2.10.0", "2.13.0", "2.14.1", "latest"]),  # the variant's own list
    ("matrix,2.14.1", ["2.13.0", "2.14.1"]),
    ("floor,matrix,2.13.0,nightly", ["2.10.0", "2.13.0", "nightly"]),  # repeats once
])
def test_compat_torch_words_resolve_through_the_variant(given, expected):
    import argparse

    from opforge.cli import smoke as smoke_cli
    from opforge.smoke.app import compat_torches

    parser = argparse.ArgumentParser()
    smoke_cli.register(parser.add_subparsers())
    argv = ["smoke", "--compat", "--file", str(ROOT / "matrix.yaml")]
    args = parser.parse_args(argv + (["--compat-torch", given] if given else []))
    assert compat_torches(smoke_cli.options_of(args), "cpu_stable") == expected


def _doc(error: str | None, torch: str = "2.12.0") -> dict:
    libraries = [{"path": "/env/site-packages/tiny/_C.so", "loaded": error is None,
                  **({"error": error} if error else {})}]
    status = "fail" if error else "pass"
    return {"package": "tiny", "namespace": "tiny", "environment": {"torch_version": torch},
            "import": {"libraries": libraries},
            "checks": [{"id": "import", "category": "import", "status": status,
                        "message": "import"}]}


@pytest.mark.skipif(not abi.available(), reason="needs torch-abi-audit (Python >= 3.11)")
@pytest.mark.parametrize("error", [
    "/env/tiny/_C.so: undefined symbol: torch_exception_get_what_without_backtrace",
    "dlopen(/env/tiny/_C.so, 0x0002): Symbol not found: _torch_exception_get_what_without_backtrace",
])
def test_missing_shim_function_is_named_with_the_first_torch_that_has_it(error):
    doc = _doc(error)
    compat.diagnose(doc)
    shim = next(c for c in doc["checks"] if c["id"].startswith("shim-"))
    assert shim["id"] == "shim-torch_exception_get_what_without_backtrace"
    assert shim["status"] == "fail"
    assert "first shipped in torch 2.13.0; torch 2.12.0 lacks it" in shim["message"]


def test_a_missing_symbol_that_is_no_shim_function_adds_nothing():
    doc = _doc("/env/tiny/_C.so: undefined symbol: _ZN3c104impl3cow11materializeERKNS_7DataPtrE")
    compat.diagnose(doc)
    assert [c["id"] for c in doc["checks"]] == ["import"]


def test_combined_report_prefixes_each_torch_and_fails_when_one_does():
    rows = [compat.Row("2.13.0", "2.13.0+cpu", _doc(None, "2.13.0+cpu")),
            compat.Row("2.12.0", "2.12.0", _doc("x: undefined symbol: y"))]
    doc = compat.combined(rows, "tiny.whl")
    assert [c["id"] for c in doc["checks"]] == ["torch-2.13.0+cpu/import", "torch-2.12.0/import"]
    assert [r["status"] for r in doc["compat"]] == ["pass", "fail"]
    assert report.exit_code(doc) == 1
    assert report.exit_code(compat.combined(rows[:1], "tiny.whl")) == 0


@pytest.mark.slow
def test_an_unreachable_nightly_is_a_skip_not_a_failure(tmp_path, wheel):
    """Where the nightly index is not reachable (an empty one here), the nightly row says so."""
    empty = tmp_path / "index"
    empty.mkdir()
    rows = compat.run_compat(Target(wheel=wheel), ProbeRequest(package="tiny", namespace="tiny"),
                             ["nightly"], log=lambda line: None, nightly_index=empty.as_uri())
    [row] = rows
    assert row.installed is None and row.status == "skip"
    [check] = row.doc["checks"]
    assert check["status"] == "skip" and "could not be installed from" in check["message"]
    assert empty.as_uri() in check["message"]
    # every torch skipped: nothing was tested, and that is never a pass
    doc = compat.combined(rows, wheel.name)
    assert report.exit_code(doc) == 1
    assert "every torch was skipped (nightly)" in doc["checks"][-1]["message"]
