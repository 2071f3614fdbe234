"""`--with torchvision`: each probe gets the torchvision built for its nightly date or release.

The fake index has a torchvision nightly for every listed date but 2024-06-05, and a
torchvision release pinning each torch release but 2.3.1; each fake torchvision asserts at
import that the torch beside it is its own date's.
"""

from __future__ import annotations

import json

import pytest
from fake_nightlies import NO_TORCHVISION

pytestmark = pytest.mark.slow

CHECK = ["python", "-c", "import torchvision, torch; torch.nms_check()"]


def steps(bisector):
    path = bisector.state.with_suffix(".log.jsonl")
    return {e["date"]: e for e in map(json.loads, path.read_text().splitlines())
            if e["event"] == "probe"}


def test_nightlies_get_their_dates_torchvision_and_a_date_without_one_is_skipped(bisector):
    run = bisector("--good", "2024-06-03", "--bad", "2024-06-10", "--with", "torchvision",
                   "--match", "does not exist", "--json", command=CHECK)
    assert run.returncode == 0, run.stderr
    data = run.json()
    # 06-04 fails for an unrelated reason (--match skips it), 06-05 has no torchvision
    assert (data["last_good"]["date"], data["first_bad"]["date"]) == ("2024-06-03", "2024-06-07")
    assert [s["date"] for s in data["skipped"]] == ["2024-06-04", "2024-06-05"]
    probed = steps(bisector)
    day = NO_TORCHVISION.isoformat()
    assert probed[day]["outcome"] == "skip"
    assert probed[day]["reason"] == f"no torchvision nightly for {day} on the index (--with): skipped"
    assert "no torchvision nightly for 2024-06-05" in run.stderr
    tested = [e for d, e in probed.items() if d not in (day, "2024-06-04")]
    assert tested and all(e["outcome"] in ("good", "bad") for e in tested)
    assert "torchvision-0.20.0.dev20240607" in data["reproduce"]


def test_releases_get_the_torchvision_that_pins_them(bisector, fake_releases):
    run = bisector("--good", "2.3.0", "--bad", "2.5.0", "--release-index", str(fake_releases),
                   "--releases-only", "--with", "torchvision", "--match", "does not exist",
                   "--json", command=CHECK)
    assert run.returncode == 0, run.stderr
    data = run.json()
    assert (data["last_good"]["label"], data["first_bad"]["label"]) == ("2.4.1+cpu", "2.5.0+cpu")
    packages = data["first_bad"]["environment"]["packages"]
    assert any(p.startswith("torchvision") and "0.20.0" in p for p in packages), packages
