"""Each variant builds in its own toolchain world, whatever the build host holds.

A build that guesses from the host (runs ``nvcc``, reads ``CUDA_HOME``, asks
``torch.cuda.is_available()`` or ``torch.utils.cpp_extension.CUDA_HOME is not None``) gets the
answer of the variant, not of the machine:

- cpu (and mps): no CUDA variable (``CUDA_HOME``, ``CUDA_PATH``, ``CUDACXX``, ``FORCE_CUDA``...),
  no ``nvcc`` on PATH, ``CUDA_VISIBLE_DEVICES`` empty; in Python, ``torch.cuda.is_available()``
  is False and ``torch.utils.cpp_extension.CUDA_HOME`` is None (torch would otherwise find
  ``/usr/local/cuda`` by itself).
- cuXYZ: exactly the toolkit of the variant's CUDA version (``CUDA_HOME``, ``CUDA_PATH``,
  ``CUDAToolkit_ROOT``, ``CUDACXX``, its ``bin`` first on PATH, every other ``nvcc`` off it),
  ``FORCE_CUDA=1``; ``torch.cuda.is_available()`` is True (a build machine needs no GPU).
- mps: ``FORCE_MPS=1``; ``torch.backends.mps.is_available()`` is True (hosted macOS runners
  have no usable Metal device); cpu: False.

The Python answers come from ``toolchain_site.py``, put on the build's PYTHONPATH as
``sitecustomize`` (standard library only; it then runs the environment's own sitecustomize).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from opforge.errors import OpforgeError

# what points a build at a CUDA toolkit: none of them reaches a build without CUDA
CUDA_VARIABLES = ("CUDA_HOME", "CUDA_PATH", "CUDA_ROOT", "CUDA_BIN_PATH", "CUDACXX",
                  "CUDAToolkit_ROOT", "CUDA_TOOLKIT_ROOT_DIR", "CUDA_NVCC_EXECUTABLE",
                  "FORCE_CUDA")
# the programs of a toolkit that a PATH entry outside one must not lend a build without CUDA
CUDA_PROGRAMS = frozenset({"nvcc", "ptxas", "nvlink", "fatbinary", "cudafe++", "cuobjdump",
                           "nvdisasm", "nvprune", "cicc"})
SITE_DIR = "toolchain-site"
MODE_VARIABLE = "OPFORGE_BUILD_TOOLCHAIN"  # read by toolchain_site.py: cpu, cuda, mps, rocm, xpu


@dataclass(frozen=True)
class Toolkit:
    """An accelerator toolkit found on the build host (CUDA; ROCm and oneAPI alike)."""

    home: Path
    version: str | None
    found_by: str  # CUDA_HOME, CUDA_PATH, /usr/local/cuda-13.0, PATH ...
    compiler: str = "nvcc"  # what a build of its backend compiles device code with

    @property
    def bin(self) -> Path:
        return self.home / "bin"

    @property
    def nvcc(self) -> Path:
        return self.home / "bin" / "nvcc"


def nvcc_version(nvcc: Path) -> str | None:
    try:
        out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True,
                             timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"release (\d+\.\d+)", out)
    return match.group(1) if match else None


def find_toolkits(env, cuda: str | None = None) -> list[Toolkit]:
    """Every CUDA toolkit the host offers, in the order a build would look: CUDA_HOME,
    CUDA_PATH, /usr/local/cuda-<cuda>, /usr/local/cuda, nvcc on PATH (each once)."""
    candidates: list[tuple[Path, str]] = []
    for name in ("CUDA_HOME", "CUDA_PATH"):
        if env.get(name):
            candidates.append((Path(env[name]), name))
    if cuda:
        candidates.append((Path(f"/usr/local/cuda-{cuda}"), f"/usr/local/cuda-{cuda}"))
    candidates.append((Path("/usr/local/cuda"), "/usr/local/cuda"))
    for folder in env.get("PATH", os.defpath).split(os.pathsep):
        on_path = shutil.which("nvcc", path=folder) if folder else None
        if on_path:
            candidates.append((Path(on_path).resolve().parent.parent, "nvcc on PATH"))
    found, seen = [], set()
    for home, how in candidates:
        nvcc = home / "bin" / "nvcc"
        if not nvcc.exists() or nvcc.resolve() in seen:
            continue
        seen.add(nvcc.resolve())
        found.append(Toolkit(home, nvcc_version(nvcc), how))
    return found


def variant_toolkit(cuda: str, env) -> Toolkit | None:
    """The first toolkit whose nvcc is CUDA ``cuda`` (None when the host has none)."""
    return next((t for t in find_toolkits(env, cuda) if t.version == cuda), None)


def require_toolkit(cuda: str, env, session: str, where: str) -> Toolkit:
    """The variant's toolkit, or an error naming what the host has instead."""
    toolkits = find_toolkits(env, cuda)
    match = next((t for t in toolkits if t.version == cuda), None)
    if match is not None:
        return match
    if not toolkits:
        raise OpforgeError(f"{session} needs nvcc {cuda} (set CUDA_HOME or install "
                           f"/usr/local/cuda-{cuda}); {where}")
    found = "; ".join(f"{t.nvcc} is CUDA {t.version or 'of unknown version'} ({t.found_by})"
                      for t in toolkits)
    raise OpforgeError(f"{session} needs nvcc {cuda}, but {found}; set CUDA_HOME to a CUDA "
                       f"{cuda} toolkit")


