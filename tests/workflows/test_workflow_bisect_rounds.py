"""A bisect fanned out over runners: a matrix job per round, its keys from `opforge bisect --plan`.

reusable-bisect.yml runs rounds (plan -> probe x K -> plan ...). The checker accepts a matrix
``{<key>: fromJSON(needs.<plan job>.outputs.<out>)}`` only when that output carries the
``probes`` an ``opforge bisect --plan K`` step writes, optionally with ``include:
fromJSON(needs.<matrix job>.outputs.matrix).include`` (the cell those keys are probed on; then
the per-cell rules hold). Each test breaks one thing in a copy of the repository.
"""

from __future__ import annotations

from test_workflow_drift import RBISECT, one

PROBE1 = "        probe: ${{ fromJSON(needs.plan1.outputs.probes) }}\n"
INCLUDE = "        include: ${{ fromJSON(needs.matrix.outputs.matrix).include }}\n"


def test_probes_fed_by_the_plans_status_instead_of_its_probes_are_caught(repo):
    repo.replace(RBISECT, PROBE1, PROBE1.replace("outputs.probes", "outputs.status"))
    assert one(repo.problems(), "reusable-bisect.yml:", "jobs.probe1.strategy.matrix.probe",
               "needs.plan1.outputs.status is not fed by the 'probes' output of an "
               "'opforge bisect --plan K' step")


def test_probes_from_a_job_that_does_not_plan_are_caught(repo):
    repo.replace(RBISECT, '          --variant "$VARIANT"\n'
                          '          --plan "$PROBES_PER_ROUND" --state state/state.json\n',
                 '          --variant "$VARIANT" --state state/state.json\n')
    problems = repo.problems()
    one(problems, "jobs.probe1.strategy.matrix.probe", "needs.plan1.outputs.probes is not fed")
    assert not [p for p in problems if "jobs.probe2" in p]  # plan2 still plans


def test_probes_fed_by_opforge_matrix_are_caught(repo):
    repo.replace(RBISECT, PROBE1, "        probe: ${{ fromJSON(needs.matrix.outputs.matrix) }}\n")
    one(repo.problems(), "jobs.probe1.strategy.matrix.probe",
        "needs.matrix.outputs.matrix is not fed by the 'probes' output")


def test_a_round_that_does_not_need_its_plan_is_caught(repo):
    repo.replace(RBISECT, "    needs: [matrix, plan2]\n", "    needs: [matrix, plan1]\n")
    one(repo.problems(), "jobs.probe2.strategy.matrix.probe",
        "reads needs.plan2 but does not list it in needs")


def test_cells_included_from_something_other_than_opforge_matrix_are_caught(repo):
    repo.replace(RBISECT, INCLUDE,
                 "        include: ${{ fromJSON(needs.plan1.outputs.probes).include }}\n")
    one(repo.problems(), "jobs.probe1.strategy.matrix",
        "needs.plan1.outputs.probes is not fed by an 'opforge matrix --github' step")


def test_a_probe_key_that_hides_a_cell_field_is_caught(repo):
    repo.replace(RBISECT, PROBE1, PROBE1.replace("probe:", "python:"))
    one(repo.problems(), "jobs.probe1.strategy.matrix.python",
        "the probe key would replace the cell's matrix.python")


def test_a_field_neither_the_cell_nor_the_plan_emits_is_caught(repo):
    repo.replace(RBISECT, "          PROBE: ${{ matrix.probe }}\n",
                 "          PROBE: ${{ matrix.key }}\n")
    one(repo.problems(), "jobs.probe1:", "matrix.key is not a field opforge matrix --github "
                                         "emits, nor the probe key (matrix.probe)")


def test_another_dimension_beside_the_probes_is_a_typed_matrix(repo):
    repo.replace(RBISECT, PROBE1, PROBE1 + "        attempt: [1, 2]\n")
    one(repo.problems(), "jobs.probe1.strategy.matrix", "matrix typed in the workflow")


