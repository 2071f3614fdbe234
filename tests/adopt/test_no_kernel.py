"""``opforge init`` proposes ``no_kernel: [device]`` only where an op's source says, plainly,
that it has no kernel for the device by design: every kernel it has there does nothing but
raise words the smoke probe reads as "no kernel" (``No CPU version supported``). A real
kernel, a build fault (``Not compiled with CUDA support``), an argument check, a raise under a
preprocessor conditional or a kernel whose source is not known are never proposed: a false
proposal would turn a real missing kernel into a silent skip.

The shapes are those of real packages (torch-cluster 1.6.3's ``nearest``, the PyG family's
device dispatchers, torch.library's ``register_kernel``), written anew."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from opforge.cli import main
from opforge.matrix import load_matrix
from opforge.scan import scan_extension
from opforge.smoke.probe.rejections import NO_KERNEL, classify, no_kernel_device


@pytest.fixture(autouse=True)
def released_opforge(monkeypatch):
    from opforge import _release

    monkeypatch.setattr(_release, "WORKFLOWS_COMMIT", "f" * 40)


def project(root: Path, files: dict[str, str]) -> Path:
    files = {"pyproject.toml": "[project]\nname = 'nk'\nversion = '1.0'\n",
             "nk/__init__.py": "", **files}
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"))
    return root


def proposed(root: Path) -> dict[str, dict[str, str]]:
    scan = scan_extension(root)
    return {op.name: op.no_kernel for ops in scan.namespaces.values() for op in ops.values()
            if op.no_kernel}


def line_of(root: Path, rel: str, words: str) -> int:
    lines = (root / rel).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if words in line)


DISPATCHER = """
#include <torch/script.h>
/* a block comment
   over three lines, before the kernels */
torch::Tensor nearest(torch::Tensor x, torch::Tensor y) {
  TORCH_CHECK(x.dim() == 2, "x must be 2-D");
  if (x.device().is_cuda()) {
#ifdef WITH_CUDA
    return nearest_cuda(x, y);
#else
    AT_ERROR("Not compiled with CUDA support");
#endif
  } else {
    AT_ERROR("No CPU version supported");
  }
}

torch::Tensor knn(torch::Tensor x, torch::Tensor y) {
  if (x.device().is_cuda()) {
#ifdef WITH_CUDA
    return knn_cuda(x, y);
#else
    AT_ERROR("Not compiled with CUDA support");
#endif
  } else {
    return knn_cpu(x, y);
  }
}

static auto registry = torch::RegisterOperators()
                           .op("nk::nearest", &nearest)
                           .op("nk::knn", &knn);
