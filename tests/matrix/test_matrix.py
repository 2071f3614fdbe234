"""matrix.yaml: parsing into typed objects, validation errors, CLI output (golden files)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from opforge.cli import main
from opforge.matrix import MatrixError, load_matrix, parse_matrix

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden"
# the matrix these tests expand: kept with them, so the repository's own variants can change
FIXTURE = Path(__file__).parent / "fixtures" / "matrix.yaml"
DEFAULT = FIXTURE.read_text()
# The shipped op list, as written: the cases below replace this line (a new op needs no edit here).
OPS_LINE = next(line for line in DEFAULT.splitlines() if line.startswith("  ops: ["))


def test_default_matrix_has_the_shipped_variants():
    matrix = load_matrix(FIXTURE)
    assert [v.name for v in matrix.variants] == ["cpu", "cu126", "cu128", "cu130", "mps",
                                                 "cpu_stable", "mps_stable", "cu130_stable"]
    cpu = matrix.variant("cpu")
    assert cpu.platforms == ("linux-x86_64", "linux-aarch64", "macos-arm64")
    assert cpu.expected_keys == ("CPU", "Meta", "Autograd", "AutocastCPU")
    cu130 = matrix.variant("cu130")
    assert cu130.toolkit == "13.0" and "CUDA" in cu130.expected_keys
    assert cu130.backends == ("cpu", "cuda")
    assert matrix.variant("mps").backends == ("cpu", "mps")
    assert matrix.variant("mps").backend_keys == ("CPU", "MPS", "Meta")
    written = OPS_LINE.split("[", 1)[1].split("]", 1)[0]
    assert matrix.extension.ops == tuple(name.strip() for name in written.split(","))
    assert {"nms", "roi_align", "deform_conv2d"} <= set(matrix.extension.ops)


def test_per_op_keys_override_extend_and_drop_device_keys(tmp_path):
    text = DEFAULT.replace(
        OPS_LINE,
        "  ops:\n    - nms: {remove: [Autograd, AutocastCPU, AutocastCUDA]}\n"
        "    - cpu_only: {keys: [CPU, Meta]}\n"
        "    - on_cuda_too: {keys: [CPU, CUDA, AutocastCUDA]}\n"
        "    - extra: {add: [PrivateUse1, AutogradCPU]}\n"
        "    - _grad_only: {backward: true}\n    - roi_align")
    path = tmp_path / "matrix.yaml"
    path.write_text(text)
    matrix = load_matrix(path)
    ext = matrix.extension
    cpu, cu = ext.op_keys(matrix.variant("cpu")), ext.op_keys(matrix.variant("cu130"))
    assert cpu["nms"] == ("CPU", "Meta") and cu["nms"] == ("CPU", "CUDA", "Meta")
    assert cpu["cpu_only"] == cu["cpu_only"] == ("CPU", "Meta")
    # a device the variant does not build drops that device's keys, even when listed
    assert cpu["on_cuda_too"] == ("CPU",) and cu["on_cuda_too"] == ("CPU", "CUDA", "AutocastCUDA")
    assert cpu["extra"] == ("CPU", "Meta", "Autograd", "AutocastCPU", "PrivateUse1", "AutogradCPU")
    assert cu["_grad_only"] == ("CPU", "CUDA", "Meta")
    # internal_ops (the older spelling) still marks backward-only ops
    assert "_roi_align_backward" in ext.internal_ops and "_grad_only" in ext.internal_ops
    assert ext.ops == ("nms", "cpu_only", "on_cuda_too", "extra", "roi_align")


def test_no_kernel_by_design_drops_that_devices_keys_and_reaches_the_probe(tmp_path):
    text = DEFAULT.replace(
        OPS_LINE, "  ops:\n    - nms: {no_kernel: [cpu]}\n    - roi_align: {no_kernel: [cuda]}")
    path = tmp_path / "matrix.yaml"
    path.write_text(text)
    matrix = load_matrix(path)
    ext = matrix.extension
    cpu, cu = ext.op_keys(matrix.variant("cpu")), ext.op_keys(matrix.variant("cu130"))
    assert cpu["nms"] == ("Meta", "Autograd") and cu["nms"] == ("CUDA", "Meta", "Autograd",
                                                                 "AutocastCUDA")
    assert cu["roi_align"] == ("CPU", "Meta", "Autograd", "AutocastCPU")
    promised = matrix.promises(matrix.variant("cu130"))
    assert promised.no_kernel == {"nms": ("cpu",), "roi_align": ("cuda",)}
    from opforge.smoke.runner import ProbeRequest

    spec = ProbeRequest(package="p", namespace="n").promising(promised).spec()
    assert spec["no_kernel"] == {"nms": ["cpu"], "roi_align": ["cuda"]}


def test_any_torch_dispatch_key_is_accepted_and_nothing_is_forced(tmp_path):
    text = DEFAULT.replace("    expected_keys: [CPU, CUDA, Meta, Autograd, AutocastCPU, AutocastCUDA]",
                           "    expected_keys: [CUDA, HPU, PrivateUse1, CompositeExplicitAutograd]")
    path = tmp_path / "matrix.yaml"
    path.write_text(text)
    assert load_matrix(path).variant("cu126").expected_keys == (
        "CUDA", "HPU", "PrivateUse1", "CompositeExplicitAutograd")


def test_objects_are_frozen():
    matrix = load_matrix(FIXTURE)
    with pytest.raises(AttributeError):
        matrix.variants[0].name = "other"  # type: ignore[misc]


def test_device_types_are_read_as_their_dispatch_keys(tmp_path):
    """``hpu`` where a key goes is HPU, as torch.library.impl reads it; the model holds keys."""
    text = _with("    expected_keys: [CPU, Meta, Autograd, AutocastCPU]",
                 "    expected_keys: [cpu, meta, Autograd, AutocastCPU]")
    text = text.replace(OPS_LINE, "  ops:\n    - nms: {add: [hpu, privateuseone], "
                        "remove: [lazy]}\n    - roi_align: {keys: [cpu, xpu, mtia]}", 1)
    path = tmp_path / "matrix.yaml"
    path.write_text(text)
    matrix = load_matrix(path)
    cpu = matrix.variant("cpu")
    assert cpu.expected_keys == ("CPU", "Meta", "Autograd", "AutocastCPU")
    nms = next(op for op in matrix.extension.op_specs if op.name == "nms")
    assert (nms.add, nms.remove) == (("HPU", "PrivateUse1"), ("Lazy",))
    roi_align = next(op for op in matrix.extension.op_specs if op.name == "roi_align")
    assert roi_align.keys == ("CPU", "XPU", "MTIA")
    ops = matrix.extension.op_keys(cpu)
    assert ops["nms"] == ("CPU", "Meta", "Autograd", "AutocastCPU", "HPU", "PrivateUse1")
    # XPU is the xpu backend's device: a cpu variant's roi_align cannot have it
    assert ops["roi_align"] == ("CPU", "MTIA")


def test_jobs_expand_variant_platform_python():
    matrix = load_matrix(FIXTURE)
    jobs = matrix.jobs()
    # cpu: 3 platforms, cu126/cu128/cu130: 1 each, mps: 1; times 4 pythons
    # cpu, cu126, cu128, cu130, mps, cpu_stable, mps_stable, cu130_stable
    assert len(jobs) == (3 + 1 + 1 + 1 + 1 + 3 + 1 + 1) * 4
    names = [j.name for j in jobs]
    assert len(set(names)) == len(names)
    mps = matrix.jobs(variant="mps", python="3.11")[0]
    assert mps.runner == "macos-14"
    assert mps.torch_index == "https://download.pytorch.org/whl/cpu"
    cu = matrix.jobs(variant="cu130", python="3.12")[0].as_dict()
    assert cu["container"] == "pytorch/manylinux2_28-builder:cuda13.0"
    assert cu["torch_install"] == ("pip install torch==2.14.1 --index-url "
                                   "https://download.pytorch.org/whl/cu130")
    assert cu["build_session"] == "build_cu130"


def test_pull_request_trims_to_one_python_per_variant_platform():
    matrix = load_matrix(FIXTURE)
    jobs = matrix.jobs(pull_request=True)
    assert {j.python for j in jobs} == {matrix.pr_python}
    assert len(jobs) == 12


def test_unknown_filter_is_a_usage_error(capsys):
    assert main(["matrix", "--file", str(FIXTURE), "--variant", "cu999"]) == 2
    err = capsys.readouterr().err
    assert "unknown variant 'cu999'" in err and "Traceback" not in err


def _with(old: str, new: str) -> str:
    assert old in DEFAULT, old
    return DEFAULT.replace(old, new, 1)


def _line_of(text: str, needle: str) -> int:
    """The line of the last occurrence of ``needle`` (a duplicate is reported where it repeats)."""
    lines = [n for n, line in enumerate(text.splitlines(), 1) if needle in line]
    assert lines, needle
    return lines[-1]


# (id, file text, key in the message, words in the message, line marker or None)
MALFORMED = [
    ("unknown-top-key", DEFAULT + "colour: blue\n", "colour", "unknown key", "colour: blue"),
    ("unknown-variant-key", _with("  - name: cu128\n", "  - name: cu128\n    cudaa: '12.8'\n"),
     "variants[2].cudaa", "unknown key", "cudaa"),
    ("cuda-on-macos", _with('    platforms: [linux-x86_64]\n    cuda: "13.0"',
                            '    platforms: [macos-arm64]\n    cuda: "13.0"'),
     "variants[3].platforms", "cannot target macos-arm64", None),
    ("mps-on-linux", _with("    platforms: [macos-arm64]\n    mps: true",
                           "    platforms: [linux-x86_64]\n    mps: true"),
     "variants[4].platforms", "MPS needs macOS", None),
    ("duplicate-variant", _with("  - name: cu128\n", "  - name: cu126\n"),
     "variants[2].name", "duplicate variant 'cu126'", "  - name: cu126"),
    ("arch-rejected-by-nvcc13", _with('"7.5;8.0;8.6;9.0;10.0;12.0+PTX"', '"5.0;7.5;9.0"'),
     "variants[3].arch_list", "does not accept sm_50", '"5.0;7.5;9.0"'),
    ("arch-garbage", _with('"7.5;8.0;8.6;9.0;10.0;12.0"', '"7.5;sm_90"'),
     "variants[2].arch_list", "not an architecture", '"7.5;sm_90"'),
    ("arch-bad-suffix", _with('"7.5;8.0;8.6;9.0;10.0;12.0"', '"8.0a"'),
     "variants[2].arch_list", "has no 'a' variant", '"8.0a"'),
    ("unknown-python", _with('pythons: ["3.10", "3.11", "3.12", "3.13"]',
                             'pythons: ["3.10", "3.11", "2.7"]'),
     "pythons[2]", "unknown Python version '2.7'", "pythons:"),
    ("python-as-float", _with('pythons: ["3.10", "3.11", "3.12", "3.13"]',
                              "pythons: [3.10, 3.11]"),
     "pythons[0]", "expected a string", "pythons:"),
    ("wrong-type-platforms", _with("    platforms: [linux-x86_64, linux-aarch64, macos-arm64]",
                                   "    platforms: linux-x86_64"),
     "variants[0].platforms", "expected a list", "    platforms: linux-x86_64"),
    ("wrong-type-bool", _with("    device_checks: false", "    device_checks: maybe"),
     "variants[4].device_checks", "expected true or false", "device_checks: maybe"),
    ("unknown-dispatch-key", _with("    expected_keys: [CPU, Meta, Autograd, AutocastCPU]",
                                   "    expected_keys: [CPU, Meta, Autogard, AutocastCPU]"),
     "variants[0].expected_keys[2]", "unknown dispatch key 'Autogard'", "Autogard"),
    # a device type is read as its key (as torch.library reads it), so it can repeat a key
    ("device-type-repeats-its-key", _with("    expected_keys: [CPU, Meta, Autograd, AutocastCPU]",
                                          "    expected_keys: [CPU, Meta, Autograd, cpu]"),
     "variants[0].expected_keys[3]", "'cpu' is CPU, listed twice", "Autograd, cpu]"),
    ("device-type-of-another-build", _with("    expected_keys: [CPU, Meta, Autograd, AutocastCPU]",
                                           "    expected_keys: [CPU, Meta, cuda]"),
     "variants[0].expected_keys", "expects CUDA kernels but sets no cuda version",
     "    expected_keys: [CPU, Meta, cuda]"),
    ("device-type-of-an-unlisted-key", _with(OPS_LINE, "  ops:\n    - nms: {add: [fpga]}"),
     "extension.ops.nms.add[0]", "device type 'fpga' registers under FPGA, a key torch's "
     "Python API does not list", "{add: [fpga]}"),
    ("renamed-backend-is-not-a-key", _with(OPS_LINE, "  ops:\n    - nms: {add: [npu]}"),
     "extension.ops.nms.add[0]", "unknown dispatch key 'npu' (nor a torch device type: a "
     "device renamed from PrivateUse1 with torch.utils.rename_privateuse1_backend('npu') "
     "registers under PrivateUse1)", "{add: [npu]}"),
    ("unknown-platform", _with("    platforms: [linux-x86_64, linux-aarch64, macos-arm64]",
                               "    platforms: [linux-x86_64, windows-arm64]"),
     "variants[0].platforms[1]", "unknown platform 'windows-arm64'", "windows-arm64"),
    ("bad-channel", _with("  channel: stable ", "  channel: beta "),
     "torch.channel", "not one of stable, test, nightly", "channel: beta"),
    ("nightly-needs-dev-version", _with("  channel: stable ", "  channel: nightly "),
     "torch.version", "nightly channel needs", 'version: "2.13.0"'),
    ("local-version", _with('version: "2.13.0"', 'version: "2.13.0+cpu"'),
     "torch.version", "leave out the local part", 'version: "2.13.0+cpu"'),
    ("missing-required", _with("  namespace: opforge         # torch.ops.<namespace>\n", ""),
     "extension.namespace", "required key missing", None),
    ("duplicate-yaml-key", _with("  package: opforge_ops       # import name\n",
                                 "  package: opforge_ops\n  package: other\n"),
     "extension.package", "duplicate key", "  package: other"),
    ("xpu-keys-without-xpu",
     _with("    expected_keys: [CPU, CUDA, Meta, Autograd, AutocastCPU, AutocastCUDA]",
           "    expected_keys: [CPU, CUDA, Meta, AutocastXPU]"),
     "variants[1].expected_keys", "variant 'cu126' expects AutocastXPU kernels but its backend "
     "is cuda, not xpu", "    expected_keys: [CPU, CUDA, Meta, AutocastXPU]"),
    ("cuda-keys-without-cuda", _with("    expected_keys: [CPU, Meta, Autograd, AutocastCPU]",
                                     "    expected_keys: [CPU, Meta, AutogradCUDA]"),
     "variants[0].expected_keys", "expects AutogradCUDA kernels but sets no cuda version",
     "    expected_keys: [CPU, Meta, AutogradCUDA]"),
    ("op-unknown-key", _with(OPS_LINE,
                             "  ops:\n    - nms: {remove: [Autogard]}\n    - roi_align"),
     "extension.ops.nms.remove[0]", "unknown dispatch key 'Autogard'", "{remove: [Autogard]}"),
    ("op-unknown-field", _with(OPS_LINE,
                               "  ops:\n    - roi_align\n    - nms: {without: [Autograd]}"),
     "extension.ops.nms.without",
     "unknown key (allowed: add, backward, keys, max_slowdown, no_kernel, remove)",
     "{without: [Autograd]}"),
    ("op-no-kernel-names-a-key", _with(OPS_LINE,
                                       "  ops:\n    - roi_align\n    - nms: {no_kernel: [CPU]}"),
     "extension.ops.nms.no_kernel[0]", "'CPU' is not a device (did you mean cpu?)",
     "{no_kernel: [CPU]}"),
    ("op-no-kernel-unknown-device", _with(OPS_LINE,
                                          "  ops:\n    - nms: {no_kernel: [tpu]}"),
     "extension.ops.nms.no_kernel[0]", "one of cpu, cuda, mps", "{no_kernel: [tpu]}"),
    ("op-no-kernel-not-a-list", _with(OPS_LINE,
                                      "  ops:\n    - roi_align\n    - nms: {no_kernel: cpu}"),
     "extension.ops.nms.no_kernel", "expected a list", "{no_kernel: cpu}"),
    ("op-no-kernel-twice", _with(OPS_LINE,
                                 "  ops:\n    - nms: {no_kernel: [cpu, cpu]}"),
     "extension.ops.nms.no_kernel[1]", "'cpu' is listed twice", "{no_kernel: [cpu, cpu]}"),
    ("op-two-names", _with(OPS_LINE,
                           "  ops:\n    - {nms: {backward: true}, roi_align: {}}"),
     "extension.ops[0]", "an op with fields is one mapping", "{nms: {backward: true}"),
    ("op-twice", _with(OPS_LINE,
                       "  ops: [nms, roi_align, {nms: {add: [XPU]}}]"),
     "extension.ops.nms", "'nms' is listed twice", "  ops: [nms, roi_align, {nms"),
    ("op-backward-not-bool", _with(OPS_LINE,
                                   "  ops: [nms, {_b: {backward: yes please}}]"),
     "extension.ops._b.backward", "expected true or false", "  ops: [nms, {_b:"),
    ("slowdown-not-a-number", _with("  recipes: extension/recipes.py",
                                    "  recipes: extension/recipes.py\n  max_slowdown: fast"),
     "extension.max_slowdown", "greater than 1", "  max_slowdown: fast"),
    ("slowdown-below-one", _with("  recipes: extension/recipes.py",
                                 "  recipes: extension/recipes.py\n  max_slowdown: 0.5"),
     "extension.max_slowdown", "greater than 1", "  max_slowdown: 0.5"),
    ("op-slowdown-bool", _with(OPS_LINE,
                               "  ops: [nms, {roi_align: {max_slowdown: true}}]"),
     "extension.ops.roi_align.max_slowdown", "greater than 1", "  ops: [nms, {roi_align:"),
    ("op-slowdown-infinite", _with(OPS_LINE,
                                   "  ops: [nms, {roi_align: {max_slowdown: .inf}}]"),
     "extension.ops.roi_align.max_slowdown", "greater than 1", "  ops: [nms, {roi_align:"),
    ("recipes-not-python", _with("  recipes: extension/recipes.py", "  recipes: recipes.yaml"),
     "extension.recipes", "is a Python file", "  recipes: recipes.yaml"),
    ("unknown-cuda", _with('cuda: "12.8"', 'cuda: "12.7"'),
     "variants[2].cuda", "unknown CUDA version '12.7'", 'cuda: "12.7"'),
    ("bad-variant-name", _with("  - name: cu128\n", "  - name: CU-128\n"),
     "variants[2].name", "lower-case", "CU-128"),
    ("yaml-syntax", DEFAULT.replace("variants:\n", "variants:\n  - name: [unclosed\n", 1),
     "(yaml)", "", None),
    ("empty-file", "", "(top)", "empty", None),
    ("top-is-list", "- a\n- b\n", "(top)", "expected a mapping", None),
    # free-text fields checked against what they become
    ("variant-name-final-newline", _with("  - name: cpu\n", '  - name: "cpu\\n"\n'),
     "variants[0].name", "control character", '"cpu\\n"'),
    ("runner-label-with-space", _with("    runner: ubuntu-24.04\n", "    runner: ubuntu 24.04\n"),
     "platforms.linux-x86_64.runner", "not a runner label", "runner: ubuntu 24.04"),
    ("runner-expression", _with("    runner: macos-14\n", "    runner: ${{ secrets.X }}\n"),
     "platforms.macos-arm64.runner", "not a runner label", "secrets.X"),
    ("container-not-an-image", _with("container: pytorch/manylinux2_28-builder:cuda12.8",
                                     "container: \"pytorch/Manylinux builder\""),
     "variants[2].container", "not a container image reference", "Manylinux builder"),
    ("index-variant-path", _with("    index_variant: cpu ", "    index_variant: ../cpu "),
     "variants[4].index_variant", "not an index folder name", "index_variant: ../cpu"),
    ("torch-index-scheme", _with("  index: https://download.pytorch.org/whl ",
                                 "  index: javascript:alert(1) "),
     "torch.index", "not an https://", "javascript:"),
    ("torch-index-query", _with("  index: https://download.pytorch.org/whl ",
                                "  index: https://example.com/whl?x=1 "),
     "torch.index", "no query", "example.com"),
    ("extension-path-escapes", _with("  path: extension ", "  path: ../elsewhere "),
     "extension.path", "leaves the repository", "../elsewhere"),
    ("extension-path-absolute", _with("  path: extension ", "  path: /etc "),
     "extension.path", "relative path", "path: /etc"),
    ("namespace-not-ascii", _with("  namespace: opforge ", "  namespace: opförge "),
     "extension.namespace", "not a torch.ops namespace", "opförge"),
    ("op-name-with-semicolon", _with("ops: [nms, roi_align", "ops: [\"nms;rm\", roi_align"),
     "extension.ops[0]", "not an operator name", "nms;rm"),
    ("distribution-bad", _with("  distribution: opforge-ops ", "  distribution: opforge ops "),
     "extension.distribution", "not a distribution name", "opforge ops"),
    ("yaml-python-tag", _with("  package: opforge_ops ", "  package: !!python/name:os.system "),
     "(yaml)", "tags are not allowed", "python/name"),
    ("yaml-int-tag", _with('pr_python: "3.11"', "pr_python: !!int abc"),
     "(yaml)", "tags are not allowed", "!!int abc"),
    ("version-with-space", _with('version: "2.13.0"', 'version: " 2.13.0"'),
     "torch.version", "leading or trailing spaces", 'version: " 2.13.0"'),
    ("arch-list-on-cpu", _with("    expected_keys: [CPU, Meta, Autograd, AutocastCPU]",
                               "    arch_list: \"9.0\"\n    expected_keys: [CPU, Meta, Autograd, AutocastCPU]"),
     "variants[0].arch_list", "needs cuda: set", 'arch_list: "9.0"'),
]


@pytest.mark.parametrize("case_id,text,key,words,marker", MALFORMED,
                         ids=[c[0] for c in MALFORMED])
def test_malformed_matrix_gives_one_line_with_file_line_key(tmp_path, capsys, case_id, text,
                                                            key, words, marker):
    path = tmp_path / "matrix.yaml"
    path.write_text(text)
    with pytest.raises(MatrixError) as info:
        load_matrix(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("matrix.yaml:")
    assert f": {key}:" in message or key in message
    assert words in message
    if marker is not None:
        assert int(message.split(":")[1]) == _line_of(text, marker), message
    # through the CLI: exit 2, the same single line, no traceback
    assert main(["matrix", "--file", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0 and "Traceback" not in err and key in err


def test_at_least_fifteen_malformed_files():
    assert len(MALFORMED) >= 15


def test_missing_file_is_a_usage_error(tmp_path, capsys):
    assert main(["matrix", "--file", str(tmp_path / "nope.yaml")]) == 2
    assert "nope.yaml: no such file" in capsys.readouterr().err


def test_parse_is_deterministic():
    a = parse_matrix(DEFAULT, Path("matrix.yaml"))
    b = parse_matrix(DEFAULT, Path("matrix.yaml"))
    assert [j.as_dict() for j in a.jobs()] == [j.as_dict() for j in b.jobs()]


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "opforge", "matrix", "--file", str(FIXTURE),
                           *args], cwd=ROOT,
                          capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src"),
                               "COLUMNS": "160", **(env or {})})


def _golden(name: str, output: str) -> str:
    """The golden file's text; rewritten from ``output`` first when regenerating."""
    if os.environ.get("OPFORGE_REGENERATE_GOLDEN") == "1":
        (GOLDEN / name).write_text(output)
    return (GOLDEN / name).read_text()