def test_a_round_on_the_cells_runner_still_follows_the_cell_rules(repo):
    repo.replace(RBISECT, "    name: probe ${{ matrix.probe }} (round 1, ${{ matrix.name }})\n"
                          "    needs: [matrix, plan1]\n"
                          "    if: needs.plan1.outputs.status == 'probe'\n"
                          "    runs-on: ${{ matrix.runner }}\n",
                 "    name: probe ${{ matrix.probe }} (round 1, ${{ matrix.name }})\n"
                 "    needs: [matrix, plan1]\n"
                 "    if: needs.plan1.outputs.status == 'probe'\n"
                 "    runs-on: ubuntu-24.04\n")
    one(repo.problems(), "jobs.probe1.runs-on", "a per-cell job runs on ${{ matrix.runner }}")


ROUNDS = """name: my rounds
on:
  workflow_dispatch:
permissions:
  contents: read
concurrency:
  group: ${{ github.workflow }}
  cancel-in-progress: true
jobs:
  plan:
    runs-on: ubuntu-24.04
    timeout-minutes: 10
    outputs:
      keys: ${{ steps.round.outputs.probes }}
    steps:
      - id: round
        run: opforge bisect --good 2024-06-01 --bad 2024-06-09 --variant cpu --plan 4
  probe:
    needs: plan
    runs-on: RUNNER
    timeout-minutes: 60
    strategy:
      matrix:
        nightly: ${{ fromJSON(needs.plan.outputs.keys) }}
    steps:
      - env:
          KEY: ${{ matrix.nightly }}
        run: opforge bisect --probe "$KEY" --state verdict.json
"""


def test_a_round_without_cells_runs_on_a_declared_runner(repo):
    path = repo.path(".github/workflows/rounds.yml")
    path.write_text(ROUNDS.replace("RUNNER", "ubuntu-24.04"))
    assert repo.problems() == []
    path.write_text(ROUNDS.replace("RUNNER", "ubuntu-24.04")
                    .replace("KEY: ${{ matrix.nightly }}", "KEY: ${{ matrix.runner }}"))
    one(repo.problems(), "rounds.yml:", "jobs.probe:", "matrix.runner is not the probe key "
                                                       "(matrix.nightly), the one field")
    path.write_text(ROUNDS.replace("RUNNER", "my-gpu-box"))
    one(repo.problems(), "rounds.yml:", "jobs.probe.runs-on", "runner 'my-gpu-box' is not "
                                                              "declared in matrix.yaml")
    path.write_text(ROUNDS.replace("RUNNER", "ubuntu-24.04")
                    .replace("--plan 4", "--plan four"))
    one(repo.problems(), "rounds.yml:", "jobs.plan.steps[0]", "'opforge bisect", "--plan four")


def _report_round(needs: dict) -> tuple[str, str]:
    """The report job's ROUND and ROUND_STATUS for the plan jobs' outcomes in ``needs``."""
    from pathlib import Path

    from opforge.workflows.expressions import render, to_str
    from opforge.workflows.workflow import load_yaml

    wf = load_yaml((Path(__file__).resolve().parents[2] / RBISECT).read_text())
    env = wf["jobs"]["report"]["env"]
    ctx = {"needs": needs, "matrix": {}, "inputs": {}, "env": {}}
    return to_str(render(env["ROUND"], ctx)), to_str(render(env["ROUND_STATUS"], ctx))


def _plans(*statuses: str | None) -> dict:
    """needs for plan1..plan3: a status each, or None for a plan that was skipped."""
    return {f"plan{i}": {"result": "skipped" if s is None else "success",
                         "outputs": {} if s is None else {"probes": "[]", "status": s}}
            for i, s in enumerate(statuses, 1)}


def test_the_report_job_takes_the_last_round_that_ran():
    assert _report_round(_plans("done", None, None)) == ("1", "done")      # settled by the ends
    assert _report_round(_plans("probe", "done", None)) == ("2", "done")
    assert _report_round(_plans("probe", "probe", "done")) == ("3", "done")
    assert _report_round(_plans("probe", "probe", "probe")) == ("3", "probe")  # merge, go on
    assert _report_round(_plans("probe", None, None)) == ("1", "probe")  # probe1 failed
