"""Real wheels and environments for the smoke tests: doctor a wheel, write one, link a torch."""

from __future__ import annotations

import base64
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from opforge.venv import create_venv, install

REPO = Path(__file__).resolve().parents[2]


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def write_wheel(path: Path, files: dict[str, bytes], dist: str, version: str,
                requires: tuple[str, ...] = ()) -> Path:
    """A valid wheel (METADATA, WHEEL, RECORD) holding ``files``; pip installs it as usual."""
    info = f"{dist.replace('-', '_')}-{version}.dist-info"
    meta = "Metadata-Version: 2.1\nName: {}\nVersion: {}\n{}".format(
        dist, version, "".join(f"Requires-Dist: {r}\n" for r in requires)).encode()
    tag = path.name.rsplit("-", 3)[-3:]
    wheel_meta = (f"Wheel-Version: 1.0\nGenerator: opforge-tests\nRoot-Is-Purelib: false\n"
                  f"Tag: {'-'.join(tag)[:-4]}\n").encode()
    entries = dict(files)
    entries[f"{info}/METADATA"] = meta
    entries[f"{info}/WHEEL"] = wheel_meta
    record = [_record_line(n, d) for n, d in entries.items()] + [f"{info}/RECORD,,"]
    entries[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in entries.items():
            zf.writestr(name, data)
    return path


def doctor_wheel(src: Path, dst_dir: Path, drop) -> Path:
    """Copy a wheel without the members ``drop(name)`` selects, with a RECORD that agrees."""
    dst_dir.mkdir(parents=True, exist_ok=True)
    dst = dst_dir / src.name
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        record_name = next(n for n in zin.namelist() if n.endswith(".dist-info/RECORD"))
        kept = [n for n in zin.namelist() if not drop(n) and n != record_name]
        lines = []
        for name in kept:
            data = zin.read(name)
            zout.writestr(zin.getinfo(name), data)
            if not name.endswith("/"):
                lines.append(_record_line(name, data))
        lines.append(f"{record_name},,")
        zout.writestr(record_name, "\n".join(lines) + "\n")
    return dst


def site_packages(python: Path | str) -> list[str]:
    out = subprocess.run([str(python), "-c", "import sysconfig, json; p = sysconfig.get_paths(); "
                          "print(json.dumps(sorted({p['purelib'], p['platlib']})))"],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def torch_version(python: Path | str) -> str | None:
    out = subprocess.run([str(python), "-c", "import torch; print(torch.__version__)"],
                         capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else None


def linked_env(env_dir: Path, torch_python: Path, *wheels: Path) -> Path:
    """A fresh venv that sees another env's torch through a .pth file, with ``wheels``
    installed (--no-deps: torch is already there). Creating it takes about a second,
    where installing torch again would take 20 s (CPU) to 80 s (CUDA build)."""
    python = create_venv(env_dir)
    own = site_packages(python)[0]
    (Path(own) / "_opforge_tests_torch.pth").write_text(
        "\n".join(site_packages(torch_python)) + "\n", encoding="utf-8")
    if wheels:
        # --ignore-installed: the linked env may hold the same version (nox installs the good
        # wheel into the test env); ours must land in this env, which comes first on sys.path
        install(python, "--no-deps", "--ignore-installed", *map(str, wheels))
    return python


def gcc(*args: str) -> None:
    subprocess.run(["gcc", *args], check=True, capture_output=True, text=True)


def configured_pythons() -> list[str]:
    return [p for p in os.environ.get("OPFORGE_TEST_TORCH_PYTHONS", "").split(os.pathsep) if p]


def _candidate_pythons() -> list[str]:
    # under nox the test interpreter itself holds the torch the wheel was built with
    return [*configured_pythons(), sys.executable]


# the torchvision release built against each torch the tests install (both on local disk here)
TORCHVISION_FOR = {"2.14.1": "0.29.1"}


def _cached_torch_env(version: str, with_torchvision: bool = False) -> Path:
    """An environment holding torch==version, installed once and kept in the user cache."""
    from platformdirs import user_cache_dir

    from opforge.venv import venv_python

    root = Path(user_cache_dir("opforge")) / "smoke-tests"
    root.mkdir(parents=True, exist_ok=True)
    env_dir = root / f"torch-{version}"
    done = env_dir / ".complete"
    # two test sessions at once (a developer and CI) must not build the same env together
    with open(root / f"torch-{version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(env_dir, ignore_errors=True)
            python = create_venv(env_dir)
            install(python, f"torch=={version}")
            done.write_text(version, encoding="utf-8")
        tv_done = env_dir / ".torchvision"
        if with_torchvision and not tv_done.exists():
            install(venv_python(env_dir), f"torch=={version}",
                f"torchvision=={TORCHVISION_FOR[version]}")
            tv_done.write_text(TORCHVISION_FOR[version], encoding="utf-8")
    return venv_python(env_dir)


def torchvision_python() -> Path:
    """An interpreter with torchvision: a configured one, else the cached torch 2.14.1 env."""
    for candidate in configured_pythons():
        if subprocess.run([candidate, "-c", "import torchvision"],
                          capture_output=True).returncode == 0:
            return Path(candidate)
    return _cached_torch_env("2.14.1", with_torchvision=True)


def torch_python(version: str) -> Path:
    for candidate in _candidate_pythons():
        found = torch_version(candidate)
        if found and found.split("+")[0] == version:
            return Path(candidate)
    return _cached_torch_env(version)
