"""opforge init on every extension style, read statically (no compiler): the four test
extensions under tests/adopt/styles/ (RegisterOperators with a library per backend, pybind11
modules, ops defined from Python over ctypes, stable ABI only), the module census of the smoke
probe on pure-Python stand-ins, and matrix.yaml's extension.modules."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from opforge.cli import main
from opforge.init import render_recipes
from opforge.matrix import parse_matrix
from opforge.scan import scan_extension
from opforge.stubs import stub_arguments

# the module census stand-ins run torch; `nox -s realtorch` collects this module without it
torch = pytest.importorskip("torch")

STYLES = Path(__file__).resolve().parent / "styles"
SRC = Path(__file__).resolve().parents[2] / "src"


def _copy(style: str, tmp_path: Path) -> Path:
    target = tmp_path / style
    shutil.copytree(STYLES / style, target)
    return target


def _init(project: Path, capsys) -> tuple[int, str, str]:
    code = main(["init", str(project), "--workflows-ref", "0" * 40])
    out, err = capsys.readouterr()
    return code, out, err


def _recipes(project: Path) -> dict:
    namespace: dict = {}
    exec(compile((project / "opforge_recipes.py").read_text(), "opforge_recipes.py", "exec"),
         namespace)
    return namespace


def test_register_operators_chain_with_a_library_per_backend(tmp_path, capsys):
    project = _copy("regops", tmp_path)
    scan = scan_extension(project)
    ops = scan.namespaces["regops"]
    assert list(ops) == ["segment_sum", "gather_rows", "cuda_version"]
    # a bare name: the schema is inferred from the C++ function, as torch infers it
    assert ops["segment_sum"].schema == "segment_sum(Tensor src, Tensor ptr) -> ..."
    assert ops["segment_sum"].inferred and not ops["gather_rows"].inferred
    assert ops["gather_rows"].schema == "gather_rows(Tensor src, Tensor index) -> Tensor"
    # what the per-device kernels it calls check: ptr is 1-D int64
    assert ops["segment_sum"].hints["ptr"] == {"rank": 1, "dtype": "int64"}
    # no dispatch key: a catch-all kernel, which serves every backend and autograd
    assert {"CPU", "CUDA", "Autograd"} <= ops["segment_sum"].keys
    libraries = {m.name: (m.backend, m.load, sorted(m.functions)) for m in scan.modules.values()}
    assert libraries == {
        "regops._segment_cpu": ("cpu", "library", ["cuda_version", "gather_rows", "segment_sum"]),
        "regops._segment_cuda": ("cuda", "library", ["cuda_version", "gather_rows", "segment_sum"])}

    code, out, err = _init(project, capsys)
    assert code == 0, err
    assert "csrc/segment.cpp: RegisterOperators: segment_sum, gather_rows, cuda_version" in err
    matrix = parse_matrix((project / "matrix.yaml").read_text(), project / "matrix.yaml")
    assert [v.name for v in matrix.variants] == ["cpu", "cu130"]
    cpu, cu = matrix.variants
    assert [m.name for m in matrix.extension.modules_for(cpu)] == ["regops._segment_cpu"]
    assert [m.name for m in matrix.extension.modules_for(cu)] == ["regops._segment_cpu",
                                                                  "regops._segment_cuda"]
    recipes = _recipes(project)["RECIPES"]
    args = recipes["segment_sum"]["inputs"](torch.float32)
    assert args[0].shape == (8, 8) and args[1].dtype == torch.int64 and args[1].dim() == 1
    assert recipes["segment_sum"]["stub"] is True
    assert recipes["cuda_version"]["inputs"](torch.float32) == []
    # a C++ catch-all kernel cannot run on fake tensors: the stub says why it skips them
    assert "fake" in recipes["segment_sum"]["skip"]


def test_pybind11_modules_named_from_setup_py_with_their_backend(tmp_path, capsys):
    project = _copy("pybops", tmp_path)
    scan = scan_extension(project)
    assert not any(scan.namespaces.values())
    modules = {m.name: (m.backend, m.load, list(m.functions)) for m in scan.modules.values()}
    # TORCH_EXTENSION_NAME is the name= of the extension whose sources hold the file; the
    # one built only from .cu sources is the CUDA module
    assert modules == {"pybops._ext_cpu": ("cpu", "import", ["pairwise_iou", "count_above"]),
                       "pybops._ext_cuda": ("cuda", "import", ["pairwise_iou"])}
    cpu = scan.modules["pybops._ext_cpu"]
    assert cpu.functions["count_above"] == "Tensor scores, float threshold=0.5"
    assert cpu.hints["pairwise_iou"]["boxes1"] == {"rank": 2, "sizes": {1: 4}}

    code, _out, err = _init(project, capsys)
    assert code == 0, err
    assert "PYBIND11_MODULE(TORCH_EXTENSION_NAME) = pybops._ext_cuda (cuda): pairwise_iou" in err
    matrix = parse_matrix((project / "matrix.yaml").read_text(), project / "matrix.yaml")
    assert matrix.extension.op_specs == () and matrix.extension.namespace == "pybops"
    assert [v.name for v in matrix.variants] == ["cpu", "cu130"]
    functions = _recipes(project)["FUNCTIONS"]
    assert set(functions) == {"pybops._ext_cpu.pairwise_iou", "pybops._ext_cpu.count_above",
                              "pybops._ext_cuda.pairwise_iou"}
    boxes = functions["pybops._ext_cpu.pairwise_iou"]["inputs"](torch.float32)
    assert [tuple(b.shape) for b in boxes] == [(8, 4), (8, 4)]
    assert functions["pybops._ext_cuda.pairwise_iou"]["devices"] == ["cuda"]
    assert functions["pybops._ext_cpu.count_above"]["inputs"](torch.float32)[1] == 0.5


def test_python_registrations_over_a_ctypes_library(tmp_path, capsys):
    project = _copy("ctops", tmp_path)
    scan = scan_extension(project)
    ops = scan.namespaces["ctops"]
    # define(name, schema): the schema is the second argument
    assert ops["saxpy"].schema == "saxpy(Tensor x, Tensor y, float a) -> Tensor"
    # register_kernel with a tuple of device types
    assert {"CPU", "CUDA", "MPS", "Meta", "Autograd"} <= ops["saxpy"].keys
    assert ops["clamp_"].keys == {"CPU", "Meta"} and ops["clamp_"].mutating
    assert not scan.modules  # the native library is no torch extension: nothing to import
    code, _out, err = _init(project, capsys)
    assert code == 0, err
    assert "ctops/_ops.py: register_kernel: ctops::saxpy, ctops::clamp_" in err
    recipes = _recipes(project)["RECIPES"]
    assert recipes["clamp_"]["mutates"] == [0]
    assert "skip" not in recipes["saxpy"]  # it has a fake kernel: fake and compile run


def test_stable_abi_only_extension_gets_a_stable_matrix(tmp_path, capsys):
    project = _copy("stabops", tmp_path)
    scan = scan_extension(project)
    assert scan.stable_only and scan.torch_floor == "2.10"
    assert scan.namespaces["stabops"]["row_sum"].hints == {"x": {"rank": 2, "dtype": "float32"}}
    code, _out, err = _init(project, capsys)
    assert code == 0, err
    matrix = parse_matrix((project / "matrix.yaml").read_text(), project / "matrix.yaml")
    assert matrix.extension.abi == "stable" and matrix.extension.torch_floor == "2.10"


def test_what_cannot_be_read_is_named_with_what_to_write(tmp_path, capsys):
    project = tmp_path / "dyn"
    (project / "dyn" / "csrc").mkdir(parents=True)
    (project / "dyn" / "__init__.py").write_text("")
    (project / "setup.py").write_text(textwrap.dedent('''
        from setuptools import setup
        from torch.utils.cpp_extension import CppExtension
        setup(name="dyn", ext_modules=[CppExtension(f"dyn._{n}", ["dyn/csrc/b.cpp"])
                                       for n in ("a",)])
    '''))
    (project / "dyn" / "csrc" / "b.cpp").write_text(
        'PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("f", &f); }\n')
    code, _out, err = _init(project, capsys)
    assert code == 2 and "Traceback" not in err
    assert "setup.py:4: CppExtension(f'dyn._{n}', ...) names its module at build time" in err
    assert "dyn/csrc/b.cpp: PYBIND11_MODULE(TORCH_EXTENSION_NAME) is compiled by no extension" \
        in err and "extension.modules" in err
    assert not (project / "matrix.yaml").exists()


@pytest.mark.parametrize("schema, want", [
    ("f(Tensor x, *, int k=3, bool flag=False) -> Tensor", ["T8x8", 3, False]),
    ("f(Tensor? bias=None, int[2] size, float eps=1e-5, str mode=\"mean\") -> Tensor",
     [None, [1, 1], 1e-5, "mean"]),
    ("f(Tensor[] xs, Scalar s) -> Tensor", ["list", 1.0]),
])
def test_stub_arguments_follow_the_schema(schema, want):
    exprs, _ = stub_arguments(schema)
    values = [eval(e, {"torch": torch, "dtype": torch.float32}) for e in exprs]  # noqa: S307
    for value, expected in zip(values, want):
        if expected == "T8x8":
            assert isinstance(value, torch.Tensor) and value.shape == (8, 8)
        elif expected == "list":
            assert isinstance(value, list) and len(value) == 2
        else:
            assert value == expected


def test_an_unknown_argument_type_leaves_a_commented_recipe(tmp_path):
    project = tmp_path / "odd"
    (project / "odd").mkdir(parents=True)
    (project / "odd" / "__init__.py").write_text(
        'import torch\ntorch.library.define("odd::f", "(Tensor x, Dimname d) -> Tensor")\n')
    (project / "setup.py").write_text('from setuptools import setup\nsetup(name="odd")\n')
    text = render_recipes(scan_extension(project))
    assert '# "f": {"inputs"' in text and "# f(Tensor x, Dimname d) -> Tensor" in text


# the two matrices below stay hand-written (not tests/projectkit.py): the matrix parser's own
# messages on this exact YAML are the subject
@pytest.mark.parametrize("modules, message", [
    ("{pkg._C: {backend: gpu}}", "matrix.yaml:9: extension.modules.pkg._C.backend: 'gpu' is "
                                 "not one of cpu, cuda, mps"),
    ("{pkg._C: {load: dlopen}}", "matrix.yaml:9: extension.modules.pkg._C.load: 'dlopen' is "
                                 "not one of import, library"),
    ("{pkg._C: {functions: [a-b]}}", "extension.modules.pkg._C.functions[0]"),
    ("{1pkg: {}}", "extension.modules.1pkg: '1pkg' is not a dotted import name"),
    ("[pkg._C]", "extension.modules: expected a mapping"),
])
def test_bad_modules_are_one_line_with_file_line_and_key(tmp_path, capsys, modules, message):
    text = textwrap.dedent(f"""\
        extension:
          path: .
          package: pkg
          namespace: pkg
          modules: {modules}
        torch: {{channel: stable, version: "2.13.0"}}
        pythons: ["3.11"]
        platforms: {{linux-x86_64: {{runner: ubuntu-24.04}}}}
        variants: [{{name: cpu, platforms: [linux-x86_64], expected_keys: [CPU]}}]
    """).replace("          modules: " + modules, "\n" * 0 + "          modules: " + modules)
    path = tmp_path / "matrix.yaml"
    path.write_text(text)
    code = main(["matrix", "--file", str(path)])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert message.split(": ", 1)[-1] in err and len(err.strip().splitlines()) == 1, err


def test_a_matrix_needs_ops_or_modules(tmp_path, capsys):
    path = tmp_path / "matrix.yaml"
    path.write_text(textwrap.dedent("""\
        extension: {path: ., package: pkg, namespace: pkg}
        torch: {channel: stable, version: "2.13.0"}
        pythons: ["3.11"]
        platforms: {linux-x86_64: {runner: ubuntu-24.04}}
        variants: [{name: cpu, platforms: [linux-x86_64], expected_keys: [CPU]}]
    """))
    assert main(["matrix", "--file", str(path)]) == 2
    assert "extension.ops: required key missing" in capsys.readouterr().err


# --------------------------------------------------------------------------- the module census

FAKE = {
    "fakepkg/__init__.py": """
        from . import _ext_cpu
        try:  # swallowed, as mmcv does: the package imports without its CUDA module
            from . import _ext_cuda
        except ImportError:
            _ext_cuda = None
        from .ops import pairwise
    """,
    "fakepkg/_ext_cpu.py": """
        def pairwise(a, b):
            return a @ b.T
    """,
    "fakepkg/_ext_cuda.py": """
        raise ImportError("libcudart.so.13: cannot open shared object file")
    """,
    "fakepkg/ops.py": """
        from . import _ext_cpu

        _IMPLS = {"cpu": _ext_cpu.pairwise}

        def pairwise(a, b):
            impl = _IMPLS.get(a.device.type)
            if impl is None:
                raise RuntimeError(f"pairwise: implementation for device {a.device} not found")
            return impl(a, b)
    """,
    "recipes.py": """
        import torch

        FUNCTIONS = {
            "fakepkg._ext_cpu.pairwise": {
                "inputs": lambda dtype: [torch.rand(3, 2), torch.rand(4, 2)], "stub": True},
            "fakepkg.ops.pairwise": {
                "inputs": lambda dtype: [torch.rand(3, 2), torch.rand(4, 2)],
                "devices": ["cpu", "meta"]},
        }
        RECIPES = {}
    """,
}


def _probe(tmp_path: Path, modules: list[dict]) -> dict:
    for name, text in FAKE.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())
    spec = {"op_keys": {}, "default_keys": ["CPU"], "modules": modules,
            "recipes": str(tmp_path / "recipes.py")}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{SRC}"}
    subprocess.run([sys.executable, "-c", "import sys; from opforge.smoke.probe.main import "
                    "main; sys.exit(main())", "--package", "fakepkg", "--namespace", "fakepkg",
                    "--spec", str(tmp_path / "spec.json"), "--out", str(tmp_path / "out.json")],
                   env=env, cwd=tmp_path, timeout=300, check=False)
    return json.loads((tmp_path / "out.json").read_text())


@pytest.fixture(scope="module")
def census(tmp_path_factory) -> dict:
    """One probe run over the stand-in package (a probe imports torch: seconds each)."""
    root = tmp_path_factory.mktemp("fakepkg")
    (root / "fakepkg").mkdir()
    (root / "fakepkg" / "_ext_extra.py").write_text("def pairwise(a, b):\n    return a\n")
    return _probe(root, [
        {"name": "fakepkg._ext_cpu", "backend": "cpu", "load": "import",
         "functions": ["pairwise"]},
        {"name": "fakepkg._ext_cuda", "backend": "cuda", "load": "import",
         "functions": ["pairwise"]},
        {"name": "fakepkg._ext_mps", "backend": "mps", "load": "import", "functions": ["f"]},
        {"name": "fakepkg._ext_extra", "backend": "cpu", "load": "import",
         "functions": ["pairwise", "nms"]},
        {"name": "fakepkg._segment_cuda", "backend": "cuda", "load": "library",
         "functions": ["segment_sum"]}])


def test_a_promised_module_the_package_swallows_fails_with_its_import_error(census):
    doc = census
    checks = {c["id"]: c for c in doc["checks"]}
    assert checks["import"]["status"] == "pass"  # the package itself imports fine
    assert checks["module:fakepkg._ext_cpu"]["status"] == "pass"
    cuda = checks["module:fakepkg._ext_cuda"]
    assert cuda["status"] == "fail"
    assert "fakepkg._ext_cuda (cuda module" in cuda["message"]
    assert "libcudart.so.13: cannot open shared object file" in cuda["message"]
    assert "the file is there" in cuda["message"] and "catches ImportError" in cuda["message"]
    mps = checks["module:fakepkg._ext_mps"]["message"]
    assert "No module named 'fakepkg._ext_mps'" in mps and "was not built" in mps
    table = {row["module"]: row for row in doc["modules"]}
    assert table["fakepkg._ext_cpu"]["functions"] == {"pairwise": "ok"}
    assert table["fakepkg._ext_cuda"]["functions"] == {"pairwise": "missing"}
    assert doc["summary"]["status"] == "fail"


def test_a_missing_per_backend_library_fails_by_name(census):
    check = next(c for c in census["checks"] if c["id"] == "module:fakepkg._segment_cuda")
    assert check["status"] == "fail"
    assert "fakepkg._segment_cuda (cuda library" in check["message"]
    assert "is not in the wheel" in check["message"]


def test_function_recipes_run_per_device_and_stubs_are_named(census):
    checks = {c["id"]: c for c in census["checks"]}
    assert checks["call:fakepkg._ext_cpu.pairwise:cpu"]["status"] == "pass"
    assert checks["stub:fakepkg._ext_cpu.pairwise"]["status"] == "warn"
    assert "stub:fakepkg.ops.pairwise" not in checks
    assert checks["call:fakepkg.ops.pairwise:cpu"]["status"] == "pass"
    # not a device the probe uses: skipped, with why
    assert checks["call:fakepkg.ops.pairwise:meta"]["status"] == "skip"


def test_a_module_missing_a_function_fails_naming_what_it_exports(census):
    check = next(c for c in census["checks"] if c["id"] == "module:fakepkg._ext_extra")
    assert check["status"] == "fail"
    assert "does not export nms (it exports: pairwise)" in check["message"]


def test_the_written_matrix_of_every_style_is_valid_yaml(tmp_path, capsys):
    for style in ("regops", "pybops", "ctops", "stabops"):
        project = _copy(style, tmp_path)
        assert _init(project, capsys)[0] == 0
        assert yaml.safe_load((project / "matrix.yaml").read_text())["extension"]
