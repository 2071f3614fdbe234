"""The trust corpus: real op-extension packages from the registry, pinned by version and sdist
sha256, fetched the way CI would (``pip download --no-deps --no-binary :all:``), and the
breaks planted in a copy of each adopted tree.

None of these packages was written for opforge; their sdists are used unedited. An sdist is
taken from ``$OPFORGE_TRUST_CACHE`` (a directory of sdists filled beforehand, only read), else
from build/trust/sdist under this checkout, else downloaded there; a file whose sha256 is not
the pinned one is never used.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TORCH = "2.13.0"


@dataclass(frozen=True)
class Break:
    """A fault planted in a copy of the adopted sources: ``before`` replaced by ``after`` in
    ``path``; smoke must then exit 1 with a FAIL check that says ``names``."""
    kind: str  # what a maintainer would call it
    path: str
    before: str
    after: str
    names: str


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    sha256: str
    style: str
    breaks: tuple[Break, ...] = ()
    # init refuses it for this documented reason (the words init must say), instead of adopting
    refused: str | None = None
    # its sdist does not compile here as shipped (a fault of the package, not of opforge): the
    # build must exit 1 and its log match this pattern
    build_fails: str | None = None

    @property
    def spec(self) -> str:
        return f"{self.name}=={self.version}"


CORPUS = [
    Package("torchlpc", "0.7.2",
            "260a765645cdf0112d3fcfcebc41d11855ac52264b3185f24068ad873b1b0be3",
            "dispatcher ops: TORCH_LIBRARY + TORCH_LIBRARY_IMPL(CPU/CUDA)",
            breaks=(
                Break("kernel not registered", "torchlpc/csrc/scan_cpu.cpp",
                      '    m.impl("lpc", &lpc_cpu);\n', "", names="lpc"),
                Break("namespace typo", "torchlpc/csrc/scan_cpu.cpp",
                      "TORCH_LIBRARY_IMPL(torchlpc, CPU, m)",
                      "TORCH_LIBRARY_IMPL(torchlcp, CPU, m)", names="torchlcp"),
            )),
    Package("torch-spline-conv", "1.2.2",
            "ed45a81da29f774665dbdd4709d7e534cdf16d2e7006dbd06957f35bd09661b2",
            "torch::RegisterOperators, one library per source and backend (PyG)",
            breaks=(
                Break("kernel not registered (.op line deleted)", "csrc/weighting.cpp",
                      'static auto registry = torch::RegisterOperators().op(\n'
                      '    "torch_spline_conv::spline_weighting", &spline_weighting);\n',
                      "", names="spline_weighting"),
            )),
    Package("torch-scatter", "2.1.2",
            "69b3aa435f2424ac6a1bfb6ff702da6eb73b33ca0db38fb26989c74159258e47",
            "torch::RegisterOperators, one library per source and backend (PyG)"),
    Package("torch-discounted-cumsum", "1.1.0",
            "34e6a7e10f416a7aa84e5fb4e00d6a84a0cfbb0a68bcf22a3434488360f0ea37",
            "pybind11 modules per backend, JIT-compile fallback on ImportError",
            breaks=(
                Break("module not built (Extension dropped)", "setup.py",
                      "    out = [\n        CppExtension(\n            'torch_discounted_cumsum_cpu',"
                      "\n            [\n                os.path.join('torch_discounted_cumsum', "
                      "'discounted_cumsum_cpu.cpp'),\n            ],\n        )\n    ]\n",
                      "    out = []\n", names="torch_discounted_cumsum_cpu"),
            )),
    Package("dbscan-torch", "0.2.0",
            "ae596989050fafa415c2a7d2199a75e0baae2d401cb71da6cd1b042f82a1b653",
            "pybind11 module (one, CPU + CUDA dispatch inside)",
            breaks=(
                Break("function not exported (m.def deleted)", "csrc/extension.cpp",
                      '  m.def("dbscan2d_profile", &dbscan2d_profile, pybind11::arg("X"),\n'
                      '        pybind11::arg("eps"), pybind11::arg("min_samples"),\n'
                      '        "Profile variant: returns (labels, {stage_name: ms}). CUDA times '
                      'are "\n        "GPU-only; CPU times are wallclock per stage. Used by '
                      '--profile.");\n', "", names="dbscan2d_profile"),
            )),
    # 2021 sources: cpu/src/neighbors.cpp uses std::unique_ptr without <memory>, which GCC 12's
    # headers no longer bring in
    Package("torch-points-kernels", "0.7.0",
            "a93d6c69fe2035e81c066b6ca6d2264cecdb368677152a231a69f686f00f6571",
            "pybind11 modules per backend, sources globbed in setup.py, no ninja",
            build_fails=r"error: .unique_ptr. is not a member of .std."),
    # TORCH_LIBRARY in a py_limited_api (abi3) wheel; the sdist lacks the headers its sources
    # include (bessel_k.h, iterator.h)
    Package("torch-bessel", "0.0.10",
            "69952de368b8d11c0ef6fa3c452f24e55b000834431c225093cd039340a471c6",
            "dispatcher ops (TORCH_LIBRARY) in a py_limited_api abi3 wheel, fakes in Python",
            build_fails=r"fatal error: bessel_k\.h: No such file or directory"),
    Package("torch-linear-assignment", "0.1.0",
            "317566b2781a31a1253141a94d9a7cb8ece05be131741f582634ebbd791435d4",
            "pybind11 module built only on the package's own opt-in (CUDA-only); Triton otherwise",
            refused="setup.py:29: torch_linear_assignment._backend is built only when "
                    "TLA_BUILD_LEGACY_CUDA is set; a default build compiles nothing to check"),
]


DOWNLOADS = ROOT / "build" / "trust" / "sdist"


def cache_dirs() -> list[Path]:
    seed = os.environ.get("OPFORGE_TRUST_CACHE")
    return ([Path(seed)] if seed else []) + [DOWNLOADS]


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _cached(package: Package, where: Path) -> Path | None:
    stem = f"{package.name}-{package.version}".lower().replace("-", "_")
    for path in sorted(where.glob("*.tar.gz")):
        if path.name.lower().replace("-", "_") == f"{stem}.tar.gz" and \
                sha256(path) == package.sha256:
            return path
    return None


def download_python() -> str:
    """An interpreter that can run the sdists' metadata hooks: their setup.py files import
    torch, so pip download runs without build isolation in an environment with the corpus's
    torch and setuptools (build/trust/download-env, made once and kept)."""
    env_dir = ROOT / "build" / "trust" / "download-env"
    python = env_dir / "bin" / "python"
    if not (env_dir / ".ready").exists():
        subprocess.run([sys.executable, "-m", "virtualenv", "-q", str(env_dir)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        f"torch=={TORCH}", "setuptools", "wheel", "numpy"], check=True)
        (env_dir / ".ready").write_text("")
    return str(python)


def fetch(package: Package) -> Path:
    """The package's sdist, from the cache or the registry; its sha256 checked either way."""
    for cached in cache_dirs():
        found = _cached(package, cached)
        if found:
            return found
    where = DOWNLOADS
    where.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=where) as tmp:
        result = subprocess.run(
            [download_python(), "-m", "pip", "download", "--disable-pip-version-check", "-q",
             "--no-deps", "--no-binary", ":all:", "--no-build-isolation", "-d", tmp,
             package.spec], capture_output=True, text=True, timeout=900)
        assert result.returncode == 0, f"pip download {package.spec}: {result.stderr[-3000:]}"
        got = sorted(Path(tmp).glob("*.tar.gz"))
        assert len(got) == 1, f"pip download {package.spec} left {got}"
        digest = sha256(got[0])
        assert digest == package.sha256, \
            f"{got[0].name}: sha256 {digest}, pinned {package.sha256}: the registry's file changed"
        target = where / got[0].name
        shutil.move(str(got[0]), target)
    return target


