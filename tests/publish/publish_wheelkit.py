"""Small real wheels and a loopback HTTP server for the publishing tests.

(A module of its own, not conftest.py, so the tests import it by a name no other test dir uses.)
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import html
import json
import os
import subprocess
import sys
import threading
import zipfile
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def make_wheel(folder: Path, dist: str, version: str, *, tag: str = "py3-none-any",
               requires: tuple[str, ...] = (), requires_python: str | None = None,
               record: dict | None = None, payload: str = "",
               extra: dict[str, bytes] | None = None, description: str = "") -> Path:
    """A valid wheel of a one-module package ``dist`` (its module says its version)."""
    folder.mkdir(parents=True, exist_ok=True)
    escaped = dist.replace("-", "_")
    info = f"{escaped}-{version}.dist-info"
    meta = ["Metadata-Version: 2.1", f"Name: {dist}", f"Version: {version}"]
    if requires_python:
        meta.append(f"Requires-Python: {requires_python}")
    meta += [f"Requires-Dist: {r}" for r in requires]
    if description:
        meta.append("Description-Content-Type: text/markdown")
    files = {
        f"{escaped}/__init__.py": f"VERSION = {version!r}\n{payload}".encode(),
        f"{info}/METADATA": ("\n".join(meta) + "\n\n" + description).encode(),
        f"{info}/WHEEL": (f"Wheel-Version: 1.0\nGenerator: opforge-tests\n"
                          f"Root-Is-Purelib: true\nTag: {tag}\n").encode(),
    }
    files.update(extra or {})
    if record is not None:
        files[f"{info}/opforge-build.json"] = json.dumps(record).encode()
    lines = [_record_line(n, d) for n, d in files.items()] + [f"{info}/RECORD,,"]
    files[f"{info}/RECORD"] = ("\n".join(lines) + "\n").encode()
    path = folder / f"{escaped}-{version}-{tag}.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zf.writestr(zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0)), data)
    return path


def fake_torch_index(root: Path, variant: str, versions: list[str]) -> Path:
    """``root/<variant>/torch/``: a PEP 503 index of tiny ``torch`` wheels, as torch's
    ``/whl/<variant>`` names them (``torch-2.14.1+cu130``)."""
    project = root / variant / "torch"
    links = []
    for version in versions:
        wheel = make_wheel(project, "torch", f"{version}+{variant}")
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        links.append(f'<a href="{wheel.name}#sha256={digest}">{html.escape(wheel.name)}</a><br>')
    (project / "index.html").write_text("<html><body>\n" + "\n".join(links) + "\n</body></html>\n")
    (root / variant / "index.html").write_text('<html><body><a href="torch/">torch</a></body></html>\n')
    return root / variant


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass


@contextlib.contextmanager
def serve(root: Path):
    """Serve ``root`` on 127.0.0.1 (a free port) from a thread; yields the base URL."""
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def isolated_env(tmp: Path) -> dict[str, str]:
    """pip and uv with no configuration of this machine's (indexes, find-links, constraints)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1",
               PIP_NO_CACHE_DIR="1", UV_CACHE_DIR=str(tmp / "uv-cache"), UV_NO_CONFIG="1",
               NO_PROXY="127.0.0.1", no_proxy="127.0.0.1")
    return env


def pip_resolve(tmp: Path, *args: str) -> dict[str, str]:
    """What ``pip install ARGS`` would install (name -> version), from pip's own report."""
    report = tmp / f"report-{len(list(tmp.glob('report-*')))}.json"
    run = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
                          "--quiet", "--report", str(report), *args],
                         capture_output=True, text=True, env=isolated_env(tmp), timeout=300)
    assert run.returncode == 0, run.stderr
    data = json.loads(report.read_text())
    return {item["metadata"]["name"]: item["metadata"]["version"] for item in data["install"]}


def uv_install(tmp: Path, target: Path, *args: str) -> dict[str, str]:
    """Install with ``uv pip install --target`` for real; name -> version of what landed."""
    import shutil

    uv = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
    run = subprocess.run([uv, "pip", "install", "--target", str(target), "--python",
                          sys.executable, "--no-progress", *args],
                         capture_output=True, text=True, env=isolated_env(tmp), timeout=300)
    assert run.returncode == 0, run.stderr
    found = {}
    for info in target.glob("*.dist-info"):
        name, version = info.name[:-len(".dist-info")].rsplit("-", 1)
        found[name] = version
    return found


def repo_copy(root: Path) -> Path:
    """This repository's CI inputs (matrix, noxfile, pyproject, workflows) copied to ``root``,
    src/ linked: a tree whose workflows a test may break."""
    import shutil

    source = Path(__file__).resolve().parents[2]
    root.mkdir(parents=True)
    for name in ("matrix.yaml", "noxfile.py", "pyproject.toml"):
        shutil.copy(source / name, root / name)
    shutil.copytree(source / ".github", root / ".github")
    (root / "src").symlink_to(source / "src")
    return root