"""


def test_a_dispatcher_whose_cpu_branch_only_raises_is_proposed_and_a_real_one_is_not(
        tmp_path):
    root = project(tmp_path, {"csrc/ops.cpp": DISPATCHER})
    line = line_of(root, "csrc/ops.cpp", "No CPU version supported")
    assert proposed(root) == {
        "nearest": {"cpu": f'csrc/ops.cpp:{line} raises "No CPU version supported"'}}


def test_init_writes_the_declaration_with_its_evidence_and_says_so(tmp_path, capsys):
    root = project(tmp_path, {"csrc/ops.cpp": DISPATCHER})
    assert main(["init", str(root)]) == 0
    err = capsys.readouterr().err
    line = line_of(root, "csrc/ops.cpp", "No CPU version supported")
    said = [s for s in err.splitlines() if s.startswith("opforge init: proposed:")]
    assert len(said) == 1 and said[0].startswith(
        f'opforge init: proposed: nearest: {{no_kernel: [cpu]}}: csrc/ops.cpp:{line} raises '
        '"No CPU version supported"') and "remove the field" in said[0]
    text = (root / "matrix.yaml").read_text()
    written = next(s for s in text.splitlines() if "- nearest" in s)
    assert written.startswith("    - nearest: {no_kernel: [cpu]}  # csrc/ops.cpp; ")
    assert f"proposed by init: csrc/ops.cpp:{line} raises" in written
    assert "    - knn  # csrc/ops.cpp" in text  # the healthy op stays promised
    # the file init wrote reads back: the declaration reaches the promises
    matrix = load_matrix(root / "matrix.yaml")
    spec = {op.name: op for op in matrix.extension.op_specs}
    assert spec["nearest"].no_kernel == ("cpu",) and spec["knn"].no_kernel == ()
    cpu = matrix.variant("cpu")
    keys = matrix.extension.op_keys(cpu)
    assert "CPU" not in keys["nearest"] and "CPU" in keys["knn"]
    assert matrix.promises(cpu).no_kernel == {"nearest": ("cpu",)}


@pytest.mark.parametrize("raising", [
    'TORCH_CHECK(false, "knn: not implemented on CPU");',
    'TORCH_CHECK(x.numel() == 0, "knn: not implemented on CPU");',  # a check: not proposed
    'AT_ERROR("No CPU ", "implementation");',
    'throw std::runtime_error("CPU kernel not implemented");',
    'C10_THROW_ERROR(NotImplementedError, "no cpu kernel for knn");',
])
def test_a_cpu_kernel_that_only_raises_is_proposed(tmp_path, raising):
    root = project(tmp_path, {
        "csrc/ops.cpp": 'TORCH_LIBRARY(nk, m) { m.def("knn(Tensor x) -> Tensor"); }\n',
        "csrc/cpu/knn.cpp": f"""
            at::Tensor knn_cpu(const at::Tensor& x) {{
              {raising}
            }}
            TORCH_LIBRARY_IMPL(nk, CPU, m) {{ m.impl("knn", &knn_cpu); }}
            """,
        "csrc/cuda/knn.cu": """
            at::Tensor knn_cuda(const at::Tensor& x) { return x.clone(); }
            TORCH_LIBRARY_IMPL(nk, CUDA, m) { m.impl("knn", TORCH_FN(knn_cuda)); }
            """})
    if "numel" in raising:
        assert proposed(root) == {}
        return
    assert list(proposed(root)) == ["knn"] and list(proposed(root)["knn"]) == ["cpu"]
    assert proposed(root)["knn"]["cpu"].startswith("csrc/cpu/knn.cpp:2 raises")


def test_a_lambda_kernel_and_the_fall_through_form_are_read(tmp_path):
    root = project(tmp_path, {
        "csrc/ops.cpp": """
            TORCH_LIBRARY(nk, m) {
              m.def("a(Tensor x) -> Tensor");
              m.def("b(Tensor x) -> Tensor", &b);
            }
            TORCH_LIBRARY_IMPL(nk, CPU, m) {
              m.impl("a", [](const at::Tensor& x) -> at::Tensor {
                AT_ERROR("a: no CPU implementation");
              });
            }
            at::Tensor b(const at::Tensor& x) {
              if (x.is_cuda()) {
                return b_cuda(x);
              }
              if (x.is_mps()) return b_mps(x);
              TORCH_CHECK(false, "b is not supported on CPU");
            }
            """})
    assert proposed(root) == {
        "a": {"cpu": 'csrc/ops.cpp:7 raises "a: no CPU implementation"'},
        "b": {"cpu": 'csrc/ops.cpp:15 raises "b is not supported on CPU"'}}


@pytest.mark.parametrize("kernel", [
    # a real CPU kernel
    "at::Tensor k(const at::Tensor& x) { return x.clone(); }",
    # a build fault: the variant promised the device's kernel and the build left it out
    """at::Tensor k(const at::Tensor& x) {
         if (x.is_cuda()) { AT_ERROR("Not compiled with CUDA support"); }
         return x.clone();
       }""",
    # an argument check in a real kernel, even in the vocabulary's words
    """at::Tensor k(const at::Tensor& x) {
         if (x.scalar_type() == at::kHalf) { AT_ERROR("half is not implemented on CPU"); }
         return x.clone();
       }""",
    """at::Tensor k(const at::Tensor& x) {
         TORCH_CHECK(x.dim() == 2, "3-D inputs: no CPU version supported");
         return x.clone();
       }""",
    # the raise on the CPU path only in some builds
    """at::Tensor k(const at::Tensor& x) {
         if (x.is_cuda()) { return k_cuda(x); }
         else {
       #ifndef WITH_CPU_KERNELS
           AT_ERROR("No CPU version supported");
       #else
           return k_cpu(x);
       #endif
         }
       }""",
    # the CPU's test, and its raise, only in some builds
    """at::Tensor k(const at::Tensor& x) {
       #ifndef WITH_CPU_KERNELS
         if (!x.is_cuda()) { AT_ERROR("No CPU version supported"); }
       #endif
         return k_any(x);
       }""",
    # an argument check on the CPU's path, not a raise
    """at::Tensor k(const at::Tensor& x) {
         if (x.is_cpu()) { TORCH_CHECK(x.numel() == 0, "no CPU version for non-empty x"); }
         return k_any(x);
       }""",
    # another device's words on the CPU path
    """at::Tensor k(const at::Tensor& x) {
         if (x.is_cuda()) { return k_cuda(x); } else { AT_ERROR("No MPS version"); }
       }""",
    # the raise is not all the CPU path does
    """at::Tensor k(const at::Tensor& x) {
         if (x.is_cuda()) { return k_cuda(x); }
         else { log_once(x); AT_ERROR("No CPU version supported"); }
       }""",
    # a test of something else first, which may return on the CPU
    """at::Tensor k(const at::Tensor& x) {
         if (x.numel() > 64) { return k_big(x); }
         if (x.is_cuda()) { return k_cuda(x); }
         AT_ERROR("No CPU version supported");
       }""",
    # a CUDA branch that does not leave: the raise is the CUDA path's too
    """at::Tensor k(const at::Tensor& x) {
         if (x.is_cuda()) { warm_up(x); }
         AT_ERROR("No CPU version supported");
       }""",
    # a catch-all that raises everywhere is no statement about one device
    'at::Tensor k(const at::Tensor& x) { AT_ERROR("No CPU version supported"); }',
    # raised inside a loop: not the device's path
    """at::Tensor k(const at::Tensor& x) {
         for (int i = 0; i < 2; i++) { if (x.is_cpu()) AT_ERROR("No CPU version"); }
         return x;
       }""",
])
def test_no_proposal_without_plain_evidence(tmp_path, kernel):
    root = project(tmp_path, {"csrc/ops.cpp": kernel + """
        TORCH_LIBRARY(nk, m) { m.def("k(Tensor x) -> Tensor", &k); }
        """})
    scan = scan_extension(root)
    assert scan.namespaces["nk"]["k"].kernels, "the kernel was not even seen"
    assert proposed(root) == {}


def test_a_kernel_whose_source_is_unknown_or_twice_defined_is_not_proposed(tmp_path):
    root = project(tmp_path, {"csrc/ops.cpp": """
        #ifndef WITH_CPU_KERNELS
        at::Tensor k(const at::Tensor& x) { AT_ERROR("No CPU version supported"); }
        #else
        at::Tensor k(const at::Tensor& x) { return k_cpu(x); }
        #endif
        TORCH_LIBRARY(nk, m) { m.def("k(Tensor x) -> Tensor"); m.def("u(Tensor x) -> Tensor"); }
        TORCH_LIBRARY_IMPL(nk, CPU, m) { m.impl("k", &k); m.impl("u", &elsewhere); }
        """})
    assert proposed(root) == {}


def test_a_cpu_registration_the_scan_cannot_read_blocks_the_proposal(tmp_path):
    """The op's CPU kernel is registered in a form whose function the scan does not keep:
    the catch-all's raise says nothing about the kernel the CPU really gets."""
    root = project(tmp_path, {"csrc/ops.cpp": """
        at::Tensor k(const at::Tensor& x) {
          if (x.is_cuda()) { return k_cuda(x); } else { AT_ERROR("No CPU version"); }
        }
        TORCH_LIBRARY(nk, m) { m.def("k(Tensor x) -> Tensor", &k); }
        static auto registry = torch::RegisterOperators().op(
            torch::RegisterOperators::options().schema("nk::k").kernel(
                c10::DispatchKey::CPU, &k_cpu));
        """})
    assert scan_extension(root).namespaces["nk"]["k"].named == {"CPU"}
    assert proposed(root) == {}


