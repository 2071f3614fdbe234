"""The real ``opforge bisect`` against a file:// nightly index, real venvs and pip.

Candidates between 2024-06-01 and 2024-06-10 are 06-01, 06-02, 06-03, 06-04, 06-05, 06-07,
06-08, 06-10 (06-06 exists for macOS only, 06-09 for another Python only): eight.
"""

from __future__ import annotations

import hashlib
import json
from datetime import date

import pytest
from fake_nightlies import HERE_PLATFORM, PY, UNLISTED, write_wheel

pytestmark = pytest.mark.slow

CANDIDATES_0601_0610 = 8


def log_events(path, event="probe"):
    return [e for e in map(json.loads, path.read_text().splitlines()) if e["event"] == event]


def test_finds_the_regression_and_its_commits(bisector, fake_index):
    repo = fake_index.repo
    run = bisector("--good", "2024-06-01", "--bad", "2024-06-10", "--match", "does not exist",
                   "--pytorch-repo", str(repo.path), "--json")
    assert run.returncode == 0, run.stderr
    data = run.json()
    assert (data["last_good"]["date"], data["first_bad"]["date"]) == ("2024-06-05", "2024-06-07")
    assert data["exact"] and data["skipped"] == []
    assert data["first_bad"]["version"] == "2.5.0.dev20240607+cpu"
    assert data["last_good"]["commit"] == repo.nightly_at[date(2024, 6, 5)]
    assert data["first_bad"]["commit"] == repo.nightly_at[date(2024, 6, 7)]
    commits = data["commits"]
    assert commits["good_main_commit"] == repo.main_at[date(2024, 6, 5)]
    assert commits["bad_main_commit"] == repo.main_at[date(2024, 6, 7)]
    assert [c["sha"] for c in commits["commits"]] == repo.main_between(date(2024, 6, 5),
                                                                       date(2024, 6, 7))
    assert [c["subject"] for c in commits["commits"]][-1] == "change 1 of 2024-06-06"
    assert data["candidates"] == CANDIDATES_0601_0610
    assert data["probes"] <= (CANDIDATES_0601_0610 - 1).bit_length() + 2
    # every step is logged with what a user needs to check it by hand
    wheel = fake_index.root / f"torch-2.5.0.dev20240607+cpu-{PY}-{PY}-{HERE_PLATFORM}.whl"
    first_bad = [e for e in log_events(bisector.state.with_suffix(".log.jsonl"))
                 if e["date"] == "2024-06-07"][0]
    assert first_bad["sha256"] == hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert first_bad["url"].endswith("torch-2.5.0.dev20240607%2Bcpu-" + f"{PY}-{PY}-{HERE_PLATFORM}.whl")
    assert first_bad["commit"] == repo.nightly_at[date(2024, 6, 7)]
    assert first_bad["exit_code"] == 1
    assert "operator opforge::nms does not exist" in first_bad["output_tail"]
    assert "torch-2.5.0.dev20240607" in data["reproduce"] and "probe.py" in data["reproduce"]


def test_without_match_an_unrelated_broken_nightly_misleads(bisector):
    # 06-04 fails with a loader error: counted as bad, it takes the blame; --match fixes that
    run = bisector("--good", "2024-06-01", "--bad", "2024-06-10", "--json")
    assert run.returncode == 0, run.stderr
    assert run.json()["first_bad"]["date"] == "2024-06-04"


def test_match_turns_unrelated_failures_into_skips(bisector):
    run = bisector("--good", "2024-06-01", "--bad", "2024-06-10", "--match", "does not exist",
                   "--json")
    data = run.json()
    assert data["first_bad"]["date"] == "2024-06-07"
    skip = [e for e in log_events(bisector.state.with_suffix(".log.jsonl"))
            if e["date"] == "2024-06-04"]
    assert skip and skip[0]["outcome"] == "skip" and "--match" in skip[0]["reason"]


