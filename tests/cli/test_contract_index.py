"""opforge index under bad input: DIST and --out of every kind of path, hostile wheels (see
contract.py). A refused case changes nothing; an accepted one writes only under --out."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from contract import PATH_KINDS, check, examples, make_path
from hypothesis import given
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "publish"))
from publish_wheelkit import make_wheel  # noqa: E402


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("contract-index")


def _dist(root: Path) -> Path:
    make_wheel(root / "cpu", "boxops", "1.0+cpu", requires=("torch==2.13.0",),
               record={"variant": "cpu"})
    return root


@pytest.mark.parametrize("kind", PATH_KINDS)
def test_out_of_every_kind(work, kind):
    base = work / f"out-{kind}"
    base.mkdir(exist_ok=True)
    dist = _dist(base / "dist")
    out = make_path(kind, base)
    expected = {0} if kind in ("missing", "directory") else {2}
    check(["index", str(dist), "--out", str(out)], expected, watch=(base,),
          changes_allowed=True)


@pytest.mark.parametrize("kind", PATH_KINDS)
def test_dist_of_every_kind(work, kind):
    base = work / f"dist-{kind}"
    base.mkdir(exist_ok=True)
    check(["index", str(make_path(kind, base)), "--out", str(base / "site")], {2},
          watch=(base,))


@pytest.mark.parametrize("kind", ["fifo", "directory", "symlink-loop", "dangling-symlink",
                                  "empty-file"])
def test_a_wheel_name_that_is_not_a_wheel_file(work, kind):
    base = work / f"wheel-{kind}"
    (base / "dist" / "cpu").mkdir(parents=True, exist_ok=True)
    make_path(kind, base / "dist" / "cpu", "boxops-1.0+cpu-py3-none-any.whl")
    check(["index", str(base / "dist"), "--out", str(base / "site")], {2}, watch=(base,))


@examples(40)
@given(data=st.binary(max_size=400), cut=st.integers(0, 2000))
def test_corrupt_wheels(work, data, cut):
    import shutil

    base = work / "corrupt"
    shutil.rmtree(base / "site", ignore_errors=True)  # each case publishes into a new tree
    dist = _dist(base / "dist")
    good = next((dist / "cpu").glob("*.whl")).read_bytes()
    (dist / "cpu" / "boxops-2.0+cpu-py3-none-any.whl").write_bytes(good[:cut] + data)
    check(["index", str(dist), "--out", str(base / "site")], {0, 2}, watch=(base,),
          changes_allowed=True)