def test_golden_table():
    result = _cli()
    assert result.returncode == 0, result.stderr
    assert result.stdout == _golden("matrix_table.txt", result.stdout)


def test_golden_json():
    result = _cli("--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == json.loads(_golden("matrix_jobs.json", result.stdout))


def test_the_repository_matrix_loads_validates_and_expands(capsys):
    """The golden tests expand the fixture; this repository's own matrix.yaml gets this."""
    matrix = load_matrix(ROOT / "matrix.yaml")
    assert main(["matrix", "--file", str(ROOT / "matrix.yaml"), "--check"]) == 0
    capsys.readouterr()
    jobs = matrix.jobs()
    assert {job.variant.name for job in jobs} == {v.name for v in matrix.variants}
    assert len({job.name for job in jobs}) == len(jobs)
    json.dumps(matrix.github_matrix())  # what the workflows receive is JSON
    for variant in matrix.variants:
        promised = matrix.promises(variant)
        assert set(promised.op_keys) == {op.name for op in matrix.extension.op_specs}
        assert matrix.dist_dir(variant) == ROOT / "dist" / variant.name


def test_github_output_is_strategy_matrix_and_written_to_github_output(tmp_path):
    out = tmp_path / "github_output"
    result = _cli("--github", "--pull-request", env={"GITHUB_OUTPUT": str(out)})
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    assert set(payload) == {"include"} and len(payload["include"]) == 12
    cell = next(c for c in payload["include"] if c["variant"] == "mps")
    for key in ("python", "cuda", "container", "runner", "torch_install", "build_name"):
        assert key in cell
    lines = dict(line.split("=", 1) for line in out.read_text().splitlines())
    assert json.loads(lines["matrix"]) == payload
    # the stable variant compiles once per platform: 3 fewer builds than cells
    assert len(json.loads(lines["builds"])["include"]) == 12
    assert [c["name"] for c in json.loads(lines["compat"])["include"]] == [
        "cpu_stable-linux-x86_64-py3.11", "cpu_stable-linux-aarch64-py3.11",
        "cpu_stable-macos-arm64-py3.11", "mps_stable-macos-arm64-py3.11",
        "cu130_stable-linux-x86_64-py3.11"]
    assert lines["has_compat"] == "true"


def test_filters_combine():
    result = _cli("--json", "--variant", "cpu", "--platform", "macos-arm64", "--python", "3.12")
    jobs = json.loads(result.stdout)
    assert [j["name"] for j in jobs] == ["cpu-macos-arm64-py3.12"]


def test_env_overrides_torch_channel_and_version_everywhere():
    matrix = load_matrix(FIXTURE, env={"OPFORGE_TORCH_CHANNEL": "nightly"})
    assert matrix.torch.channel == "nightly" and matrix.torch.version == "latest"
    cu = matrix.jobs(variant="cu130", python="3.11")[0]
    # the variant's own torch_version pin gives way to the override
    assert cu.torch_install == ("pip install --pre torch --index-url "
                                "https://download.pytorch.org/whl/nightly/cu130")
    pinned = load_matrix(FIXTURE, env={"OPFORGE_TORCH_CHANNEL": "nightly",
                                                    "OPFORGE_TORCH_VERSION": "2.14.0.dev20261201"})
    assert pinned.jobs(variant="mps")[0].torch_spec == "torch==2.14.0.dev20261201"


@pytest.mark.parametrize("env,words", [
    ({"OPFORGE_TORCH_CHANNEL": "weekly"}, "is not one of stable, test, nightly"),
    ({"OPFORGE_TORCH_CHANNEL": "nightly", "OPFORGE_TORCH_VERSION": "2026-12-01"},
     "is not a PEP 440 version"),
    ({"OPFORGE_TORCH_VERSION": "2.14.0.dev20261201"}, "is a nightly"),
])
def test_bad_env_override_is_one_line_exit_2(env, words):
    result = _cli("--check", env=env)
    assert result.returncode == 2
    assert words in result.stderr and "Traceback" not in result.stderr


def test_filters_matching_no_job_are_a_usage_error():
    # mps is macOS-only: an empty {"include": []} would fail the next GitHub job vaguely
    result = _cli("--github", "--variant", "mps", "--platform", "linux-x86_64")
    assert result.returncode == 2
    assert "no job in matrix.yaml matches --variant mps --platform linux-x86_64" in result.stderr


def test_filters_take_comma_lists_and_empty_means_all(capsys):
    """The reusable workflows pass their inputs as --variant "$VARIANTS": "a,b" or ""."""
    path = str(FIXTURE)
    assert main(["matrix", "--file", path, "--json", "--variant", "cu130,cpu",
                 "--python", "3.11"]) == 0
    names = [job["name"] for job in json.loads(capsys.readouterr().out)]
    want = [job.name for job in load_matrix(FIXTURE).jobs(python="3.11")
            if job.variant.name in ("cpu", "cu130")]   # the matrix's order, not the filter's
    assert names == want and {n.split("-")[0] for n in names} == {"cpu", "cu130"}
    assert main(["matrix", "--file", path, "--json"]) == 0
    every = json.loads(capsys.readouterr().out)
    assert main(["matrix", "--file", path, "--json", "--variant", "", "--platform", "",
                 "--python", ""]) == 0
    assert json.loads(capsys.readouterr().out) == every
    assert main(["matrix", "--file", path, "--json", "--variant", "cpu,cu999"]) == 2
    assert "unknown variant 'cu999'" in capsys.readouterr().err


def test_check_honours_filters(capsys):
    path = str(FIXTURE)
    assert main(["matrix", "--file", path, "--check", "--variant", "cu130"]) == 0
    assert "4 jobs match the filters" in capsys.readouterr().out
    assert main(["matrix", "--file", path, "--check", "--variant", "cu999"]) == 2
    assert "unknown variant 'cu999'" in capsys.readouterr().err
    assert main(["matrix", "--file", path, "--check", "--variant", "mps",
                 "--platform", "linux-x86_64"]) == 2
    assert "no job in matrix.yaml matches" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["directory", "under-a-file"])
