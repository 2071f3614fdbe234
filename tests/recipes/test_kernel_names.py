"""What the scan tells the derive search about a kernel: its checks (also those of a template
it calls from an AT_DISPATCH lambda) and its own parameter names, by the schema's position;
and a module function's signature where it is installed (pybind11's docstring or Python's)."""

from __future__ import annotations

import textwrap

from opforge.recipes.app import with_kernel_names
from opforge.recipes.calls import parse_params
from opforge.recipes.target.trial import signature_of
from opforge.scan import scan_extension

SOURCE = """
#include <torch/extension.h>

template <typename scalar_t>
void smooth_kernel(const at::Tensor &signal, const at::Tensor &taps, at::Tensor &out) {
    TORCH_CHECK(signal.dim() == 2, "Signal must be 2D");
    TORCH_CHECK(taps.dim() == 3, "taps must be 3-dimensional");
}

at::Tensor smooth_cpu(const at::Tensor &signal, const at::Tensor &taps,
                      const at::Tensor &state) {
    TORCH_CHECK(state.dim() == 1, "State must be 1D");
    auto out = at::empty_like(signal);
    AT_DISPATCH_FLOATING_TYPES(signal.scalar_type(), "smooth", [&] {
        smooth_kernel<scalar_t>(signal, taps, out);
    });
    return out;
}

TORCH_LIBRARY(filters, m) {
    m.def("filters::smooth(Tensor a, Tensor b, Tensor c) -> Tensor");
}

TORCH_LIBRARY_IMPL(filters, CPU, m) {
    m.impl("smooth", &smooth_cpu);
}
"""


def _project(root):
    (root / "pyproject.toml").write_text(textwrap.dedent("""\
        [build-system]
        requires = ["setuptools", "torch"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "filters"
        version = "1.0"
    """))
    (root / "filters").mkdir()
    (root / "filters" / "__init__.py").write_text("")
    (root / "filters" / "smooth.cpp").write_text(SOURCE)
    return root


def test_the_hints_hold_the_template_callees_checks_and_the_kernels_names(tmp_path):
    op = scan_extension(_project(tmp_path)).namespaces["filters"]["smooth"]
    assert op.hints["a"] == {"rank": 2, "cxx": "signal"}
    assert op.hints["b"] == {"rank": 3, "cxx": "taps"}
    assert op.hints["c"] == {"rank": 1, "cxx": "state"}
    params = with_kernel_names(parse_params(op.schema), op.hints)
    assert [p.cxx for p in params] == ["signal", "taps", "state"]


def test_init_writes_the_stub_from_those_hints(tmp_path):
    """The stub init writes already has the ranks the kernel checks (a 1-D c)."""
    from opforge import init

    _, files = init.plan_files(_project(tmp_path), torch_version="2.13.0", python="3.11",
                               workflows_ref="f" * 40)
    recipes = next(text for path, text in files.items() if str(path).endswith("_recipes.py"))
    stub = recipes.split('"smooth"')[1].split("},")[0]
    assert ".reshape(8, 8, 8)" in stub and "torch.linspace(0.1, 1, 8, dtype=dtype).reshape(8)," in stub


class _Pybind:
    """A stand-in for a pybind11 function: its signature lives in its docstring."""

    __name__ = "cluster"
    __doc__ = "cluster(X: torch.Tensor, eps: float, min_samples: int = 1) -> torch.Tensor\n\nDoc."

    def __call__(self, *args):
        raise AssertionError("not called")


def test_a_pybind11_functions_docstring_gives_its_schema():
    assert signature_of(_Pybind()) == "cluster(Tensor X, float eps, int min_samples=1)"


def test_a_python_functions_signature_gives_its_schema():
    def pool(x, index, size=4, reduce="sum", out=None):
        return x

    assert signature_of(pool) == \
        "pool(Tensor x, Tensor index, int size=4, str reduce='sum', Tensor? out=None)"


def test_an_unknown_pybind11_type_falls_back_or_says_none():
    class Odd(_Pybind):
        __doc__ = "cluster(X: torch.Tensor, opts: my.Options) -> torch.Tensor"

    assert signature_of(Odd()) is None


BRANCHES = """
#include <torch/extension.h>

at::Tensor pool_kernel(at::Tensor src, at::Tensor idx, at::Tensor w, at::Tensor g) {
    if (src.dim() == 1)
        src = src.unsqueeze(-1);
    TORCH_CHECK(g.size(0) == 1 || g.size(0) == src.size(0), "g must fit");
    auto a = idx.accessor<int64_t, 2>();
    auto M = w.size(2);
    return src;
}

class Pool : public torch::autograd::Function<Pool> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext *ctx,
      at::Tensor src, at::Tensor idx, at::Tensor w, at::Tensor g) {
    return {pool_kernel(src, idx, w, g)};
  }
};

at::Tensor pool(at::Tensor src, at::Tensor idx, at::Tensor w, at::Tensor g) {
  return Pool::apply(src, idx, w, g)[0];
}

static auto registry = torch::RegisterOperators().op("pools::pool", &pool);
"""


def test_hints_come_through_an_autograd_function_and_branches_are_no_requirement(tmp_path):
    _project(tmp_path)
    (tmp_path / "filters" / "smooth.cpp").write_text(BRANCHES)
    op = scan_extension(tmp_path).namespaces["pools"]["pool"]
    assert "rank" not in op.hints.get("src", {})   # `if (src.dim() == 1)` handles, not needs
    assert op.hints["idx"] == {"rank": 2, "dtype": "int64"}     # accessor<int64_t, 2>
    assert op.hints["w"] == {"min_rank": 3}                     # w.size(2) is read
    assert "sizes" not in op.hints.get("g", {})                 # one side of an ||