def test_skips_next_to_the_regression_leave_the_smallest_range(bisector):
    bisector.env.update(PROBE_MODE="bad_from:20240605", SKIP_AT="20240605,20240603")
    run = bisector("--good", "2024-06-01", "--bad", "2024-06-10", "--json")
    assert run.returncode == 0, run.stderr
    data = run.json()
    assert not data["exact"]
    assert (data["last_good"]["date"], data["first_bad"]["date"]) == ("2024-06-04", "2024-06-07")
    assert [s["date"] for s in data["skipped"]] == ["2024-06-05"]
    assert "could not be tested (2024-06-05)" in " ".join(run.stderr.split())  # the headline


def test_nightly_choice_takes_the_last_build_of_a_date_for_this_platform(bisector, fake_index):
    bisector.env["PROBE_MODE"] = "bad_from:20240602"
    run = bisector("--good", "2024-06-01", "--bad", "2024-06-03", "--json")
    data = run.json()
    # the branch cut: 2.5.0 (not 2.4.0) on 06-01; the rebuild (build tag 1) on 06-03
    assert data["last_good"]["version"] == "2.5.0.dev20240601+cpu"
    assert data["last_good"]["commit"] == fake_index.repo.nightly_at[date(2024, 6, 1)]
    assert data["first_bad"]["date"] == "2024-06-02"
    log = log_events(bisector.state.with_suffix(".log.jsonl"))
    assert any(e["url"].endswith(f"+cpu-1-{PY}-{PY}-{HERE_PLATFORM}.whl".replace("+", "%2B"))
               for e in log if e["date"] == "2024-06-03")


def test_second_run_downloads_and_installs_nothing(fresh_bisector):
    args = ("--good", "2024-06-01", "--bad", "2024-06-10", "--match", "does not exist", "--json")
    first = fresh_bisector(*args)
    assert first.returncode == 0, first.stderr
    log_path = fresh_bisector.state.with_suffix(".log.jsonl")
    first_steps = log_events(log_path)
    assert first_steps and not any(e["reused_env"] for e in first_steps)
    assert all(any("installed torch" in a for a in e["actions"]) for e in first_steps)
    envs = sorted(p.name for p in (fresh_bisector.cache / "envs").iterdir())
    # each probe's, and those made ahead for a step that the outcome made unnecessary
    assert len(envs) >= len(first_steps)
    assert any("prefetched" in a for e in first_steps for a in e["actions"])

    second = fresh_bisector(*args)
    assert second.returncode == 0, second.stderr
    second_steps = log_events(log_path)[len(first_steps):]
    assert len(second_steps) == len(first_steps)
    assert all(e["reused_env"] and e["actions"] == [] for e in second_steps)
    # the probed environments are all still there (a prefetch may have added others)
    assert {p.name for p in (fresh_bisector.cache / "envs").iterdir()} >= set(envs)
    # a wheel is kept only when a prefetch was cut short by the end of the bisect (the next
    # use installs it without downloading again); no probed nightly's wheel is left
    probed = {e["url"].rsplit("/", 1)[-1].replace("%2B", "+") for e in first_steps}
    assert not probed & {p.name for p in (fresh_bisector.cache / "wheels").glob("*.whl")}
    assert second.json()["first_bad"] == first.json()["first_bad"]
    assert "cached env" in second.stderr


def test_resume_after_a_kill_repeats_no_finished_step(bisector, tmp_path):
    bisector.env.update(KILL_AT="20240605", KILL_ONCE=str(tmp_path / "killed"))
    args = ("--good", "2024-06-01", "--bad", "2024-06-10", "--match", "does not exist")
    killed = bisector(*args)
    assert killed.returncode == -9
    before = bisector.probed()
    assert before == ["2024-06-10", "2024-06-01", "2024-06-04", "2024-06-05"]
    resumed = bisector(*args, "--resume", "--json")
    assert resumed.returncode == 0, resumed.stderr
    after = bisector.probed()[len(before):]
    # only the step that was cut off is run again, then the search goes on
    assert after == ["2024-06-05", "2024-06-07"]
    data = resumed.json()
    assert data["first_bad"]["date"] == "2024-06-07"
    assert data["probes_this_run"] == 2
    assert "resuming: 3 steps already done" in resumed.stderr


