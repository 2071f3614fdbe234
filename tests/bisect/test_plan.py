"""`--plan K` / `--probe KEY` / `--verdicts`: a bisect fanned out in rounds of K machines.

Each round's probes run as separate `--probe` processes with their own state files (as on K
runners); the next `--plan` merges them. The state is the local run's, so `--resume` writes
the report of a fanned-out bisect without probing anything again.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

ENDS = ("--good", "2024-06-03", "--bad", "2024-06-08", "--match", "does not exist")


def test_rounds_of_three_find_the_regression_and_resume_writes_the_report(bisector):
    main = str(bisector.state)
    verdicts: list[str] = []
    rounds = []
    while True:
        run = bisector(*ENDS, "--plan", "3", "--state", main,
                       *(["--verdicts", *verdicts] if verdicts else []))
        assert run.returncode == 0, run.stderr
        plan = run.json()
        if plan["status"] == "done":
            break
        rounds.append([p["key"] for p in plan["probes"]])
        for key in rounds[-1]:
            state = str(bisector.work / f"probe-{key}.json")
            probed = bisector(*ENDS, "--probe", key, "--state", state)
            assert probed.returncode == 0, probed.stderr
            assert probed.json()["step"]["nightly"]["date"] == key
            verdicts.append(state)
    assert rounds[0][-1] == "2024-06-08" and rounds[0][0] == "2024-06-03"  # endpoints first
    assert len(rounds) == 2 and all(len(r) <= 3 for r in rounds)
    assert sorted(bisector.probed()) == sorted(k for r in rounds for k in r)
    report = bisector("--resume", "--state", main, "--json")
    assert report.returncode == 0, report.stderr
    data = report.json()
    assert data["first_bad"]["date"] == "2024-06-07" and data["probes_this_run"] == 0


def test_verdicts_of_another_bisect_are_refused(bisector):
    other = str(bisector.work / "other.json")
    assert bisector("--good", "2024-06-01", "--bad", "2024-06-03", "--probe", "2024-06-03",
                    "--state", other).returncode == 0
    run = bisector(*ENDS, "--plan", "2", "--verdicts", other)
    assert run.returncode == 2
    assert "another bisect's (good '2024-06-01', here '2024-06-03')" in run.stderr
    assert not bisector.state.exists()


@pytest.mark.parametrize("argv, message", [
    (("--plan", "0"), "--plan 0: give a number of probes per round from 1 to 256"),
    (("--plan", "2", "--probe", "2024-06-05"), "--plan prints a round, --probe runs one"),
    (("--verdicts", "x.json"), "--verdicts goes with --plan"),
    (("--probe", "2024-06-06"), "--probe 2024-06-06: not a candidate of this bisect"),
])
def test_bad_fan_out_arguments_exit_2(bisector, argv, message):
    run = bisector(*ENDS, *argv)
    assert run.returncode == 2
    assert message in run.stderr.strip().splitlines()[-1]
    assert not bisector.state.exists()


def test_rounds_laid_out_as_reusable_bisect_yml_moves_them_between_jobs(bisector):
    """The artifacts of reusable-bisect.yml: round r's plan uploads its state as bisect-r-state;
    each probe job downloads it alone (state/state.json), runs `--probe KEY` on it and uploads
    it as bisect-r-probe-KEY; the next plan downloads the pattern bisect-r-* (one directory per
    artifact, the plan's own state among them) and runs `--plan K --verdicts state/*`. The
    report job runs `--resume` on the last plan's state."""
    import shutil

    store = bisector.work / "artifacts"

    def upload(name: str, path) -> None:
        (store / name).mkdir(parents=True)
        shutil.copy(path, store / name / "state.json")

    def download(pattern: str, job: str):
        target = bisector.work / job / "state"
        for found in sorted(store.glob(pattern)):
            shutil.copytree(found, target / found.name)
        return target

    first = bisector.work / "plan1" / "state" / "state.json"
    run = bisector(*ENDS, "--plan", "3", "--state", str(first))
    assert run.returncode == 0, run.stderr
    upload("bisect-1-state", first)
    state, rounds = first, 1
    while run.json()["status"] == "probe":
        for key in [p["key"] for p in run.json()["probes"]]:
            job = bisector.work / f"probe{rounds}-{key}" / "state"
            shutil.copytree(store / f"bisect-{rounds}-state", job)
            probed = bisector("--probe", key, "--state", str(job / "state.json"))
            assert probed.returncode == 0, probed.stderr
            upload(f"bisect-{rounds}-probe-{key}", job / "state.json")
        downloaded = download(f"bisect-{rounds}-*", f"plan{rounds + 1}")
        state = downloaded / f"bisect-{rounds}-state" / "state.json"
        run = bisector("--plan", "3", "--state", str(state),
                       "--verdicts", *map(str, sorted(downloaded.iterdir())))
        assert run.returncode == 0, run.stderr
        rounds += 1
        upload(f"bisect-{rounds}-state", state)
    assert rounds == 3  # two rounds of probes, the third plan says done
    report = bisector("--resume", "--state", str(state), "--json")
    assert report.returncode == 0, report.stderr
    assert report.json()["first_bad"]["date"] == "2024-06-07"
    assert report.json()["probes_this_run"] == 0
