"""Reading nightly indexes: PEP 503 HTML, PEP 691 JSON, file://, a directory, and http."""

from __future__ import annotations

import hashlib
import http.server
import threading
import urllib.parse
from datetime import date
from pathlib import Path

import pytest
from fake_nightlies import HERE_PLATFORM, OTHER_PLATFORMS, PY, UNLISTED

from opforge.bisect import index as ix
from opforge.errors import OpforgeError, UsageError

PYVER = f"{PY[2]}.{PY[3:]}"
HERE = [HERE_PLATFORM]
OTHER = [OTHER_PLATFORMS[0]]


def test_linux_nightlies_one_per_date_last_build_wins(fake_index):
    listed = ix.load_index(str(fake_index.root), PYVER, HERE)
    days = [n.day for n in listed.nightlies]
    assert "2024-06-06" not in days  # macOS wheels only
    assert "2024-06-09" not in days  # another Python only
    assert days[0] == "2024-05-20" and days[-1] == "2024-06-11" and len(days) == 17
    cut = listed.by_date(date(2024, 6, 1))
    assert cut.version == "2.5.0.dev20240601+cpu"  # the branch cut's second build
    rebuilt = listed.by_date(date(2024, 6, 3))
    assert rebuilt.filename == f"torch-2.5.0.dev20240603+cpu-1-{PY}-{PY}-{HERE_PLATFORM}.whl"
    assert all(n.filename.endswith(f"-{PY}-{PY}-{HERE_PLATFORM}.whl") for n in listed.nightlies)


def test_other_platform_wheels_are_chosen_only_for_that_platform(fake_index):
    listed = ix.load_index(fake_index.url, PYVER, OTHER)
    june6 = listed.by_date(date(2024, 6, 6))
    assert june6 is not None and june6.version == "2.5.0.dev20240606"
    assert june6.url.startswith("file://") and june6.filename.endswith(f"{OTHER_PLATFORMS[0]}.whl")


def test_pep691_json_gives_the_same_nightlies_with_hashes(fake_index):
    html = ix.load_index(str(fake_index.root), PYVER, HERE)
    js = ix.load_index(fake_index.json_root.as_uri(), PYVER, HERE)
    assert [n.filename for n in js.nightlies] == [n.filename for n in html.nightlies]
    assert all(n.sha256 and len(n.sha256) == 64 for n in js.nightlies)
    assert all(n.sha256 is None for n in html.nightlies)  # like download.pytorch.org's nightlies


def test_flat_directory_of_wheels_is_an_index(tmp_path, fake_index):
    for wheel in list(fake_index.root.glob(f"torch-2.5.0.dev2024061*+cpu-{PY}-*linux*.whl")):
        (tmp_path / wheel.name).write_bytes(wheel.read_bytes())
    listed = ix.load_index(str(tmp_path), PYVER, HERE)
    assert [n.day for n in listed.nightlies] == ["2024-06-10", "2024-06-11"]


def test_sha256_fragment_and_base_href_are_honoured(tmp_path):
    page = tmp_path / "torch" / "index.html"
    page.parent.mkdir()
    page.write_text('<html><head><base href="../wheels/"></head><body>'
                    f'<a href="torch-2.6.0.dev20241001%2Bcpu-{PY}-{PY}-{HERE_PLATFORM}.whl#sha256=ABCD">x</a>'
                    f'<a href="torch-2.6.0-{PY}-{PY}-{HERE_PLATFORM}.whl">stable: not a nightly</a>'
                    '<a href="torchvision-0.20.0.dev20241001-py3-none-any.whl">other project</a>'
                    '</body></html>')
    listed = ix.load_index(str(tmp_path), PYVER, HERE)
    (nightly,) = listed.nightlies
    assert nightly.url == (tmp_path / "wheels").as_uri() + \
        f"/torch-2.6.0.dev20241001%2Bcpu-{PY}-{PY}-{HERE_PLATFORM}.whl"
    assert nightly.sha256 == "abcd"


@pytest.mark.parametrize("text, day", [
    ("2.5.0.dev20240610+cpu", date(2024, 6, 10)), ("2.5.0.dev20240610", date(2024, 6, 10)),
    ("2.5.0", None), ("2.5.0rc1", None), ("2.5.0.dev20241340", None), ("2.5.0.dev1", None)])
def test_nightly_date_from_the_version(text, day):
    assert ix.nightly_date(ix.Version(text)) == day