def test_resume_refuses_different_endpoints(bisector):
    bisector.env["PROBE_MODE"] = "bad_from:20240602"
    assert bisector("--good", "2024-06-01", "--bad", "2024-06-03").returncode == 0
    run = bisector("--good", "2024-05-20", "--resume")
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        "opforge bisect: error: --resume: --good 2024-05-20 differs from the interrupted bisect's "
        "2024-06-01; leave it out, or start over with --restart"]


def test_good_endpoint_that_fails_is_reported(bisector):
    run = bisector("--good", "2024-06-08", "--bad", "2024-06-10", "--match", "does not exist")
    assert run.returncode == 1
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("opforge bisect: error: the good nightly 2024-06-08 (2.5.0.dev20240608+cpu)"
                           " already fails the test (exit 1)")
    assert "pick an earlier --good" in last
    assert "Traceback" not in run.stderr


def test_bad_endpoint_that_passes_is_reported(bisector):
    run = bisector("--good", "2024-06-01", "--bad", "2024-06-03")
    assert run.returncode == 1
    assert ("opforge bisect: error: the bad nightly 2024-06-03 (2.5.0.dev20240603+cpu) passes the test "
            "(exit 0), so it is not bad: nothing to bisect") in run.stderr
    assert bisector.probed() == ["2024-06-03"]  # the bad end is checked first, and alone


def test_a_date_without_a_nightly_is_a_usage_error(bisector):
    run = bisector("--good", "2024-06-06", "--bad", "2024-06-10")
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        f"opforge bisect: error: --good 2024-06-06: no nightly for that date in {bisector.index.root} "
        "(nearest before: 2024-06-05; nearest after: 2024-06-07)"]
    assert bisector.probed() == []


@pytest.mark.parametrize("argv, message", [
    (("--good", "June 1st"), "--good 'June 1st': expected a date like 2024-06-01"),
    (("--good", "2024-06-05", "--bad", "2024-06-01"), "--good 2024-06-05 must be older than --bad 2024-06-01"),
    (("--timeout", "-1"), "--timeout -1: must be a positive number of seconds"),
    (("--timeout-skip",), "--timeout-skip needs --timeout"),
    (("--match", "("), "--match '(': not a regular expression"),
    (("--wheel", "nope.whl"), "--wheel nope.whl: no such wheel file"),
    (("--regress", "sideways"), "argument --regress: invalid choice"),
])
def test_bad_arguments_get_one_line_and_exit_2(bisector, argv, message):
    run = bisector(*argv)
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("opforge bisect: error: ")
    assert message in lines[0]


def test_json_index_pep691_gives_the_same_answer(bisector, fake_index):
    bisector.env["PROBE_MODE"] = "bad_from:20240605"
    run = bisector("--good", "2024-06-01", "--bad", "2024-06-10", "--json",
                   index=fake_index.json_root.as_uri())
    assert run.returncode == 0, run.stderr
    data = run.json()
    assert (data["last_good"]["date"], data["first_bad"]["date"]) == ("2024-06-04", "2024-06-05")


def test_regress_success_finds_where_it_started_to_work(bisector):
    bisector.env["PROBE_MODE"] = "good_from:20240603"
    run = bisector("--good", "2024-05-27", "--bad", "2024-06-10", "--regress", "success",
                   "--json", "--markdown", str(bisector.work / "report.md"))
    assert run.returncode == 0, run.stderr
    data = run.json()
    assert (data["last_good"]["date"], data["first_bad"]["date"]) == ("2024-06-02", "2024-06-03")
    text = (bisector.work / "report.md").read_text()
    assert "started to pass in the nightly of 2024-06-03" in text


def test_timeout_counts_as_bad(bisector):
    bisector.env["PROBE_MODE"] = "hang_from:20240608"
    run = bisector("--good", "2024-06-05", "--bad", "2024-06-10", "--timeout", "3", "--json")
    assert run.returncode == 0, run.stderr
    data = run.json()
    assert data["first_bad"]["date"] == "2024-06-08"
    assert data["first_bad"]["reason"].startswith("timed out after")


