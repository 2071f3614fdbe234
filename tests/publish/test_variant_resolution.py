"""Proof over loopback: from one index URL, variantlib's resolution picks the cu130 wheel on a
host whose provider says "CUDA 13.0 driver" and the CPU (null) wheel where it says "no GPU".

The providers are real plugins found by variantlib's own mechanism: the variants JSON names a
provider's requirement (``nvidia-variant-provider>=0.0.1,<1.0.0``) and its ``plugin-api``; an
installer installs the requirement into the host's environment and variantlib runs the
plugin-api in that interpreter. Here each host is a fresh environment into which uv installs,
from a loopback index, a test distribution of that name whose plugin describes the host (the
real ``nvidia-variant-provider`` on the registry is a 0.0.0a0 placeholder, outside the range).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from publish_wheelkit import isolated_env, make_wheel, serve
from variants_kit import CPU, CU126, CU130, NAME, variant_wheels, write_matrix

from opforge.cli import main

pytest.importorskip("variantlib", reason="wheel variants need variantlib (opforge[variants])")

CUDA_RELEASES = ["13.0", "12.9", "12.8", "12.6", "12.4", "12.1", "11.8"]

PLUGIN = '''
from dataclasses import dataclass, field

DRIVER = {driver!r}          # the CUDA version the driver supports, None: no GPU
SM = {sm!r}                  # the GPU's compute capability


@dataclass(frozen=True)
class Feature:
    name: str
    values: list = field(default_factory=list)
    multi_value: bool = False


def _version(text):
    return tuple(int(p) for p in text.split("."))


class NvidiaVariantPlugin:
    @classmethod
    def get_all_configs(cls):
        return [Feature("cuda_version_lower_bound", {releases!r}),
                Feature("sm_arch", ["120_real", "120_virtual", "90_real", "90_virtual",
                                    "80_real", "80_virtual"], multi_value=True)]

    @classmethod
    def get_supported_configs(cls):
        if DRIVER is None:
            return []
        runs = [v for v in {releases!r} if _version(v) <= _version(DRIVER)]
        archs = [f"{{SM}}_real"] + [f"{{a}}_virtual" for a in ("120", "90", "80")
                                    if int(a) <= int(SM)]
        return [Feature("cuda_version_lower_bound", runs),
                Feature("sm_arch", archs, multi_value=True)]
'''


def _provider_index(root: Path, host: str, driver: str | None, sm: str) -> Path:
    """``root/providers/<host>/``: a PEP 503 index holding this host's provider."""
    folder = root / "providers" / host / "nvidia-variant-provider"
    code = textwrap.dedent(PLUGIN.format(driver=driver, sm=sm, releases=CUDA_RELEASES))
    wheel = make_wheel(folder, "nvidia-variant-provider", "0.0.1",
                       extra={"nvidia_variant_provider/plugin.py": code.encode()})
    (folder / "index.html").write_text(f'<a href="{wheel.name}">{wheel.name}</a>\n')
    return root / "providers" / host


def _host(tmp: Path, base: str, host: str, requirement: str) -> Path:
    """A fresh environment with the host's provider installed as an installer would install
    the variants JSON's requirement; returns its interpreter."""
    uv = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
    env_dir = tmp / "hosts" / host
    env = isolated_env(tmp)
    for argv in ([uv, "venv", "--quiet", "--python", sys.executable, str(env_dir)],
                 [uv, "pip", "install", "--quiet", "--python", str(env_dir / "bin" / "python"),
                  "--index-url", f"{base}/providers/{host}/", requirement]):
        run = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
        assert run.returncode == 0, run.stderr
    return env_dir / "bin" / "python"


