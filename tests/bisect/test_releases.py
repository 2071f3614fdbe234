"""Bisecting released versions, then the nightlies between the boundary releases.

The fake release index holds 2.3.0 ... 2.5.1 (+cpu); 2.5.0 carries the regression that the
2024-06-07 nightly introduced, so the search goes 2.4.1 (good) -> 2.5.0 (bad), then into the
2.5.0.dev nightlies (after 2.4's branch cut): 06-05 good, 06-07 bad.
"""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow


def log_events(path):
    return [e for e in map(json.loads, path.read_text().splitlines()) if e["event"] == "probe"]


def test_releases_then_nightlies_in_one_report(bisector, fake_releases):
    md = bisector.work / "report.md"
    run = bisector("--good", "2.3.0", "--bad", "2.5.1", "--release-index", str(fake_releases),
                   "--match", "does not exist", "--json", "--markdown", str(md))
    assert run.returncode == 0, run.stderr
    data = run.json()
    release, nightly = data["levels"]
    assert release["level"] == "release" and release["candidates"] == 6
    assert (release["last_good"]["label"], release["first_bad"]["label"]) == ("2.4.1+cpu",
                                                                              "2.5.0+cpu")
    assert nightly["level"] == "nightly"
    assert (nightly["last_good"]["date"], nightly["first_bad"]["date"]) == ("2024-06-05",
                                                                            "2024-06-07")
    assert data["first_bad"]["date"] == "2024-06-07" and data["level"] == "nightly"
    # the releases were probed first, then only nightlies of the 2.5 series
    probed = [e["date"] for e in log_events(bisector.state.with_suffix(".log.jsonl"))]
    assert probed[:5] == ["2.5.1+cpu", "2.3.0+cpu", "2.4.0+cpu", "2.4.1+cpu", "2.5.0+cpu"]
    assert all(p.startswith("2024-06-") for p in probed[5:])
    # each end's environment: torch's build record and what was installed
    env = data["last_good"]["environment"]
    assert env["torch"]["version"] == "2.5.0.dev20240605+cpu"
    assert any(p.startswith("torch") for p in env["packages"])
    assert release["first_bad"]["environment"]["torch"]["version"] == "2.5.0+cpu"
    assert "2.5.0.dev20240607" in data["reproduce"] and "2.5.0.dev20240605" in \
        data["reproduce_good"]
    text = md.read_text()
    assert text.startswith("### opforge bisect: it regressed in 2.5.0+cpu (the 2.4.1+cpu release "
                           "is good); between them, regressed in the nightly of 2024-06-07")
    assert "| release: last good | 2.4.1+cpu |" in text and "| nightly: first bad | 2024-06-07 |" \
        in text
    assert "and the last good one with:" in text and "environment of 2024-06-07 (bad)" in text


def test_releases_only_stops_at_the_release_boundary(bisector, fake_releases):
    run = bisector("--good", "2.4.0", "--bad", "2.5.0", "--release-index", str(fake_releases),
                   "--releases-only", "--match", "does not exist", "--json")
    assert run.returncode == 0, run.stderr
    data = run.json()
    assert [level["level"] for level in data["levels"]] == ["release"]
    assert (data["last_good"]["label"], data["first_bad"]["label"]) == ("2.4.1+cpu", "2.5.0+cpu")
    assert data["rerun"].startswith("opforge bisect --good 2.4.1+cpu --bad 2.5.0+cpu")
    assert "--releases-only" in data["rerun"]


def test_release_candidates_on_the_test_channel(bisector, fake_test_channel):
    run = bisector("--good", "2.5.0rc1", "--bad", "2.5.0rc2", "--release-index",
                   str(fake_test_channel), "--json")
    assert run.returncode == 0, run.stderr
    data = run.json()
    assert (data["last_good"]["label"], data["first_bad"]["label"]) == ("2.5.0rc1+cpu",
                                                                        "2.5.0rc2+cpu")
    # two candidates of one release branch: no nightly isolates a cherry-pick, and it says so
    assert len(data["levels"]) == 1
    assert "lists 0 nightlies between 2.5.0rc1+cpu and 2.5.0rc2+cpu" in data["level_notes"][0]


def test_resume_in_the_nightly_level_repeats_no_release(bisector, fake_releases, tmp_path):
    bisector.env.update(KILL_AT="20240605", KILL_ONCE=str(tmp_path / "killed"))
    args = ("--good", "2.4.0", "--bad", "2.5.0", "--release-index", str(fake_releases),
            "--match", "does not exist")
    assert bisector(*args).returncode == -9
    before = bisector.probed()
    resumed = bisector(*args, "--resume", "--json")
    assert resumed.returncode == 0, resumed.stderr
    after = bisector.probed()[len(before):]
    assert after and all(d.startswith("2024-06") for d in after)  # no release again
    assert after[0] == "2024-06-05"  # the step that was cut off
    assert resumed.json()["first_bad"]["date"] == "2024-06-07"


@pytest.mark.parametrize("argv, message", [
    (("--good", "2.4.7", "--bad", "2.5.0"),
     "--good 2.4.7: no such torch release in {releases} for Python {py} (nearest before: "
     "2.4.1+cpu; nearest after: 2.5.0+cpu)"),
    (("--good", "2.5.0", "--bad", "2.4.0"), "--good 2.5.0 must be older than --bad 2.4.0"),
    (("--good", "2.4.0", "--bad", "2024-06-10"),
     "--good 2.4.0 and --bad 2024-06-10: give two releases (2.10.0) or two dates"),
    (("--bad", "2.5.0"), "--bad 2.5.0 is a release: give --good as a release too"),
    (("--good", "2.4.0", "--bad", "2.5.0", "--release-index", "http://127.0.0.1:9/"),
     "cannot read the release index http://127.0.0.1:9/torch/"),
    (("--good", "2.4.0", "--bad", "2.5.0", "--release-index", "/nonexistent/releases"),
     "--release-index /nonexistent/releases: no such directory"),
])
def test_bad_release_input_is_one_line_exit_2_and_writes_nothing(bisector, fake_releases,
                                                                  argv, message):
    argv = [*argv] if "--release-index" in argv else [*argv, "--release-index", str(fake_releases)]
    run = bisector(*argv)
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("opforge bisect: error: "), run.stderr
    import sys

    py = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert message.format(releases=fake_releases, py=py) in lines[0]
    assert not bisector.state.exists() and not bisector.state.with_suffix(".log.jsonl").exists()
    assert bisector.probed() == []


def test_a_test_command_that_cannot_start_is_exit_2_and_writes_nothing(bisector, fake_releases):
    run = bisector("--good", "2.4.0", "--bad", "2.5.0", "--release-index", str(fake_releases),
                   command=["no-such-program-opforge"])
    assert run.returncode == 2
    assert run.stderr.strip().splitlines()[-1].startswith(
        "opforge bisect: error: the test command 'no-such-program-opforge' cannot be run")
    assert not bisector.state.exists()