def test_timeout_skip_makes_a_hanging_bad_end_untestable(bisector):
    bisector.env["PROBE_MODE"] = "hang_from:20240608"
    run = bisector("--good", "2024-06-05", "--bad", "2024-06-10", "--timeout", "2",
                   "--timeout-skip")
    assert run.returncode == 1
    assert "the bad nightly 2024-06-10 (2.5.0.dev20240610+cpu) could not be tested (timed out" \
        in run.stderr


def test_retries_rerun_a_flaky_probe(bisector, tmp_path):
    # the good end fails once with exit 3, then passes: one retry makes it good
    bisector.env.update(FLAKY_AT="20240608", FLAKY_ONCE=str(tmp_path / "flaked"),
                        PROBE_MODE="bad_from:20240611")
    run = bisector("--good", "2024-06-08", "--bad", "2024-06-11", "--retries", "1", "--json")
    assert run.returncode == 0, run.stderr
    steps = {e["date"]: e for e in log_events(bisector.state.with_suffix(".log.jsonl"))}
    assert [a["exit_code"] for a in steps["2024-06-08"]["attempts"]] == [3, 0]
    assert steps["2024-06-08"]["outcome"] == "good"
    assert run.json()["first_bad"]["date"] == "2024-06-11"


def test_without_retries_a_flaky_good_end_is_reported(bisector, tmp_path):
    bisector.env.update(FLAKY_AT="20240608", FLAKY_ONCE=str(tmp_path / "flaked"),
                        PROBE_MODE="bad_from:20240611")
    run = bisector("--good", "2024-06-08", "--bad", "2024-06-11")
    assert run.returncode == 1
    assert "the good nightly 2024-06-08" in run.stderr and "already fails" in run.stderr


def test_exit_128_aborts_and_keeps_the_state(bisector):
    bisector.env["PROBE_MODE"] = "exit:130"
    run = bisector("--good", "2024-06-01", "--bad", "2024-06-10")
    assert run.returncode == 1
    assert "git bisect run semantics stop the bisect on 128 and above" in run.stderr


def test_without_good_it_walks_back(bisector):
    bisector.env["PROBE_MODE"] = "bad_from:20240603"
    run = bisector("--bad", "2024-06-10", "--json")
    assert run.returncode == 0, run.stderr
    data = run.json()
    assert data["walked_back"] == ["2024-06-08", "2024-06-01"]
    assert (data["last_good"]["date"], data["first_bad"]["date"]) == ("2024-06-02", "2024-06-03")
    assert "no --good given: walked back from 2024-06-08; 2024-06-01 is good" in run.stderr


def test_walk_back_past_the_index_uses_direct_urls(bisector):
    # 05-20 is the oldest listed nightly; 05-15 and 05-12 exist only as files
    bisector.env["PROBE_MODE"] = "bad_from:20240513"
    run = bisector("--bad", "2024-05-22", "--json")
    assert run.returncode == 0, run.stderr
    data = run.json()
    assert data["walked_back"] == ["2024-05-20", "2024-05-12"]
    assert (data["last_good"]["date"], data["first_bad"]["date"]) == ("2024-05-12", "2024-05-15")
    assert data["first_bad"]["version"] == "2.4.0.dev20240515+cpu"


def test_good_older_than_the_index_is_found_by_its_url(bisector):
    bisector.env["PROBE_MODE"] = "bad_from:20240522"
    run = bisector("--good", str(UNLISTED[0]), "--bad", "2024-05-25", "--json")
    assert run.returncode == 0, run.stderr
    data = run.json()
    assert data["last_good"]["date"] == "2024-05-20"
    assert data["first_bad"]["date"] == "2024-05-22"
    assert data["candidates"] == 7  # 05-10, 05-12, 05-15 (by URL), 05-20, 05-22, 05-23, 05-25