HOSTS = {"cuda13": ("13.0", "90"), "cuda12_8": ("12.8", "90"), "nogpu": (None, "0")}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """One site with a matrix of cpu + cu130 (``both``) and one of cu130 alone (``gpu-only``),
    and three hosts' provider indexes, on loopback."""
    root = tmp_path_factory.mktemp("resolution")
    both = root / "both"
    matrix = write_matrix(both / "repo", CPU, CU130)
    for variant in ("cpu", "cu130"):
        variant_wheels(both, matrix, variant)
    assert main(["index", str(both / "dist"), "--out", str(root / "site")]) == 0
    alone = root / "alone"
    variant_wheels(alone, write_matrix(alone / "repo", CU130), "cu130")
    assert main(["index", str(alone / "dist"), "--out", str(root / "gpu-only")]) == 0
    three = root / "three"
    matrix = write_matrix(three / "repo", CPU, CU126, CU130)
    for variant in ("cpu", "cu126", "cu130"):
        variant_wheels(three, matrix, variant)
    assert main(["index", str(three / "dist"), "--out", str(root / "three-site")]) == 0
    for host, (driver, sm) in HOSTS.items():
        _provider_index(root, host, driver, sm)
    requirement = json.loads((root / "site" / "wheel-variants" / NAME /
                              f"{NAME}-1.0-variants.json").read_text())
    [requirement] = requirement["providers"]["nvidia"]["requires"]
    with serve(root) as base:
        hosts = {h: _host(root, base, h, requirement) for h in HOSTS}
        yield base, hosts


def _resolve(capsys, base: str, site: str, python: Path) -> tuple[int, str, str]:
    code = main(["index", "--resolve", f"{NAME}==1.0", "--index-url",
                 f"{base}/{site}/wheel-variants/", "--host-python", str(python)])
    out, err = capsys.readouterr()
    return code, out.strip().splitlines()[-1] if out.strip() else "", err.strip()


@pytest.mark.parametrize("host, wheel", [
    ("cuda13", f"{NAME}-1.0-py3-none-any-cu130.whl"),
    ("nogpu", f"{NAME}-1.0-py3-none-any-null.whl"),
    ("cuda12_8", f"{NAME}-1.0-py3-none-any-null.whl"),   # older than every CUDA variant
])
def test_one_url_gives_each_host_its_build(served, capsys, host, wheel):
    base, hosts = served
    code, picked, err = _resolve(capsys, base, "site", hosts[host])
    assert (code, picked) == (0, wheel), err


def test_with_several_cuda_variants_an_older_driver_gets_the_newest_it_runs(served, capsys):
    base, hosts = served
    assert _resolve(capsys, base, "three-site", hosts["cuda12_8"])[:2] == \
        (0, f"{NAME}-1.0-py3-none-any-cu126.whl")
    assert _resolve(capsys, base, "three-site", hosts["cuda13"])[:2] == \
        (0, f"{NAME}-1.0-py3-none-any-cu130.whl")


def test_no_cpu_build_is_a_clear_refusal(served, capsys):
    base, hosts = served
    assert _resolve(capsys, base, "gpu-only", hosts["cuda13"])[:2] == \
        (0, f"{NAME}-1.0-py3-none-any-cu130.whl")
    code, _picked, err = _resolve(capsys, base, "gpu-only", hosts["nogpu"])
    assert code == 1 and len(err.splitlines()) == 1
    assert "no wheel of boxops 1.0 fits this host" in err
    assert "cu130: nvidia :: cuda_version_lower_bound :: 13.0" in err
    assert "no null variant (a CPU build)" in err


def test_the_resolution_says_the_proposals_are_drafts_once(served, capsys):
    base, hosts = served
    main(["index", "--resolve", f"{NAME}==1.0", "--index-url", f"{base}/site/wheel-variants/",
          "--host-python", str(hosts["nogpu"])])
    out = capsys.readouterr().out
    assert sum("drafts" in line for line in out.splitlines()) == 1


def test_a_host_without_the_provider_is_one_line_exit_1(served, capsys):
    base, _hosts = served
    code, _picked, err = _resolve(capsys, base, "site", Path(sys.executable))
    assert code == 1 and len(err.splitlines()) == 1 and "Traceback" not in err
    assert "the provider plugins boxops-1.0-variants.json names failed on this host" in err
    assert "nvidia_variant_provider" in err


@pytest.mark.parametrize("argv, message", [
    (["--resolve", "boxops"], "give NAME==VERSION"),
    (["--resolve", "boxops>=1.0", "--index-url", "http://127.0.0.1:9/"], "give NAME==VERSION"),
    (["--resolve", "boxops==1.0"], "--resolve needs --index-url"),
    (["--resolve", "boxops==1.0", "--index-url", "http://127.0.0.1:9/", "--host-python",
      "/nonexistent/python"], "no such interpreter"),
    (["--index-url", "http://127.0.0.1:9/", "--out", "site"], "go with --resolve"),
    ([], "--out SITE is required"),
])
def test_bad_resolve_arguments_are_one_line_exit_2(tmp_path, capsys, argv, message):
    assert main(["index", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err
