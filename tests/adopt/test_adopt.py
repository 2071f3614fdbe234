"""opforge adopted by extensions that are not this repository's: init -> build -> inspect ->
smoke -> bisect --wheel, through the real CLI (a subprocess, as a user types it) and real pip.

The four projects (third_party.py) are written into temporary directories; each goes through
the whole path with the configuration `opforge init` wrote and the recipes it stubbed, filled
in as a maintainer would. The build environment (torch 2.13.0 and the build tools) is shared
and cached under build/adopt-tests; smoke still makes a fresh environment per wheel.
"""

from __future__ import annotations

import json
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml
from adopt_cli import build_env, opforge_cli
from adopt_cli import ok as _ok
from third_party import EXTENSIONS

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "bisect"))
from fake_nightlies import Bisector, build_fake_index, build_fake_repo  # noqa: E402

TIMINGS: dict[str, dict[str, float]] = {}
TORCH = "2.13.0"
WORKFLOWS_REF = "0" * 40  # a development opforge pins its workflows only when told the commit


@pytest.fixture(scope="session")
def build_python() -> str:
    """One build environment for the four projects (torch 2.13.0 + tools), kept between runs."""
    return build_env("adopt-tests")


@pytest.fixture(scope="session")
def nightlies(tmp_path_factory):
    repo = build_fake_repo(tmp_path_factory.mktemp("pytorch"))
    return build_fake_index(tmp_path_factory.mktemp("nightly-cpu"),
                            tmp_path_factory.mktemp("nightly-cpu-json"), repo)