def test_wheel_mode_installs_the_wheel_beside_each_nightly(bisector, tmp_path):
    wheel = write_wheel(tmp_path, "fakeops", "0.1.0", "py3-none-any",
                        {"fakeops/__init__.py": "import torch\ntorch.nms_check()\n"})
    run = bisector("--good", "2024-06-01", "--bad", "2024-06-10", "--wheel", str(wheel),
                   "--match", "does not exist", "--json",
                   command=["python", "-c", "import fakeops"])
    assert run.returncode == 0, run.stderr
    assert run.json()["first_bad"]["date"] == "2024-06-07"
    steps = log_events(bisector.state.with_suffix(".log.jsonl"))
    assert all(any("fakeops" in a for a in e["actions"]) for e in steps if e["outcome"] != "skip"
               or "--match" in e["reason"])


def test_markdown_to_stdout_is_pasteable(bisector, fake_index):
    bisector.env["PROBE_MODE"] = "bad_from:20240605"
    run = bisector("--good", "2024-06-03", "--bad", "2024-06-07", "--markdown")
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("### opforge bisect: it regressed in the nightly of 2024-06-05")
    assert "| last good | 2024-06-04 |" in run.stdout
    assert "https://github.com/pytorch/pytorch/compare/" in run.stdout


def test_endpoints_from_smoke_reports_and_latest(bisector, tmp_path):
    # how CI names the nightlies: the last green night's `opforge smoke --json` report
    report = tmp_path / "last-green" / "cpu-linux-x86_64-py3.11.json"
    report.parent.mkdir()
    report.write_text(json.dumps({"schema": 1, "environment": {
        "torch_version": "2.5.0.dev20240601+cpu", "torch_git_version": "abc"}}))
    bisector.env["PROBE_MODE"] = "bad_from:20240603"
    run = bisector("--good", str(report), "--bad", "latest", "--json")
    assert run.returncode == 0, run.stderr
    data = run.json()
    assert (data["last_good"]["date"], data["first_bad"]["date"]) == ("2024-06-02", "2024-06-03")
    assert data["notes"] == [f"--good 2024-06-01 from {report} (torch 2.5.0.dev20240601+cpu)"]
    assert bisector.probed()[0] == "2024-06-11"  # latest: the newest nightly on the index


def test_a_missing_good_report_falls_back_to_the_walk_back(bisector, tmp_path):
    bisector.env["PROBE_MODE"] = "bad_from:20240603"
    missing = tmp_path / "last-green" / "none.json"
    run = bisector("--good", str(missing), "--bad", "2024-06-10", "--json")
    assert run.returncode == 0, run.stderr
    data = run.json()
    assert data["walked_back"] == ["2024-06-08", "2024-06-01"]
    assert f"--good {missing}: no such report, so walking back from --bad instead" in \
        " ".join(run.stderr.split())


def test_a_stopped_bisect_still_writes_its_reports(bisector):
    out = bisector.work / "reports" / "bisect.json"  # the directory does not exist yet
    md = bisector.work / "summary.md"
    run = bisector("--good", "2024-06-08", "--bad", "2024-06-10", "--match", "does not exist",
                   "--json", str(out), "--markdown", str(md))
    assert run.returncode == 1
    data = json.loads(out.read_text())
    assert data["status"] == "error" and "already fails" in data["error"]
    assert [(t["date"], t["outcome"]) for t in data["tested"]] == [("2024-06-08", "bad"),
                                                                   ("2024-06-10", "bad")]
    assert md.read_text().startswith("### opforge bisect stopped: the good nightly 2024-06-08")


def test_resuming_a_finished_bisect_reports_it_again_without_probing(bisector):
    bisector.env["PROBE_MODE"] = "bad_from:20240602"
    first = bisector("--good", "2024-06-01", "--bad", "2024-06-03", "--json")
    assert first.returncode == 0, first.stderr
    probed = bisector.probed()
    again = bisector("--resume", "--json")
    assert again.returncode == 0, again.stderr
    assert bisector.probed() == probed
    assert again.json()["first_bad"] == first.json()["first_bad"]
    assert again.json()["probes_this_run"] == 0