def extract(sdist: Path, into: Path) -> Path:
    """The sdist's one top directory, extracted under ``into``."""
    with tarfile.open(sdist) as tar:
        tar.extractall(into, filter="data")
    tops = [p for p in into.iterdir() if p.is_dir()]
    assert len(tops) == 1, tops
    return tops[0]


def plant(tree: Path, planted: Break) -> None:
    path = tree / planted.path
    text = path.read_text()
    assert text.count(planted.before) == 1, f"{planted.path}: the text to break is not there once"
    path.write_text(text.replace(planted.before, planted.after))


def opforge_cli(*args: str, cwd: Path, timeout: float = 2400):
    """``python -m opforge ARGS`` as a user types it, with this checkout's opforge and PyPI's
    torch."""
    import opforge

    src = str(Path(opforge.__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": src, "OPFORGE_TORCH_INDEX": "pypi",
           "MAX_JOBS": os.environ.get("MAX_JOBS", "2")}
    env.pop("OPFORGE_MATRIX", None)
    env.pop("GITHUB_STEP_SUMMARY", None)
    return subprocess.run([sys.executable, "-m", "opforge", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


# package name -> what its tests saw (filled in by test_trust.py, printed by conftest.py)
REPORT: dict[str, dict] = {}


def render_table(report: dict[str, dict]) -> str:
    rows = ["| package | style | ops / functions | cpu runs green (stub) | derived working "
            "calls (cpu runs green after) | smoke PASS / WARN / FAIL / SKIP | false FAILs | "
            "planted breaks named | wall s (init+build+smoke; breaks) |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, r in report.items():
        counts = r.get("counts") or {}
        breaks = r.get("breaks") or {}
        named = ", ".join(f"{k}: {'named' if v.get('named') else 'NOT named'}"
                          for k, v in breaks.items()) or "-"
        rows.append(
            f"| {name} {r.get('version', '')} | {r.get('style', '')} | {r.get('ops', '-')} | "
            f"{r.get('runs_green', '-')} | {r.get('derived', '-')} | "
            + (" / ".join(str(counts.get(s, 0)) for s in ("pass", "warn", "fail", "skip"))
               if counts else r.get("outcome", "-"))
            + f" | {counts.get('fail', 0) if counts else '-'} | {named} | "
            f"{r.get('wall_s', '-')}; {r.get('breaks_wall_s', '-')} |")
    return "\n".join(rows)
