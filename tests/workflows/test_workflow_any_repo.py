"""`opforge workflows check` on a repository that is not opforge: an extension whose callers
`opforge init` wrote. Each test breaks one thing a maintainer could get wrong and asserts the
file:line problem; the callers init writes pass as written."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from projectkit import write_tree
from test_workflow_drift import CI, PIPE, one

from opforge.cli import main
from opforge.cli.commands import check_repository

WF = ".github/workflows/"
PIN = "@" + "a" * 40


@pytest.fixture
def ext(tmp_path: Path, capsys) -> Path:
    root = write_tree(tmp_path / "ext", {
        "pyproject.toml": """
            [build-system]
            requires = ["setuptools", "torch"]
            build-backend = "setuptools.build_meta"
            [project]
            name = "Demo-Ops"
            version = "0.1"
        """,
        "csrc/ops.cpp": """
            #include <torch/library.h>
            TORCH_LIBRARY(demo, m) { m.def("twice(Tensor x) -> Tensor"); }
            TORCH_LIBRARY_IMPL(demo, CPU, m) { m.impl("twice", &twice_cpu); }
        """,
        "csrc/ops.cu": "TORCH_LIBRARY_IMPL(demo, CUDA, m) { m.impl(\"twice\", &twice_cuda); }\n",
        "demo_ops/__init__.py": "",
    })
    (root / ".git").mkdir()  # the repository's top: init writes the workflows here
    assert main(["init", str(root), "--workflows-ref", PIN[1:]]) == 0
    capsys.readouterr()
    return root


def edit(root: Path, rel: str, old: str, new: str) -> None:
    path = root / rel
    text = path.read_text()
    assert old in text, f"{old!r} is not in {rel}"
    path.write_text(text.replace(old, new, 1))


def problems(root: Path, every: bool = False) -> list[str]:
    return check_repository(root, every=every).problems


def test_the_callers_init_writes_pass_and_are_pinned(ext):
    result = check_repository(ext)
    assert result.problems == []
    assert result.checked == [WF + n for n in ("opforge-bisect.yml", "opforge-ci.yml",
                                               "opforge-nightly.yml")]
    ci = (ext / WF / "opforge-ci.yml").read_text()
    assert f"opforge/opforge/.github/workflows/reusable-build-smoke.yml{PIN} # v" in ci
    assert 'opforge: "opforge==' in ci and "pip install ." not in ci
    bisect = (ext / WF / "opforge-bisect.yml").read_text()
    assert 'options: ["cpu", "cu130"]' in bisect  # the variants init found


def test_a_reusable_workflow_called_by_tag_or_branch_is_caught(ext):
    edit(ext, WF + "opforge-ci.yml", PIN, "@v0.1.0")
    problem = one(problems(ext), "reusable-build-smoke.yml@v0.1.0", "40-hex commit SHA")
    assert problem.startswith(WF + "opforge-ci.yml:22: jobs.wheels:"), problem


@pytest.mark.parametrize("spec, why", [
    (".", "installs this repository (demo-ops), not opforge"),
    ("./", "installs this repository"),
    ("opforge", "opforge is not pinned"),
    ("opforge>=0.1", "opforge is not pinned"),
])
def test_opforge_installed_from_the_repository_or_unpinned_is_caught(ext, spec, why):
    text = (ext / WF / "opforge-nightly.yml").read_text()
    old = next(line for line in text.splitlines() if "opforge: " in line)
    edit(ext, WF + "opforge-nightly.yml", old, f"      opforge: \"{spec}\"")
    assert one(problems(ext), "opforge-nightly.yml:", "jobs.canary.with.opforge", why)


def test_pip_install_dot_in_a_users_own_workflow_is_caught(ext):
    (ext / WF / "smoke.yml").write_text(textwrap.dedent("""\
        name: smoke
        on: [push]
        permissions:
          contents: read
        concurrency:
          group: ${{ github.workflow }}
          cancel-in-progress: true
        jobs:
          smoke:
            runs-on: ubuntu-24.04
            timeout-minutes: 30
            steps:
              - uses: actions/checkout@v4
              - run: python -m pip install .
              - run: opforge smoke --variant cpu
        """))
    found = problems(ext)
    one(found, "smoke.yml:13:", "actions/checkout@v4", "40-hex commit SHA")
    one(found, "smoke.yml:14:", "pip install '.' installs this repository (demo-ops)")


def test_secrets_inherit_is_caught(ext):
    edit(ext, WF + "opforge-ci.yml", "    with:\n", "    secrets: inherit\n    with:\n")
    assert one(problems(ext), "jobs.wheels.secrets", "hands every secret")


def test_a_bisect_caller_whose_choices_drift_from_the_matrix_is_caught(ext):
    edit(ext, WF + "opforge-bisect.yml", 'options: ["cpu", "cu130"]', 'options: ["cpu"]')
    assert one(problems(ext), "opforge-bisect.yml:", "inputs.variant", "differ from matrix.yaml's")


def test_a_workflow_that_does_not_use_opforge_is_left_alone_unless_all(ext):
    (ext / WF / "docs.yml").write_text("name: docs\non: [push]\njobs:\n  d:\n"
                                       "    runs-on: ubuntu-24.04\n    steps:\n"
                                       "      - uses: actions/checkout@v4\n")
    result = check_repository(ext)
    assert result.problems == [] and result.skipped == [WF + "docs.yml"]
    one(problems(ext, every=True), "docs.yml:7:", "actions/checkout@v4")


def test_the_callers_without_a_matrix_are_caught(ext):
    (ext / "matrix.yaml").unlink()
    assert one(problems(ext), "matrix.yaml:0: (file): missing")


# --------------------------------------------------------------------------- opforge's own callers


def test_ci_passing_an_input_the_pipeline_does_not_declare_is_caught(repo):
    repo.replace(CI, "      opforge: .", "      opforge: .\n      variantz: cpu")
    assert one(repo.problems(), "ci.yml:", "jobs.wheels.with.variantz",
               "reusable-build-smoke.yml has no input 'variantz'")


def test_ci_that_filters_the_pipelines_variants_is_caught(repo):
    repo.replace(CI, "      opforge: .", "      opforge: .\n      variants: cpu")
    problem = one(repo.problems(), "ci.yml:", "jobs.wheels (calls .github/workflows/"
                                              "reusable-build-smoke.yml)", "drops cells")
    assert "--variant cpu" in problem


def test_a_pipeline_default_that_is_not_this_release_is_caught(repo):
    repo.replace(PIPE, "default: opforge==", "default: opforge>=")
    assert one(repo.problems(), "reusable-build-smoke.yml:", "on.workflow_call.inputs.opforge",
               "the default must be this release")


def test_concurrency_in_a_reusable_workflow_is_caught(repo):
    repo.replace(PIPE, "\npermissions:\n", "\nconcurrency:\n  group: ${{ github.workflow }}\n"
                 "  cancel-in-progress: true\n\npermissions:\n")
    assert one(repo.problems(), "reusable-build-smoke.yml:", "its caller's group")


def test_a_local_call_of_a_missing_workflow_is_caught(repo):
    repo.replace(CI, "uses: ./.github/workflows/reusable-build-smoke.yml",
                 "uses: ./.github/workflows/reusable-build.yml")
    assert one(repo.problems(), "ci.yml:", "reusable-build.yml: no such workflow")