def test_a_real_cpu_kernel_beside_a_raising_dispatcher_wins(tmp_path):
    """A kernel registered for the CPU key serves the CPU, whatever a catch-all says."""
    root = project(tmp_path, {"csrc/ops.cpp": """
        at::Tensor k(const at::Tensor& x) {
          if (x.is_cuda()) { return k_cuda(x); } else { AT_ERROR("No CPU version"); }
        }
        at::Tensor k_cpu(const at::Tensor& x) { return x.clone(); }
        TORCH_LIBRARY(nk, m) { m.def("k(Tensor x) -> Tensor", &k); }
        TORCH_LIBRARY_IMPL(nk, CPU, m) { m.impl("k", &k_cpu); }
        """})
    assert proposed(root) == {}


def test_python_kernels_that_only_raise_for_a_device(tmp_path):
    root = project(tmp_path, {"nk/ops.py": '''
        import torch

        @torch.library.custom_op("nk::a", mutates_args=(), device_types="cuda")
        def a(x: torch.Tensor) -> torch.Tensor:
            return x.clone()

        @torch.library.register_kernel("nk::a", "cpu")
        def _(x):
            """No CPU kernel: a is a CUDA op."""
            raise NotImplementedError("a: no CPU implementation")

        @torch.library.custom_op("nk::b", mutates_args=())
        def b(x: torch.Tensor) -> torch.Tensor:
            if x.is_cuda:
                return x.clone()
            raise NotImplementedError(f"b: CPU version not available ({x.device})")

        @torch.library.custom_op("nk::c", mutates_args=())
        def c(x: torch.Tensor) -> torch.Tensor:
            if x.dtype == torch.float16:
                raise NotImplementedError("half is not implemented on CPU")
            return x.clone()

        def d_cpu(x):
            if x.dim() != 2:
                raise NotImplementedError("no CPU version for 3-D inputs")
            return x

        torch.library.define("nk::d", "(Tensor x) -> Tensor")
        torch.library.register_kernel("nk::d", "cpu", d_cpu)
        torch.library.register_kernel("nk::e", "cpu", lambda x: x)
        '''})
    assert proposed(root) == {
        "a": {"cpu": 'nk/ops.py:10 raises "a: no CPU implementation"'},
        "b": {"cpu": 'nk/ops.py:16 raises "b: CPU version not available ({})"'}}


@pytest.mark.parametrize("words", [
    "No CPU version supported", "knn: not implemented on CPU", "CPU kernel not implemented",
    "only supports CUDA tensors", "no GPU implementation", "Not compiled with CUDA support",
    "compiled without CUDA", "No CUDA support: not compiled with CUDA", "x must be 2-D", "\"histogram_cpu\" not implemented for 'Long'",
    "CUDA error: an illegal memory access", "not implemented for the MPS backend",
])
def test_init_and_the_probe_read_the_same_words(words):
    kind, detail = classify(RuntimeError(words))
    assert no_kernel_device(words) == (detail if kind == NO_KERNEL else None)
