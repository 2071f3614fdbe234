"""A tiny op extension that builds for the LibTorch stable ABI, for the ABI tests.

``tinystable`` has one op, ``tinystable::twice`` (CPU), written against ``torch/csrc/stable``
(STABLE_TORCH_LIBRARY, TORCH_BOX, torch::stable::Tensor). Its setup.py follows opforge's
build contract the way any extension may: ``OPFORGE_ABI=stable`` and ``OPFORGE_TORCH_FLOOR``
turn on TORCH_STABLE_ONLY, TORCH_TARGET_VERSION = the floor, Py_LIMITED_API and the abi3 tag.

``plant`` plants the violation a stable wheel can carry unseen: a call to a shim function
newer than the declared floor (declared by hand, so it compiles against the floor's headers
and only fails at load on a torch that lacks it).
"""

from __future__ import annotations

from pathlib import Path

from projectkit import matrix_yaml, variant_entry, write_tree

# shim functions to plant, with the C declaration that lets the source call one
PLANTS = {
    # first shipped in torch 2.14.0
    "torch_has_storage": ("AOTITorchError torch_has_storage(AtenTensorHandle, bool*);",
                          "bool has = false; torch_has_storage(x.get(), &has);"),
    # first shipped in torch 2.13.0
    "torch_exception_get_what_without_backtrace": (
        "const char* torch_exception_get_what_without_backtrace();",
        "volatile const char* what = torch_exception_get_what_without_backtrace(); (void)what;"),
}

SETUP = '''
    import os

    from setuptools import setup
    from torch.utils.cpp_extension import BuildExtension, CppExtension

    abi = os.environ.get("OPFORGE_ABI", "legacy")
    macros, extra, options = [], {}, {}
    if abi == "stable":
        major, minor = (int(x) for x in os.environ["OPFORGE_TORCH_FLOOR"].split(".")[:2])
        macros += [("TORCH_STABLE_ONLY", None),
                   ("TORCH_TARGET_VERSION", f"0x{major:02x}{minor:02x}000000000000"),
                   ("Py_LIMITED_API", "0x030A0000")]
        extra["py_limited_api"] = True
        options = {"bdist_wheel": {"py_limited_api": "cp310"}}
    setup(
        name="tinystable",
        version="0.1.0",
        packages=["tinystable"],
        ext_modules=[CppExtension("tinystable._C", ["csrc/tiny.cpp"], define_macros=macros,
                                  extra_compile_args={"cxx": ["-O1", "-g0"]}, **extra)],
        cmdclass={"build_ext": BuildExtension.with_options(no_python_abi_suffix=True)},
        options=options,
    )
'''

SOURCE = '''
    #include <Python.h>
    #include <torch/csrc/stable/library.h>
    #include <torch/csrc/stable/ops.h>
    #include <torch/csrc/stable/tensor.h>

    using torch::stable::Tensor;
    {declaration}

    // out = 2 * x, through the stable ABI only
    Tensor twice(Tensor x) {{
      {call}
      Tensor out = torch::stable::empty_like(x);
      const float* src = x.const_data_ptr<float>();
      float* dst = out.mutable_data_ptr<float>();
      for (int64_t i = 0; i < x.numel(); ++i) dst[i] = 2 * src[i];
      return out;
    }}

    STABLE_TORCH_LIBRARY(tinystable, m) {{ m.def("twice(Tensor x) -> Tensor"); }}
    STABLE_TORCH_LIBRARY_IMPL(tinystable, CPU, m) {{ m.impl("twice", TORCH_BOX(&twice)); }}

    // an importable module (limited API only): `import tinystable._C` loads the library
    static struct PyModuleDef module = {{PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr}};
    extern "C" PyObject* PyInit__C(void) {{ return PyModule_Create(&module); }}
'''

INIT = '''
    import torch

    from . import _C  # noqa: F401  (registers torch.ops.tinystable)


    # the stable ABI has no C++ fake kernels: registered from Python, as extensions do
    @torch.library.register_fake("tinystable::twice")
    def _(x):
        return torch.empty_like(x)
'''

RECIPES = '''
    import torch


    def twice_inputs(dtype):
        return [torch.arange(6, dtype=torch.float32).reshape(2, 3)]


    def doubles(call, args, out):
        assert torch.equal(out, args[0] * 2), "twice(x) is not 2 * x"


    RECIPES = {"twice": {"inputs": twice_inputs, "check": doubles}}
'''


def write_project(root: Path, *, floor: str, torch: str = "2.13.0",
                  plant: str | None = None) -> Path:
    """The repository (matrix.yaml + tiny/); returns the matrix file."""
    declaration, call = ("", "")
    if plant:
        decl, call = PLANTS[plant]
        declaration = f'extern "C" {decl}'
    write_tree(root, {
        "tiny/setup.py": SETUP,
        "tiny/csrc/tiny.cpp": SOURCE.format(declaration=declaration, call=call),
        "tiny/tinystable/__init__.py": INIT,
        "tiny/recipes.py": RECIPES,
    })
    stable = variant_entry("cpu_stable", ("CPU", "Meta"), index_variant="cpu", abi="stable",
                           torch_floor=floor, compat_torch=["floor", "matrix"])
    (root / "matrix.yaml").write_text(matrix_yaml(
        "tinystable", ["twice"], path="tiny", recipes="tiny/recipes.py", version=torch,
        index=None, variants=[stable]), encoding="utf-8")
    return root / "matrix.yaml"
