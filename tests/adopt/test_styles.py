"""Every extension style adopted unedited, with the real compiler: init -> build (cpu) ->
inspect -> smoke -> bench, then a planted missing backend that smoke must name.

The test extensions live in tests/adopt/styles/ (see test_styles_scan.py for what init reads
from each): regops (PyG style: RegisterOperators, a library per backend), pybops (mmcv style:
pybind11 modules, the CUDA import swallowed), ctops (bitsandbytes style: CMake through
scikit-build-core, ops defined from Python over a ctypes library that links no libtorch),
stabops (stable ABI only, abi3). The recipes are the stubs init wrote, unedited: a fresh
adoption calls every op once. One build environment is shared (build/adopt-styles/env) and
compiles go through the compiler cache; each smoke still makes a fresh environment.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from adopt_cli import ROOT, build_env, opforge_cli
from adopt_cli import ok as _ok

STYLES = Path(__file__).resolve().parent / "styles"
TORCH = "2.13.0"
TIMINGS: dict[str, dict[str, float]] = {}


@pytest.fixture(scope="module")
def build_python() -> str:
    """One build environment for the four styles (kept between runs under build/)."""
    return build_env("adopt-styles")


# what a planted missing backend does to each, and the words smoke must say
PLANTED = {
    # the cuda library promised in a cpu wheel: the same gap as a cu wheel built without it
    "regops": ("matrix", "regops._segment_cuda: {backend: cuda,",
               "regops._segment_cuda: {backend: cpu,",
               "module:regops._segment_cuda", "is not in the wheel"),
    # the CUDA module the package's try/except swallows
    "pybops": ("matrix", "pybops._ext_cuda: {backend: cuda,", "pybops._ext_cuda: {backend: cpu,",
               "module:pybops._ext_cuda", "No module named 'pybops._ext_cuda'"),
    # a wheel whose Python registers no CPU kernel for one op
    "ctops": ("installed", '@torch.library.register_kernel("ctops::clamp_", "cpu")',
              '@torch.library.register_kernel("ctops::clamp_", "cuda")',
              "census:clamp_:CPU", "clamp_ has no CPU kernel"),
    # a wheel whose Python registers no fake (Meta) kernel for the stable library's op
    "stabops": ("installed", '@torch.library.register_fake("stabops::row_sum")',
                "# planted: row_sum's fake kernel is not registered",
                "census:row_sum:Meta", "row_sum has no Meta (fake) kernel"),
}
# bench times dispatcher ops; pybops has none (its functions are called by smoke only)
BENCH_OP = {"regops": "segment_sum", "ctops": "saxpy", "stabops": "axpby"}
INSTALLED = {"ctops": "ctops/_ops.py", "stabops": "stabops/__init__.py"}


# Each style's whole path takes minutes on a 2-core machine (measured here, compiler cache
# cold / warm): regops 166 s, pybops 376 / 330 s, stabops 142 s (these three compile against
# torch's C++ headers), ctops 107 s (a C library). The suite (.ci/run) runs ctops; the other
# three carry the `styles` marker, which the default pytest options deselect, and run in
# `nox -s styles` (every style), as the realtorch tests run in `nox -s realtorch`.
IN_SUITE = ("ctops",)


def _style(style: str):
    return style if style in IN_SUITE else pytest.param(style, marks=pytest.mark.styles)


@pytest.mark.slow
@pytest.mark.parametrize("style", [_style(s) for s in PLANTED])
def test_style_adopted_unedited(style, tmp_path, build_python):
    project = tmp_path / style
    shutil.copytree(STYLES / style, project)
    seconds: dict[str, float] = {}
    TIMINGS[style] = seconds

    t0 = time.monotonic()
    # a development checkout of opforge is not a release: the workflows' pin is given
    init = _ok(opforge_cli("init", "--torch", TORCH, "--workflows-ref", "0" * 40, cwd=project),
               "init")
    seconds["init"] = round(time.monotonic() - t0, 1)
    assert "by hand" not in init.stderr, init.stderr

    t0 = time.monotonic()
    work = ROOT / "build" / "adopt-styles" / style  # compiled objects kept between runs
    built = _ok(opforge_cli("build", "--variant", "cpu", "--python", build_python,
                            "--work-dir", str(work), cwd=project), "build")
    seconds["build"] = round(time.monotonic() - t0, 1)
    wheels = list((project / "dist" / "cpu").glob("*.whl"))
    assert len(wheels) == 1, built.stdout + built.stderr
    wheel = wheels[0]

    t0 = time.monotonic()
    # built on this host, not in a manylinux image: the floor check is not this test's subject
    inspected = _ok(opforge_cli("inspect", str(wheel), "--expect-variant", "cpu", "--json",
                                "--allow-host-floor",
                                cwd=project / "dist"), "inspect")
    seconds["inspect"] = round(time.monotonic() - t0, 1)
    report = json.loads(inspected.stdout)
    assert report["problems"] == [], report["problems"]
    assert report["build_info"]["variant"] == "cpu"
    if style == "stabops":
        assert all("abi3" in tag for tag in report["tags"]), report["tags"]
        assert report["torch_requirement"].startswith("torch>=2.10")
    else:
        assert report["torch_requirement"] == f"torch=={TORCH}"

    t0 = time.monotonic()
    env_dir = tmp_path / "env"
    out = tmp_path / "smoke.json"
    smoke = opforge_cli("smoke", "--variant", "cpu", "--json", str(out), "--env-dir",
                        str(env_dir), "--keep-env", cwd=project)
    seconds["smoke"] = round(time.monotonic() - t0, 1)
    assert smoke.returncode == 0, smoke.stdout[-4000:] + smoke.stderr[-3000:]
    doc = json.loads(out.read_text())
    checks = {c["id"]: c for c in doc["checks"]}
    # the stubs init wrote ran every op (or module function) once, and say they are stubs
    stubs = [c for c in doc["checks"] if c["id"].startswith("stub:")]
    assert stubs and all(c["status"] == "warn" for c in stubs)
    ran = [c for c in doc["checks"] if c["id"].startswith(("run:", "call:"))
           and c["id"].endswith(":cpu")]
    assert ran and all(c["status"] == "pass" for c in ran), ran
    if style == "regops":
        assert checks["module:regops._segment_cpu"]["status"] == "pass"
        assert "module:regops._segment_cuda" not in checks  # the cpu variant does not promise it
        assert {"run:segment_sum:cpu", "run:gather_rows:cpu", "run:cuda_version:cpu"} <= set(checks)
    if style == "pybops":
        assert checks["module:pybops._ext_cpu"]["status"] == "pass"
        assert checks["call:pybops._ext_cpu.pairwise_iou:cpu"]["status"] == "pass"
        assert checks["call:pybops._ext_cuda.pairwise_iou:cuda"]["status"] == "skip"
    if style in ("ctops", "stabops"):
        assert checks["fake:" + ("saxpy" if style == "ctops" else "axpby")]["status"] == "pass"

    python = env_dir / "bin" / "python"
    if style in BENCH_OP:  # the maintainer gives one op a workload, as docs/adopt.md says
        op = BENCH_OP[style]
        with (project / "opforge_recipes.py").open("a") as fh:
            fh.write(f'RECIPES["{op}"]["workloads"] = {{"small": {{"inputs": '
                     f'RECIPES["{op}"]["inputs"]}}}}\n')
        t0 = time.monotonic()
        bench_json = tmp_path / "bench.json"
        bench = opforge_cli("bench", "--python", str(python), "--variant", "cpu", "--budget",
                            "2", "--json", str(bench_json), cwd=project)
        seconds["bench"] = round(time.monotonic() - t0, 1)
        assert bench.returncode == 0, bench.stdout[-3000:] + bench.stderr[-3000:]
        rows = json.loads(bench_json.read_text())["rows"]
        assert [(r["op"], r["device"]) for r in rows if r.get("status") == "pass"][:1] == \
            [(op, "cpu")], rows

    # the planted missing backend, in the environment smoke kept
    where, before, after, check_id, words = PLANTED[style]
    if where == "matrix":
        target = project / "matrix.yaml"
    else:
        target = next(env_dir.glob(f"lib/python*/site-packages/{INSTALLED[style]}"))
    text = target.read_text()
    assert before in text, text
    target.write_text(text.replace(before, after))
    t0 = time.monotonic()
    planted_json = tmp_path / "planted.json"
    planted = opforge_cli("smoke", "--python", str(python), "--variant", "cpu", "--json",
                          str(planted_json), cwd=project)
    seconds["planted"] = round(time.monotonic() - t0, 1)
    assert planted.returncode == 1, planted.stdout[-3000:] + planted.stderr[-3000:]
    caught = {c["id"]: c for c in json.loads(planted_json.read_text())["checks"]}
    assert caught[check_id]["status"] == "fail", caught.get(check_id)
    assert words in caught[check_id]["message"], caught[check_id]["message"]
    assert "Traceback" not in planted.stderr
    print(f"\n{style}: {seconds}")
