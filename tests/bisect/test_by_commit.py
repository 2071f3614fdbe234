"""`--by-commit`: Python-only main-branch commits over the bad nightly's binaries.

A pytorch-like repository whose main branch between two nightlies has five commits: a
harmless Python change, the regression (Python, PR #1234), a C++ change (skipped and named:
an overlay cannot carry it), a docs + Python change, and the bad nightly's own commit. The
two nightly wheels are built from the repository at their cut commits. No real pytorch clone
is used here (none is reachable from this machine): the overlay logic is proved on this one.
"""

from __future__ import annotations

import html
import urllib.parse
from datetime import date

import pytest
from fake_nightlies import HERE_PLATFORM, PY, Bisector, FakeIndex, _git, write_wheel

pytestmark = pytest.mark.slow

GOOD, BAD = date(2024, 7, 1), date(2024, 7, 2)
INIT = "from .version import __version__, git_version\nfrom .ops import check\n"
OK = "def check():\n    return 'ok'\n"
STRICT = "def check():\n    raise RuntimeError('operator opforge::nms does not exist')\n"


def _commit(repo, message, files):
    for name, text in files.items():
        path = repo / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", message)
    return _git(repo, "rev-parse", "HEAD")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    repo = tmp_path_factory.mktemp("pytorch-src")
    _git(repo, "init", "-q", "-b", "main")
    main = {}
    main["cut_good"] = _commit(repo, "the good nightly's cut", {
        "torch/__init__.py": INIT, "torch/ops.py": OK, "torch/extra.py": "X = 1\n",
        "aten/src/kernel.cpp": "int k = 1;\n"})
    main["harmless"] = _commit(repo, "tidy extra (#1233)", {"torch/extra.py": "X = 2\n"})
    main["regression"] = _commit(repo, "make check strict (#1234)", {"torch/ops.py": STRICT})
    main["kernel"] = _commit(repo, "faster kernel (#1235)", {"aten/src/kernel.cpp": "int k=2;\n"})
    main["docs"] = _commit(repo, "docs and extra (#1236)", {"docs/a.md": "hi\n",
                                                            "torch/extra.py": "X = 3\n"})
    main["cut_bad"] = _commit(repo, "the bad nightly's cut (#1237)", {"torch/extra.py": "X = 4\n"})
    index = tmp_path_factory.mktemp("nightly-by-commit")
    (index / "torch").mkdir()
    wheels = []
    _git(repo, "checkout", "-q", "--orphan", "nightly")
    for day, cut in ((GOOD, main["cut_good"]), (BAD, main["cut_bad"])):
        nightly = _commit(repo, f"{day.isoformat()} nightly release ({cut})",
                          {"nightly-marker": day.isoformat()})
        version = f"2.6.0.dev{day:%Y%m%d}+cpu"
        files = {name: _git(repo, "show", f"{cut}:{name}") + "\n"
                 for name in ("torch/__init__.py", "torch/ops.py", "torch/extra.py")}
        files["torch/version.py"] = f"__version__ = {version!r}\ngit_version = {nightly!r}\n"
        wheels.append(write_wheel(index, "torch", version, f"{PY}-{PY}-{HERE_PLATFORM}", files))
    _git(repo, "checkout", "-q", "main")
    (index / "torch" / "index.html").write_text("<html><body>\n" + "\n".join(
        f'<a href="../{urllib.parse.quote(p.name)}">{html.escape(p.name)}</a>' for p in wheels)
        + "\n</body></html>\n")
    return repo, index, main


def test_the_first_bad_python_commit_is_found_and_compiled_ones_are_named(world, probe_script,
                                                                         tmp_path):
    repo, index, main = world
    bisector = Bisector(FakeIndex(index, index, None), probe_script, tmp_path / "cache", tmp_path)
    md = tmp_path / "report.md"
    run = bisector("--good", str(GOOD), "--bad", str(BAD), "--pytorch-repo", str(repo),
                   "--by-commit", "--json", "--markdown", str(md),
                   command=["python", "-c", "import torch; torch.check()"])
    assert run.returncode == 0, run.stderr
    data = run.json()
    assert [level["level"] for level in data["levels"]] == ["nightly", "commit"]
    commit = data["levels"][-1]
    assert commit["first_bad"]["sha"] == main["regression"] and data["exact"]
    assert commit["last_good"]["sha"] == main["harmless"]
    tested = {t["label"]: t for t in data["tested"]}
    kernel = tested[main["kernel"][:12]]
    assert kernel["outcome"] == "skip" and "aten/src/kernel.cpp" in kernel["reason"]
    # the overlay never wrote through to the bad nightly's own environment
    base = [p for p in (tmp_path / "cache" / "envs").iterdir() if "20240702" in p.name
            and "+" not in p.name][0]
    assert "raise RuntimeError" in next(base.glob("lib/python*/site-packages/torch/ops.py"))\
        .read_text()
    prs = {c["pr"] for c in data["commits"]["commits"]}
    assert {1234, 1235} <= prs
    text = md.read_text()
    assert f"commit {main['regression'][:12]} (make check strict (#1234))" in text
    assert "(#1234)" in text


def test_by_commit_without_a_repo_is_a_usage_error(bisector):
    run = bisector("--good", "2024-06-01", "--bad", "2024-06-10", "--by-commit")
    assert run.returncode == 2
    assert "--by-commit needs --pytorch-repo PATH" in run.stderr
