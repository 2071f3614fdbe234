"""opforge init: what it reads from an extension's sources, and how it writes (all or none)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from projectkit import write_tree

from opforge.cli import main
from opforge.matrix import load_matrix
from opforge.scan import scan_extension


@pytest.fixture(autouse=True)
def released_opforge(monkeypatch):
    """These tests run init as a release of opforge would (its commit stamped): a development
    checkout refuses to pin the workflows without --workflows-ref (tests/publish)."""
    from opforge import _release

    monkeypatch.setattr(_release, "WORKFLOWS_COMMIT", "f" * 40)


CXX = {
    "pyproject.toml": """
        [build-system]
        requires = ["setuptools", "torch"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "My-Ops"
        version = "1.0"
    """,
    "my_ops/__init__.py": """
        import torch

        @torch.library.register_fake("myops::gather_rows")
        def _(x, idx):
            return x.new_empty(idx.shape[0], x.shape[1])

        torch.library.register_autograd("myops::gather_rows", lambda ctx, g: (g, None))
        torch.library.register_autocast("myops::gather_rows", "cuda", torch.float32)
        torch.library.register_kernel("myops::fill_", "cpu", lambda x, v: x.fill_(v))
    """,
    "csrc/schema.cpp": """
        #include <torch/library.h>
        // TORCH_LIBRARY(commented, m) { m.def("ghost(Tensor x) -> Tensor"); }
        TORCH_LIBRARY(myops, m) {
          m.def("gather_rows(Tensor x, Tensor idx) -> Tensor");
          m.def(TORCH_SELECTIVE_SCHEMA("myops::fill_(Tensor(a!) x, float v) -> Tensor(a!)"));
          m.def("gather_rows_backward(Tensor grad, Tensor idx, int n) "
                "-> Tensor");
        }
    """,
    "csrc/cpu/kernels.cpp": """
        TORCH_LIBRARY_IMPL(myops, CPU, m) {
          m.impl("gather_rows", &gather_rows_cpu);
          m.impl(TORCH_SELECTIVE_NAME("myops::gather_rows_backward"), &backward_cpu);
        }
    """,
    "csrc/cuda/kernels.cu": """
        TORCH_LIBRARY_IMPL(myops, CUDA, m) {
          m.impl("gather_rows", &gather_rows_cuda);
          m.impl("gather_rows_backward", &backward_cuda);
        }
    """,
    "csrc/stable.cpp": """
        STABLE_TORCH_LIBRARY_FRAGMENT(myops, m) { m.def("stable_op(Tensor x) -> Tensor"); }
        STABLE_TORCH_LIBRARY_IMPL(myops, CompositeExplicitAutograd, m) {
          m.impl("stable_op", &stable_op);
        }
    """,
}


def test_scan_reads_cxx_schemas_impl_blocks_and_python_registrations(tmp_path):
    scan = scan_extension(write_tree(tmp_path, CXX))
    assert (scan.distribution, scan.package) == ("My-Ops", "my_ops")
    ops = scan.namespaces["myops"]
    assert set(ops) == {"gather_rows", "fill_", "gather_rows_backward", "stable_op"}
    assert "commented" not in scan.namespaces  # comments are not code
    assert ops["gather_rows"].keys == {"CPU", "CUDA", "Meta", "Autograd", "AutocastCUDA"}
    assert ops["fill_"].mutating and ops["fill_"].keys == {"CPU"}
    assert ops["gather_rows_backward"].schema.endswith("-> Tensor")  # adjacent literals joined
    assert ops["gather_rows_backward"].backward_only
    assert ops["stable_op"].keys == {"CPU", "CUDA", "MPS"}
    assert scan.has_cuda and not scan.has_mps


def test_init_writes_a_matrix_that_loads_and_describes_each_op(tmp_path, capsys):
    root = write_tree(tmp_path / "ext", CXX)
    assert main(["init", str(root), "--torch", "2.13.0"]) == 0
    matrix = load_matrix(root / "matrix.yaml")
    assert matrix.extension.namespace == "myops" and matrix.extension.package == "my_ops"
    assert matrix.extension.distribution == "My-Ops"
    assert [v.name for v in matrix.variants] == ["cpu", "cu130"]
    cpu, cu = (matrix.extension.op_keys(matrix.variant(v)) for v in ("cpu", "cu130"))
    assert cpu["gather_rows"] == ("CPU", "Meta", "Autograd")
    assert cu["gather_rows"] == ("CPU", "CUDA", "Meta", "Autograd", "AutocastCUDA")
    assert cpu["fill_"] == ("CPU",) and cu["fill_"] == ("CPU",)   # only a CPU kernel
    assert cu["gather_rows_backward"] == ("CPU", "CUDA")           # backward-only, no Meta
    assert "gather_rows_backward" in matrix.extension.internal_ops
    recipes = (root / "opforge_recipes.py").read_text()
    assert "# gather_rows(Tensor x, Tensor idx) -> Tensor" in recipes
    compile(recipes, "opforge_recipes.py", "exec")
    noxfile = (root / "noxfile.py").read_text()
    assert "import opforge.nox" in noxfile and 'opforge.nox.sessions("matrix.yaml")' in noxfile
    assert yaml.safe_load((root / "matrix.yaml").read_text())["extension"]["recipes"] == \
        "opforge_recipes.py"
    # callers of opforge's reusable workflows, pinned by commit, installing a pinned opforge
    workflows = root / ".github" / "workflows"
    assert sorted(p.name for p in workflows.iterdir()) == ["opforge-bisect.yml",
                                                          "opforge-ci.yml", "opforge-nightly.yml"]
    for name, called in (("opforge-ci.yml", "reusable-build-smoke.yml"),
                         ("opforge-nightly.yml", "reusable-nightly.yml"),
                         ("opforge-bisect.yml", "reusable-bisect.yml")):
        job = next(iter(yaml.safe_load((workflows / name).read_text())["jobs"].values()))
        path, ref = job["uses"].split("@")
        assert path == f"opforge/opforge/.github/workflows/{called}"
        assert re.fullmatch(r"[0-9a-f]{40}", ref), job["uses"]
        assert job["with"]["matrix-file"] == "matrix.yaml"
        assert job["with"]["opforge"] != "." and "opforge" in job["with"]["opforge"]
    assert main(["workflows", "check", "--root", str(root)]) == 0


def test_init_writes_all_files_or_none_and_never_overwrites(tmp_path, capsys):
    root = write_tree(tmp_path / "ext", CXX)
    (root / "noxfile.py").write_text("# the user's own\n")
    assert main(["init", str(root)]) == 2
    err = capsys.readouterr().err
    assert "would overwrite" in err and "noxfile.py" in err and err.count("\n") == 1
    assert not (root / "matrix.yaml").exists() and not (root / "opforge_recipes.py").exists()
    assert (root / "noxfile.py").read_text() == "# the user's own\n"
    assert main(["init", str(root), "--force"]) == 0
    assert "opforge.nox" in (root / "noxfile.py").read_text()
    # a workflow of the same name is the user's too: refused, nothing else written
    other = write_tree(tmp_path / "other", CXX)
    mine = other / ".github" / "workflows" / "opforge-ci.yml"
    mine.parent.mkdir(parents=True)
    mine.write_text("# mine\n")
    assert main(["init", str(other)]) == 2
    assert "opforge-ci.yml" in capsys.readouterr().err
    assert mine.read_text() == "# mine\n" and not (other / "matrix.yaml").exists()
    assert sorted(p.name for p in mine.parent.iterdir()) == ["opforge-ci.yml"]


@pytest.mark.parametrize("ref", ["v0.1.0", "main", "d2d79df", "D" * 40, "g" * 40])
def test_workflows_ref_must_be_a_full_commit(tmp_path, capsys, ref):
    root = write_tree(tmp_path / "ext", CXX)
    assert main(["init", str(root), "--workflows-ref", ref]) == 2
    err = capsys.readouterr().err
    assert "full 40-hex commit" in err and err.count("\n") == 1
    assert sorted(p.name for p in root.iterdir()) == ["csrc", "my_ops", "pyproject.toml"]


def test_workflows_ref_pins_the_callers_and_the_release(tmp_path, capsys):
    from opforge import __version__

    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    root = write_tree(repo / "python" / "ext", CXX)   # the extension in a subdirectory
    assert main(["init", str(root), "--workflows-ref", "c" * 40]) == 0
    assert not (root / ".github").exists()          # workflows live at the repository's top
    ci = (repo / ".github" / "workflows" / "opforge-ci.yml").read_text()
    assert f"reusable-build-smoke.yml@{'c' * 40} # v{__version__}\n" in ci
    job = yaml.safe_load(ci)["jobs"]["wheels"]
    assert job["with"] == {"opforge": f"opforge=={__version__}",
                           "matrix-file": "python/ext/matrix.yaml"}


def test_dry_run_prints_and_writes_nothing(tmp_path, capsys):
    root = write_tree(tmp_path / "ext", CXX)
    before = sorted(p.name for p in root.iterdir())
    assert main(["init", str(root), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"--- {root / 'matrix.yaml'} ---" in out and "namespace: myops" in out
    assert "opforge-nightly.yml ---" in out and "reusable-nightly.yml@" in out
    assert sorted(p.name for p in root.iterdir()) == before


def test_a_directory_without_an_extension_is_one_line_exit_2(tmp_path, capsys):
    write_tree(tmp_path / "plain", {"pyproject.toml": "[project]\nname = 'plain'\n",
                                  "plain/__init__.py": "x = 1\n"})
    assert main(["init", str(tmp_path / "plain")]) == 2
    err = capsys.readouterr().err
    assert "no op extension in" in err and "TORCH_LIBRARY" in err and err.count("\n") == 1
    assert not (tmp_path / "plain" / "matrix.yaml").exists()
    assert main(["init", str(tmp_path / "missing")]) == 2
    assert "no such directory" in capsys.readouterr().err


def test_python_library_objects_and_custom_ops(tmp_path):
    scan = scan_extension(write_tree(tmp_path, {
        "setup.py": "from setuptools import setup\nsetup(name='lib-ops')\n",
        "lib_ops/__init__.py": """
            import torch
            from torch.library import Library, custom_op

            lib = Library("libops", "DEF")
            lib.define("twice(Tensor x) -> Tensor")
            lib.impl("twice", lambda x: x * 2, "CPU")

            @custom_op("libops::only_cuda", mutates_args=(), device_types="cuda")
            def only_cuda(x: torch.Tensor) -> torch.Tensor:
                return x

            @custom_op("libops::inplace", mutates_args=("x",))
            def inplace(x: torch.Tensor) -> None:
                x.zero_()
        """}))
    assert scan.distribution == "lib-ops" and scan.package == "lib_ops"
    ops = scan.namespaces["libops"]
    assert ops["twice"].keys == {"CPU"} and ops["twice"].schema == "twice(Tensor x) -> Tensor"
    assert ops["only_cuda"].keys == {"CUDA", "Meta", "Autograd"}
    assert ops["inplace"].mutating and "CPU" in ops["inplace"].keys


def test_the_written_noxfile_registers_the_matrix_sessions(tmp_path):
    """The three-line noxfile: build_<variant> for each variant, smoke, matrix, bisect."""
    import os
    import subprocess
    import sys

    import opforge

    root = write_tree(tmp_path / "ext", CXX)
    assert main(["init", str(root)]) == 0
    src = str(Path(opforge.__file__).resolve().parent.parent)
    listed = subprocess.run([sys.executable, "-m", "nox", "-l", "--script-mode", "none"],
                            cwd=root, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONPATH": src})
    assert listed.returncode == 0, listed.stderr
    names = {line.split()[1] for line in listed.stdout.splitlines() if line.startswith("* ")}
    assert names == {"build_cpu", "build_cu130", "smoke", "bench", "matrix", "bisect"}


def test_the_release_stamp_is_empty_or_a_full_commit_and_wins_over_the_checkout(monkeypatch):
    """A release ships the commit it was cut from (opforge/_release.py); init pins to it and
    installs that release, not the checkout's commit."""
    from opforge import __version__, _release, init

    assert _release.WORKFLOWS_COMMIT == "" or re.fullmatch(r"[0-9a-f]{40}",
                                                           _release.WORKFLOWS_COMMIT)
    monkeypatch.setattr(_release, "WORKFLOWS_COMMIT", "e" * 40)
    pin = init.workflows_pin()
    assert (pin.commit, pin.opforge) == ("e" * 40, f"opforge=={__version__}")
