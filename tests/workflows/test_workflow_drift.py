"""The workflow checks catch each kind of drift between .github/workflows and the rest.

Each test breaks one thing in a copy of the repository and asserts the problem a maintainer
would read; the first test pins that the real workflows have none.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from opforge.cli.commands import check_workflows
from opforge.matrix import MatrixError

ROOT = Path(__file__).resolve().parents[2]

CI = ".github/workflows/ci.yml"              # callers: triggers, lint and tests jobs
NIGHTLY = ".github/workflows/nightly.yml"
BISECT = ".github/workflows/bisect.yml"
PIPE = ".github/workflows/reusable-build-smoke.yml"   # the reusable workflows they call
RNIGHTLY = ".github/workflows/reusable-nightly.yml"
RBISECT = ".github/workflows/reusable-bisect.yml"
UPLOAD_PIN = "actions/upload-artifact@ea165f8d65b6e75b540449e92b4886f43607fa02 # v4.6.2"


def one(problems: list[str], *fragments: str) -> str:
    """The problem line that has every fragment; fails listing all problems otherwise."""
    hits = [p for p in problems if all(f in p for f in fragments)]
    assert hits, f"no problem with {fragments} in:\n" + "\n".join(problems)
    return hits[0]


def test_the_repository_workflows_have_no_problems():
    assert check_workflows(ROOT) == []


def test_the_copy_starts_clean(repo):
    assert repo.problems() == []


# --------------------------------------------------------------------------- runners and images


def test_a_runner_typed_on_a_cell_job_is_caught(repo):
    repo.replace(PIPE, "  build:\n    name: build ${{ matrix.name }}\n    needs: matrix\n"
                     "    runs-on: ${{ matrix.runner }}",
                 "  build:\n    name: build ${{ matrix.name }}\n    needs: matrix\n"
                 "    runs-on: ubuntu-24.04")
    assert one(repo.problems(), "reusable-build-smoke.yml:", "jobs.build.runs-on",
               "a per-cell job runs on ${{ matrix.runner }}")


def test_a_runner_that_matrix_yaml_does_not_declare_is_caught(repo):
    repo.replace(CI, "runs-on: ubuntu-24.04\n    timeout-minutes: 20",
                 "runs-on: ubuntu-22.04\n    timeout-minutes: 20")
    problem = one(repo.problems(), "jobs.lint.runs-on", "'ubuntu-22.04' is not declared in "
                                                        "matrix.yaml")
    assert problem.startswith(".github/workflows/ci.yml:")


def test_changing_the_runner_in_matrix_yaml_flags_the_label_left_in_a_workflow(repo):
    repo.replace("matrix.yaml", "runner: ubuntu-24.04\n", "runner: ubuntu-26.04\n")
    problems = repo.problems()
    for wf in ("reusable-build-smoke.yml", "reusable-nightly.yml", "reusable-bisect.yml"):
        one(problems, wf, "jobs.matrix.runs-on", "'ubuntu-24.04' is not declared")


def test_a_typed_container_image_is_caught(repo):
    repo.replace(PIPE, "container: ${{ matrix.container }}",
                 "container: pytorch/manylinux2_28-builder:cuda13.0")
    problems = repo.problems()
    one(problems, "jobs.build.container", "the image comes from the matrix")
    one(problems, "(text)", "container image 'pytorch/manylinux2_28-builder:cuda13.0' typed")


def test_a_container_on_a_job_that_runs_no_cell_is_caught(repo):
    repo.replace(CI, "runs-on: ubuntu-24.04\n    timeout-minutes: 20",
                 "runs-on: ubuntu-24.04\n    container: python:3.11\n    timeout-minutes: 20")
    assert one(repo.problems(), "jobs.lint.container", "images come from matrix.yaml")


def test_a_typed_arch_list_is_caught(repo):
    repo.replace(PIPE, "    env:\n      # the cell's interpreter",
                 "    env:\n      TORCH_CUDA_ARCH_LIST: \"7.5;8.0;8.6;9.0;10.0;12.0+PTX\"\n"
                 "      # the cell's interpreter")
    assert one(repo.problems(), "(text)", "CUDA arch list '7.5;8.0;8.6;9.0;10.0;12.0+PTX'")


def test_a_matrix_typed_in_the_workflow_is_caught(repo):
    repo.replace(PIPE, "matrix: ${{ fromJSON(needs.matrix.outputs.matrix) }}",
                 "matrix:\n        include:\n          - {name: cpu, runner: ubuntu-24.04}")
    assert one(repo.problems(), "strategy.matrix", "matrix typed in the workflow")


def test_a_matrix_field_that_opforge_does_not_emit_is_caught(repo):
    repo.replace(PIPE, "name: ${{ matrix.artifact }}", "name: ${{ matrix.artefact }}")
    assert one(repo.problems(), "matrix.artefact is not a field")


def test_a_cell_job_fed_by_something_other_than_opforge_matrix_is_caught(repo):
    repo.replace(PIPE, "matrix: ${{ steps.matrix.outputs.matrix }}",
                 "matrix: ${{ steps.other.outputs.matrix }}")
    assert one(repo.problems(), "jobs.smoke.strategy.matrix",
               "not fed by an 'opforge matrix --github' step")


def test_build_cells_fed_by_something_other_than_opforge_matrix_are_caught(repo):
    # the build job's cells (a stable-ABI variant once per platform) are the matrix step's too
    repo.replace(PIPE, "builds: ${{ steps.matrix.outputs.builds }}",
                 "builds: ${{ steps.other.outputs.builds }}")
    assert one(repo.problems(), "jobs.build.strategy.matrix",
               "not fed by an 'opforge matrix --github' step")


def test_a_typed_python_on_a_cell_job_is_caught(repo):
    repo.replace(PIPE, "python-version: ${{ matrix.python }}", "python-version: \"3.12\"")
    assert one(repo.problems(), "jobs.build.steps", "python-version: ${{ matrix.python }}")


# --------------------------------------------------------------------------- every variant's path


def test_a_variant_whose_build_is_skipped_is_caught(repo):
    repo.replace(PIPE, "      - name: build\n        # a fresh",
                 "      - name: build\n        if: matrix.variant != 'mps'\n        # a fresh")
    problems = repo.problems()
    one(problems, "variant mps", "no step builds it", "(cell mps-macos-arm64-py3.10)")
    assert not [p for p in problems if "variant cpu:" in p]


def test_a_variant_skipped_only_on_pull_requests_is_caught(repo):
    repo.replace(PIPE, "      - name: smoke\n",
                 "      - name: smoke\n        if: github.event_name != 'pull_request' || "
                 "matrix.variant != 'cu126'\n")
    assert one(repo.problems(), "variant cu126", "on pull_request: no step runs opforge smoke")


def test_filtering_the_matrix_in_ci_drops_variants_and_is_caught(repo):
    repo.replace(PIPE, "opforge matrix --github ${{", "opforge matrix --variant cpu --github ${{")
    assert one(repo.problems(), "jobs.matrix", "'opforge matrix --variant cpu' drops cells")


def test_an_artifact_uploaded_under_another_name_is_caught(repo):
    repo.replace(PIPE, "name: ${{ matrix.artifact }}\n          path: dist",
                 "name: wheel-${{ matrix.variant }}\n          path: dist")
    assert one(repo.problems(), "variant cpu", "no step uploads artifact "
                                               "'wheel-cpu-linux-x86_64-py3.10'")


def test_a_smoke_test_of_another_wheel_is_caught(repo):
    repo.replace(PIPE, "opforge smoke --wheel wheelhouse/*.whl", "opforge smoke --wheel dist/*.whl")
    assert one(repo.problems(), "smokes --wheel dist/*.whl, not the wheel downloaded into "
                                "wheelhouse")


def test_smoking_in_the_build_job_is_caught(repo):
    # move the smoke job's download and smoke steps into the build job
    repo.replace(PIPE, "          if-no-files-found: error\n          retention-days: 14\n",
                 "          if-no-files-found: error\n          retention-days: 14\n"
                 "      - uses: actions/download-artifact@d3f86a106a0bac45b974a628896c90dbdf5c8093"
                 " # v4.3.0\n        with:\n          name: ${{ matrix.artifact }}\n"
                 "          path: wheelhouse\n"
                 "      - run: opforge smoke --wheel wheelhouse/x.whl --variant "
                 "${{ matrix.variant }} --device-checks skip\n")
    assert one(repo.problems(), "jobs.build smokes the wheel in the job that built it")


def test_device_checks_that_ignore_the_matrix_are_caught(repo):
    repo.replace(PIPE, "DEVICE_CHECKS: ${{ matrix.device_checks && 'auto' || 'skip' }}",
                 "DEVICE_CHECKS: auto")
    problem = one(repo.problems(), "variant mps", "--device-checks auto",
                  "device_checks: false")
    assert "reusable-build-smoke.yml" in problem


def test_device_checks_follow_a_maintainer_who_points_mps_at_real_hardware(repo):
    repo.replace(PIPE, "DEVICE_CHECKS: ${{ matrix.device_checks && 'auto' || 'skip' }}",
                 "DEVICE_CHECKS: skip")
    problems = repo.problems()
    one(problems, "variant cpu", "--device-checks skip", "device_checks: true")
    assert not [p for p in problems if "variant mps" in p]


def test_smoke_without_the_cells_variant_is_caught(repo):
    repo.replace(PIPE, 'smoke --wheel wheelhouse/*.whl --variant "$VARIANT"\n',
                 "smoke --wheel wheelhouse/*.whl --variant cpu\n")
    problems = repo.problems()
    one(problems, "variant cu130", "does not pass --variant cu130")
    assert not [p for p in problems if "variant cpu:" in p]


# --------------------------------------------------------------------------- sessions and commands


def test_an_unknown_nox_session_is_caught(repo):
    repo.replace(CI, "run: nox -s lint", "run: nox -s lnit")
    assert one(repo.problems(), "jobs.lint.steps", "nox session 'lnit' is not defined")


def test_a_session_removed_from_the_noxfile_is_caught(repo):
    repo.replace("noxfile.py", "@nox.session(venv_backend=opforge.nox.VENV_BACKEND)\ndef lint(",
                 "def lint(")
    assert one(repo.problems(), "ci.yml", "nox session 'lint' is not defined in noxfile.py")


def test_a_build_of_another_variant_than_the_cells_is_caught(repo):
    repo.replace(PIPE, '--variant "$VARIANT" --out', "--variant ${{ matrix.cuda }} --out")
    problems = repo.problems()
    one(problems, "variant cu130", "no step builds it")


@pytest.mark.parametrize("run, why", [
    ("pip install torch", "workflows install only nox, opforge"),
    ("make wheel", "is not a pip install of nox/opforge, a nox session or an opforge command"),
    ("nox -s lint && echo ok", "shell operator '&&'"),
    ("nox -s lint | tee log", "shell operator '|'"),
    ("opforge matrix > m.json", "shell operator '>'"),
    ("echo $(opforge matrix)", "command substitution"),
    ("FORCE_CUDA=1 nox -s lint", "set variables in env:"),
    ("python -c 'import opforge'", "Python only as 'python -m pip|nox|opforge'"),
    ("nox", "name the session"),
    ("nox -f other.py -s lint", "nox option -f is not allowed"),
    ("pip install --index-url https://example.org nox", "pip option '--index-url'"),
    ("pip uninstall nox", "only 'pip install'"),
])
def test_a_run_step_that_is_not_nox_or_opforge_is_caught(repo, run, why):
    repo.replace(CI, "run: nox -s lint", f"run: {run}")
    assert one(repo.problems(), "ci.yml:", "jobs.lint.steps", why)


def test_opforge_arguments_its_parser_refuses_are_caught(repo):
    repo.replace(PIPE, '--junit "reports/smoke-$CELL.xml"', '--junit-xml "reports/smoke-$CELL.xml"')
    assert one(repo.problems(), "jobs.smoke.steps", "unrecognized arguments: --junit-xml")


def test_an_unknown_opforge_command_is_caught(repo):
    repo.replace(CI, "run: nox -s lint", "run: opforge lint")
    assert one(repo.problems(), "'opforge lint' is not an opforge command")


def test_an_untrusted_input_expanded_inside_run_is_caught(repo):
    repo.replace(RBISECT, '--good "$GOOD"', "--good ${{ inputs.good }}")
    assert one(repo.problems(), "reusable-bisect.yml", "${{ inputs.good }} is expanded inside run:",
               "pass it through env:")


def test_a_shell_other_than_bash_is_caught(repo):
    repo.replace(CI, "      - run: nox -s lint", "      - shell: python\n        run: nox -s lint")
    assert one(repo.problems(), "shell 'python'")


# --------------------------------------------------------------------------- pins and hygiene


def test_an_action_pinned_to_a_tag_is_caught(repo):
    repo.replace(PIPE, UPLOAD_PIN, "actions/upload-artifact@v4")
    assert one(repo.problems(), "actions/upload-artifact@v4: pin third-party actions and workflows to a full "
                                "40-hex commit SHA (a tag or branch can be moved)")


def test_an_action_pinned_to_a_short_sha_is_caught(repo):
    repo.replace(PIPE, UPLOAD_PIN, "actions/upload-artifact@ea165f8 # v4.6.2")
    assert one(repo.problems(), "actions/upload-artifact@ea165f8: pin")


def test_a_pin_without_its_version_comment_is_caught(repo):
    repo.replace(PIPE, UPLOAD_PIN, UPLOAD_PIN.split(" #")[0])
    assert one(repo.problems(), "name the version it pins in a comment (# vX.Y.Z)")


def test_missing_top_level_permissions_are_caught(repo):
    repo.replace(NIGHTLY, "permissions:\n  contents: read\n", "")
    assert one(repo.problems(), "nightly.yml:1: permissions: missing top-level permissions")


@pytest.mark.parametrize("perms", ["permissions:\n  contents: write\n", "permissions: write-all\n"])
def test_permissions_above_read_are_caught(repo, perms):
    repo.replace(CI, "permissions:\n  contents: read\n", perms)
    assert one(repo.problems(), "ci.yml", "permissions")


def test_a_job_that_asks_for_write_permissions_is_caught(repo):
    repo.replace(CI, "    timeout-minutes: 20\n",
                 "    timeout-minutes: 20\n    permissions:\n      pull-requests: write\n")
    assert one(repo.problems(), "jobs.lint.permissions.pull-requests", "'write'")


def test_pull_request_target_is_caught(repo):
    repo.replace(CI, "  pull_request:\n", "  pull_request_target:\n")
    assert one(repo.problems(), "on.pull_request_target", "untrusted code")


def test_a_missing_concurrency_group_is_caught(repo):
    repo.replace(BISECT, "concurrency:\n  group: ${{ github.workflow }}-${{ inputs.variant }}"
                         "-${{ inputs.platform }}-${{ inputs.python }}\n  cancel-in-progress: true\n",
                 "")
    assert one(repo.problems(), "bisect.yml", "concurrency", "missing a concurrency group")


def test_concurrency_that_does_not_cancel_is_caught(repo):
    repo.replace(CI, "cancel-in-progress: true", "cancel-in-progress: false")
    assert one(repo.problems(), "ci.yml", "cancel-in-progress: true")


def test_a_job_without_a_timeout_is_caught(repo):
    repo.replace(PIPE, "    timeout-minutes: 45\n", "")
    assert one(repo.problems(), "reusable-build-smoke.yml", "jobs.smoke", "missing timeout-minutes")


def test_checkout_that_keeps_the_token_is_caught(repo):
    repo.replace(RBISECT, "        with:\n          persist-credentials: false\n", "")
    assert one(repo.problems(), "reusable-bisect.yml", "persist-credentials: false")


def test_a_cache_keyed_on_nothing_is_caught(repo):
    repo.replace(RNIGHTLY, "key: nightly-green-${{ matrix.name }}-${{ github.run_id }}\n",
                 "key: nightly-green\n")
    assert one(repo.problems(), "nightly.yml", "cache key 'nightly-green' is constant")


def test_a_pip_cache_without_its_dependency_files_is_caught(repo):
    repo.replace(CI, "          cache: pip\n          cache-dependency-path: pyproject.toml\n",
                 "          cache: pip\n")
    assert one(repo.problems(), "jobs.lint", "cache-dependency-path")


# --------------------------------------------------------------------------- bisect and nightly


def test_bisect_inputs_that_lose_a_variant_are_caught(repo):
    repo.replace(BISECT, "options: [cpu, cu126, cu128, cu130, mps, cpu_stable, mps_stable, cu130_stable]",
                 "options: [cpu, cu126]")
    assert one(repo.problems(), "inputs.variant", "differ from matrix.yaml's")


def test_a_new_variant_in_matrix_yaml_must_be_offered_by_bisect(repo):
    # the repository's own matrix.yaml, edited as its maintainer would: no projectkit matrix
    repo.replace("matrix.yaml", "  - name: mps\n", "  - name: cu129\n    platforms: [linux-x86_64]\n"
                 "    cuda: \"12.9\"\n    arch_list: \"8.0;9.0\"\n"
                 "    container: pytorch/manylinux2_28-builder:cuda12.9\n"
                 "    expected_keys: [CPU, CUDA, Meta, Autograd, AutocastCPU, AutocastCUDA]\n\n"
                 "  - name: mps\n")
    problems = repo.problems()
    one(problems, "bisect.yml", "inputs.variant", "cu129")
    # ci.yml needs no edit: the new variant's cells flow in through the matrix job
    assert not [p for p in problems if "ci.yml" in p]


def test_a_nightly_without_bisect_is_caught(repo):
    repo.replace(RNIGHTLY, '"$CELL_PYTHON" -m opforge bisect', '"$CELL_PYTHON" -m opforge smoke')
    assert one(repo.problems(), "reusable-nightly.yml", "no step runs opforge bisect")


def test_a_missing_workflow_is_caught(repo):
    repo.path(BISECT).unlink()
    assert one(repo.problems(), ".github/workflows/bisect.yml:0: (file): missing")


def test_a_workflow_that_is_not_yaml_is_caught(repo):
    repo.path(CI).write_text("jobs: [\n")
    assert one(repo.problems(), "ci.yml:", "(yaml)")


# --------------------------------------------------------------------------- the command line


def test_opforge_workflows_check_exit_codes(repo):
    cmd = [sys.executable, "-m", "opforge", "workflows", "check", "--root", str(repo.root)]
    ok = subprocess.run(cmd, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "opforge workflows check: ok (8 workflow(s))" in ok.stderr
    repo.replace(PIPE, UPLOAD_PIN, "actions/upload-artifact@v4")
    bad = subprocess.run(cmd, capture_output=True, text=True)
    assert bad.returncode == 1
    assert bad.stdout.startswith(".github/workflows/reusable-build-smoke.yml:")
    assert "1 problem(s) in 8 workflow(s)" in bad.stderr
    repo.replace("matrix.yaml", "pythons: [", "pythons: [\"2.7\", ")
    usage = subprocess.run(cmd, capture_output=True, text=True)
    assert usage.returncode == 2
    assert usage.stderr.startswith("opforge workflows: error: matrix.yaml:")
    assert "Traceback" not in usage.stderr and len(usage.stderr.splitlines()) == 1


def test_a_malformed_matrix_raises_a_usage_error(repo):
    repo.replace("matrix.yaml", "pythons: [", "pythons: [\"2.7\", ")
    with pytest.raises(MatrixError, match="unknown Python version '2.7'"):
        check_workflows(repo.root)