EXPECTED = {  # what init must read from each project's sources
    "hostguess": {"namespace": "hostguess", "variants": ["cpu", "cu130"],
                  "ops": {"scale": "scale", "scale_into": "scale_into: {remove: [CUDA, Meta, "
                                                          "Autograd]}"}},
    "abi3ops": {"namespace": "abi3_ops", "variants": ["cpu"],
                "ops": {"softplus": "softplus", "softplus_backward":
                        "softplus_backward: {backward: true}"}},
    "cmakeops": {"namespace": "cmakeops", "variants": ["cpu"],
                 "ops": {"nonzero_per_row": "nonzero_per_row: {remove: [Autograd]}",
                         "twice": "twice"}},
    "pyops": {"namespace": "pyops", "variants": ["cpu"],
              "ops": {"smooth": "smooth", "clamp_": "clamp_",
                      "histc_cpu": "histc_cpu: {remove: [CUDA, MPS]}"}},
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(EXTENSIONS))
def test_third_party_extension_init_build_inspect_smoke_bisect(name, tmp_path, build_python,
                                                               nightlies):
    project, recipes = EXTENSIONS[name](tmp_path / name)
    before = {p: p.read_bytes() for p in project.rglob("*") if p.is_file()}
    seconds: dict[str, float] = {}
    TIMINGS[name] = seconds

    t0 = time.monotonic()
    # this opforge is a development checkout, not a release: the pin is given
    _ok(opforge_cli("init", "--torch", TORCH, "--workflows-ref", WORKFLOWS_REF, cwd=project), "init")
    seconds["init"] = round(time.monotonic() - t0, 1)
    matrix_text = (project / "matrix.yaml").read_text()
    matrix = yaml.safe_load(matrix_text)
    want = EXPECTED[name]
    assert matrix["extension"]["namespace"] == want["namespace"]
    assert [v["name"] for v in matrix["variants"]] == want["variants"]
    for line in want["ops"].values():
        assert f"    - {line}" in matrix_text, matrix_text
    stub = (project / "opforge_recipes.py").read_text()
    # a stub that runs for every forward op, from its schema
    assert "RECIPES = {" in stub and all(f'    "{op}": {{' in stub for op in want["ops"]
                                         if "backward" not in op)
    # init never touches the project's own files, and refuses to overwrite its own
    assert {p: p.read_bytes() for p in before} == before
    written = {p for p in project.rglob("*") if p.is_file()} - set(before)
    assert {p.name for p in written} == {"matrix.yaml", "opforge_recipes.py", "noxfile.py",
                                         "opforge-ci.yml", "opforge-nightly.yml",
                                         "opforge-bisect.yml"}
    # the callers it wrote pass the workflow checks in the project's repository
    _ok(opforge_cli("workflows", "check", cwd=project), "workflows check")
    again = opforge_cli("init", "--workflows-ref", WORKFLOWS_REF, cwd=project)
    assert again.returncode == 2 and "would overwrite" in again.stderr
    assert "Traceback" not in again.stderr
    # the maintainer fills in the recipes
    (project / "opforge_recipes.py").write_text(textwrap.dedent(recipes).lstrip())

    t0 = time.monotonic()
    work = ROOT / "build" / "adopt-tests" / name  # compiled objects kept between runs
    built = _ok(opforge_cli("build", "--variant", "cpu", "--python", build_python,
                            "--work-dir", str(work), cwd=project), "build")
    seconds["build"] = round(time.monotonic() - t0, 1)
    wheels = list((project / "dist" / "cpu").glob("*.whl"))
    assert len(wheels) == 1, built.stdout
    wheel = wheels[0]
    assert "+cpu-" in wheel.name
    # nothing compiled was left in the project's tree
    assert not [p for p in project.rglob("*.so") if "dist" not in p.parts]

    # built on this host, not in a manylinux image: its glibc floor is accepted for local use
    inspected = _ok(opforge_cli("inspect", str(wheel), "--expect-variant", "cpu", "--json",
                                "--allow-host-floor", cwd=project / "dist"), "inspect")
    report = json.loads(inspected.stdout)
    assert report["problems"] == [] and report["torch_requirement"] == f"torch=={TORCH}"
    record = report["build_info"]
    assert record["variant"] == "cpu" and record["torch_version"].startswith(TORCH)
    compiled = name != "pyops"
    assert record["backends"] == (["cpu"] if compiled else [])
    if name == "abi3ops":
        assert report["tags"] == ["cp39-abi3-manylinux_2_34_x86_64"] or \
            all("abi3" in t for t in report["tags"]), report["tags"]

    t0 = time.monotonic()
    reports = tmp_path / "smoke.json"
    smoke = opforge_cli("smoke", "--variant", "cpu", "--json", str(reports), cwd=project)
    seconds["smoke"] = round(time.monotonic() - t0, 1)
    assert smoke.returncode == 0, smoke.stdout[-4000:] + smoke.stderr[-3000:]
    doc = json.loads(reports.read_text())
    checks = {c["id"]: c for c in doc["checks"]}
    ran = [op for op in want["ops"] if "backward" not in op]
    for op in ran:
        assert checks[f"run:{op}:cpu"]["status"] == "pass", checks[f"run:{op}:cpu"]
    assert not [c for c in doc["checks"] if c.get("reason") == "no-recipe"]
    assert doc["runner"]["installs"][0].startswith(f"pip install torch=={TORCH}")
    if name == "hostguess":  # mutating, CPU only, no fake: skipped by the recipe, with why
        assert checks["fake:scale_into"]["status"] == "skip"
        assert checks["census:scale_into:CPU"]["status"] == "pass"
        assert "census:scale_into:Autograd" not in checks
        assert checks["run:scale:cpu:backward"]["status"] == "pass"
    if name == "abi3ops":  # the backward-only op is reached through softplus's backward
        assert checks["census:softplus_backward:CPU"]["status"] == "pass"
        assert checks["run:softplus:cpu:backward"]["status"] == "pass"
        assert "run:softplus_backward:cpu" not in checks
    if name == "cmakeops":
        assert "census:nonzero_per_row:Autograd" not in checks
        assert checks["census:twice:Autograd"]["status"] == "pass"
    if name == "pyops":
        assert checks["run:clamp_:cpu"]["status"] == "pass"
        assert checks["compile:clamp_"]["status"] == "pass"
        assert checks["run:smooth:cpu:backward"]["status"] == "pass"

    t0 = time.monotonic()
    bisector = Bisector(nightlies, tmp_path / "unused-probe.py", tmp_path / "bisect-cache",
                        tmp_path)
    package = {"hostguess": "hostguess", "abi3ops": "abi3_ops", "cmakeops": "cmakeops",
               "pyops": "pyops"}[name]
    # the wheel installed beside each fake nightly; its build record is read from the
    # installed metadata, and the nightly's regression is what makes a night bad
    check = ("import importlib.metadata as m, json, torch; "
             f"d = m.distribution({matrix['extension']['distribution']!r}); "
             "assert json.loads(d.read_text('opforge-build.json'))['variant'] == 'cpu'; "
             f"import importlib.util; assert importlib.util.find_spec({package!r}); "
             "torch.nms_check()")
    run = bisector("--good", "2024-06-01", "--bad", "2024-06-10", "--wheel", str(wheel),
                   "--match", "does not exist", "--json", command=["python", "-c", check],
                   timeout=900)
    seconds["bisect"] = round(time.monotonic() - t0, 1)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.json()["first_bad"]["date"] == "2024-06-07"
    print(f"\n{name}: {seconds}")