def test_direct_url_guesses_try_the_oldest_listed_minor_and_older(fake_index):
    listed = ix.load_index(str(fake_index.root), PYVER, HERE)
    guesses = ix.direct_url_guesses(listed, date(2024, 3, 2))
    assert [g.version for g in guesses] == ["2.4.0.dev20240302+cpu", "2.3.0.dev20240302+cpu",
                                            "2.2.0.dev20240302+cpu", "2.1.0.dev20240302+cpu"]
    assert guesses[0].url == (fake_index.root.as_uri() + "/" + urllib.parse.quote(
        f"torch-2.4.0.dev20240302+cpu-{PY}-{PY}-{HERE_PLATFORM}.whl"))
    found = ix.find_unlisted(listed, UNLISTED[0])
    assert found is not None and found.version == "2.4.0.dev20240510+cpu"
    assert ix.find_unlisted(listed, date(2024, 5, 11)) is None


def test_download_records_sha256_and_rejects_a_mismatch(fake_index, tmp_path):
    listed = ix.load_index(str(fake_index.root), PYVER, HERE)
    nightly = listed.by_date(date(2024, 6, 2))
    path, sha = ix.download(nightly, tmp_path / "a")
    assert sha == hashlib.sha256((fake_index.root / nightly.filename).read_bytes()).hexdigest()
    wrong = ix.Nightly(nightly.date, nightly.version, nightly.filename, nightly.url, "0" * 64)
    with pytest.raises(OpforgeError, match="does not match the index"):
        ix.download(wrong, tmp_path / "b")
    assert not (tmp_path / "b" / nightly.filename).exists()


def test_missing_local_index_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="no such directory"):
        ix.load_index(str(tmp_path / "nope"), PYVER, HERE)


def test_bad_python_version_is_a_usage_error():
    with pytest.raises(UsageError, match="expected a version like 3.11"):
        ix.target_tags("three")


class _Handler(http.server.SimpleHTTPRequestHandler):
    """A PEP 691-negotiating index server over the fake index directory."""

    json_page: bytes = b""
    requests: list[tuple[str, str]] = []

    def log_message(self, *args):
        pass

    def _project_page(self, head: bool):
        accept = self.headers.get("Accept", "")
        self.requests.append((self.command, accept))
        if "application/vnd.pypi.simple.v1+json" in accept:
            body, ctype = self.json_page, "application/vnd.pypi.simple.v1+json"
        else:
            body, ctype = (Path(self.directory) / "torch" / "index.html").read_bytes(), "text/html"
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def do_GET(self):
        if self.path.rstrip("/") == "/torch":
            return self._project_page(False)
        return super().do_GET()

    def do_HEAD(self):
        if self.path.rstrip("/") == "/torch":
            return self._project_page(True)
        return super().do_HEAD()


@pytest.fixture
def http_index(fake_index):
    files = [{"filename": p.name, "url": "../" + urllib.parse.quote(p.name), "hashes": {}}
             for p in sorted(fake_index.root.glob("torch-*.whl"))
             if not any(f"dev{d:%Y%m%d}" in p.name for d in UNLISTED)]
    import json

    handler = type("H", (_Handler,), {"json_page": json.dumps({"meta": {"api-version": "1.1"},
                                                                "name": "torch",
                                                                "files": files}).encode(),
                                      "requests": []})
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), lambda *a, **k: handler(*a, directory=str(fake_index.root), **k))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler
    server.shutdown()
    server.server_close()


def test_http_index_negotiates_pep691_and_finds_unlisted_wheels_by_head(http_index, fake_index):
    url, handler = http_index
    listed = ix.load_index(url, PYVER, HERE)
    local = ix.load_index(str(fake_index.root), PYVER, HERE)
    assert [n.filename for n in listed.nightlies] == [n.filename for n in local.nightlies]
    assert handler.requests[0][1].startswith("application/vnd.pypi.simple.v1+json")
    assert listed.nightlies[0].url.startswith(url + "/torch-2.4.0.dev20240520%2Bcpu")
    found = ix.find_unlisted(listed, UNLISTED[1])
    assert found is not None and found.url.startswith(url + "/")
    path, sha = ix.download(found, fake_index.root.parent / "dl-http")
    assert sha == hashlib.sha256((fake_index.root / found.filename).read_bytes()).hexdigest()


def test_unreachable_index_is_one_clear_error():
    with pytest.raises(OpforgeError, match="cannot read the nightly index http://127.0.0.1:9/"
                                           "torch/.*pass --index"):
        ix.load_index("http://127.0.0.1:9", PYVER, HERE)


@pytest.mark.parametrize("variant, url", [
    ("cpu", "https://download.pytorch.org/whl/nightly/cpu"),
    ("cu126", "https://download.pytorch.org/whl/nightly/cu126"),
    ("mps", "https://download.pytorch.org/whl/nightly/cpu"),  # macOS arm64 wheels live under cpu
])
def test_default_nightly_index_per_variant(variant, url):
    assert ix.variant_index(ix.DEFAULT_INDEX, variant) == url