def environment(kind: str, toolkit: Toolkit | None, site_dir: Path) -> tuple[dict[str, str],
                                                                             tuple[str, ...]]:
    """(variables the build gets, variables taken from it) for a ``kind`` (cpu / cuda / mps)
    build, as the cpu, cuda and mps backends set it up; PATH is done by ``build_path``."""
    given = {MODE_VARIABLE: kind, "PYTHONPATH": str(site_dir)}
    if kind == "cuda":
        if toolkit is None:
            return given, ()
        home = str(toolkit.home)
        given.update({"FORCE_CUDA": "1", "CUDA_HOME": home, "CUDA_PATH": home,
                      "CUDAToolkit_ROOT": home, "CUDACXX": str(toolkit.nvcc)})
        return given, tuple(v for v in CUDA_VARIABLES if v not in given)
    given["CUDA_VISIBLE_DEVICES"] = ""
    if kind == "mps":
        given["FORCE_MPS"] = "1"
    return given, CUDA_VARIABLES


def _toolkit_bin(folder: Path) -> bool:
    root = folder.parent
    return (root / "include" / "cuda_runtime.h").exists() or (root / "version.json").exists()


def build_path(path: str, toolkit: Toolkit | None, shadow_root: Path) -> str:
    """PATH for the build: the variant's toolkit's bin first (cuda, rocm, xpu), every other
    folder that holds nvcc left out (a toolkit's bin) or replaced by a copy of it without the
    CUDA programs (a shared folder such as /usr/bin), everything else as it was."""
    keep = toolkit.bin if toolkit else None
    entries = [str(keep)] if keep else []
    shutil.rmtree(shadow_root, ignore_errors=True)
    for i, entry in enumerate(path.split(os.pathsep)):
        folder = Path(entry)
        if not entry or (keep is not None and _same(folder, keep)):
            continue
        if not (folder / "nvcc").exists():
            entries.append(entry)
        elif not _toolkit_bin(folder):
            entries.append(str(_shadow(folder, shadow_root / f"path{i}")))
    return os.pathsep.join(entries)


def _same(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


def _shadow(folder: Path, shadow: Path) -> Path:
    shadow.mkdir(parents=True, exist_ok=True)
    for item in folder.iterdir():
        if item.name not in CUDA_PROGRAMS:
            (shadow / item.name).symlink_to(item)
    return shadow


def write_site(site_dir: Path) -> Path:
    """Put toolchain_site.py into ``site_dir`` as sitecustomize.py (rewritten every build)."""
    site_dir.mkdir(parents=True, exist_ok=True)
    source = Path(__file__).with_name("toolchain_site.py").read_text(encoding="utf-8")
    target = site_dir / "sitecustomize.py"
    staged = site_dir / ".sitecustomize.py.partial"
    staged.write_text(source, encoding="utf-8")
    os.replace(staged, target)
    return target