def test_github_output_is_checked_before_anything_is_printed(tmp_path, capsys, monkeypatch,
                                                             kind):
    target = tmp_path
    if kind == "under-a-file":
        (tmp_path / "f").write_text("mine")
        target = tmp_path / "f" / "out"
    monkeypatch.setenv("GITHUB_OUTPUT", str(target))
    assert main(["matrix", "--file", str(FIXTURE), "--github"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1
    assert err.startswith(f"opforge matrix: error: $GITHUB_OUTPUT {target}: ")


def test_github_output_is_appended(tmp_path, capsys, monkeypatch):
    output = tmp_path / "out"
    output.write_text("before=1\n")
    monkeypatch.setenv("GITHUB_OUTPUT", str(output))
    assert main(["matrix", "--file", str(FIXTURE), "--github",
                 "--variant", "cpu", "--python", "3.11"]) == 0
    lines = output.read_text().splitlines()
    assert lines[0] == "before=1" and lines[1].startswith('matrix={"include":')


def test_slowdown_factors_default_and_override(tmp_path):
    path = tmp_path / "matrix.yaml"
    path.write_text(_with(OPS_LINE,
                          "  max_slowdown: 4\n  ops: [nms, {roi_align: {max_slowdown: 25}}]"))
    ext = load_matrix(path).extension
    assert ext.max_slowdown == 4.0 and ext.slowdown_factors() == {"roi_align": 25.0}
    assert load_matrix(FIXTURE).extension.max_slowdown == 10.0
