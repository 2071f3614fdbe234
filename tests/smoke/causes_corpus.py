"""Small op extensions, each planted with one mistake authors really make, for test_causes.

One setuptools project (``setup.py`` + ``CppExtension`` + ``TORCH_LIBRARY``, Python
``register_fake`` / ``register_autograd`` in the style of pytorch/extension-cpp) holds several
packages, one planted mistake each, so one ``pip wheel`` builds them all (compiles through
sccache). Binaries no compiler would produce on purpose (a library needing a CUDA library, a
too-new glibc, a file that is not ELF) are made with gcc from a few lines of C.

| package | namespace configured | the mistake |
| --- | --- | --- |
| myops | myops | ``TORCH_LIBRARY(my_ops, m)``; Python registers for ``myops::`` |
| implz | implz | ``TORCH_LIBRARY_IMPL(implzz, CPU, m)``; one ``m.impl("clampp", ...)`` |
| lazyops | lazyops | ``_C.so`` in the package, ``__init__`` never imports it |
| twice | twice | two libraries, each ``TORCH_LIBRARY(twice, m)`` |
| fakeless | fakeless | ``register_fake`` for one op of two |
| pyreg | pyreg | pure Python: ``register_fake("pyreg::scaled_ad")`` (op is ``scaled_add``) |
| nothing | nothing | pure Python, registers no op at all |
| cudaside | cudaside | ``_C.so`` links ``libc10_cuda.so`` (a CUDA build beside a CPU torch) |
| newglibc | newglibc | ``_C.so`` needs ``GLIBC_9.9.9`` |
| notelf | notelf | ``_C.so`` is a text file |
| oldpy | oldpy | ``_C.cpython-39-...so``: an extension module for another Python |
| driftsym | driftsym | ``_C.so`` needs a c10 symbol torch does not export; the wheel pins torch 2.12.0 |
| pinned | pinned | pure Python, the wheel pins torch 2.12.0 (installed beside another torch) |
"""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

OPS_H = '''
#include <ATen/core/Tensor.h>
#include <ATen/ops/add.h>
#include <ATen/ops/clamp.h>
#include <ATen/ops/mul.h>
#include <torch/library.h>

static at::Tensor scaled_add(const at::Tensor& x, const at::Tensor& y, double a) {
  return at::add(x, at::mul(y, a));
}
static at::Tensor scaled_mul(const at::Tensor& x, double a) { return at::mul(x, a); }
static at::Tensor clamp01(const at::Tensor& x) { return at::clamp(x, 0.0, 1.0); }

#define DEFINE_OPS(m)                                                   \\
  m.def("scaled_add(Tensor x, Tensor y, float a) -> Tensor");          \\
  m.def("scaled_mul(Tensor x, float a) -> Tensor");                    \\
  m.def("clamp01(Tensor x) -> Tensor");
'''

SOURCES = {
    # the schemas went to my_ops; everything else (Python, the config) says myops
    "csrc/myops.cpp": '''
        #include "ops.h"
        TORCH_LIBRARY(my_ops, m) { DEFINE_OPS(m) }
        TORCH_LIBRARY_IMPL(myops, CPU, m) {
          m.impl("scaled_add", &scaled_add);
          m.impl("scaled_mul", &scaled_mul);
          m.impl("clamp01", &clamp01);
        }
    ''',
    # the kernels went to implzz (a typo), and one impl names an op that does not exist
    "csrc/implz.cpp": '''
        #include "ops.h"
        TORCH_LIBRARY(implz, m) { DEFINE_OPS(m) }
        TORCH_LIBRARY_IMPL(implzz, CPU, m) {
          m.impl("scaled_add", &scaled_add);
          m.impl("scaled_mul", &scaled_mul);
        }
        TORCH_LIBRARY_IMPL(implz, CPU, m) { m.impl("clampp01", &clamp01); }
    ''',
    "csrc/lazyops.cpp": '''
        #include "ops.h"
        TORCH_LIBRARY(lazyops, m) { DEFINE_OPS(m) }
        TORCH_LIBRARY_IMPL(lazyops, CPU, m) {
          m.impl("scaled_add", &scaled_add);
          m.impl("scaled_mul", &scaled_mul);
          m.impl("clamp01", &clamp01);
        }
    ''',
    "csrc/twice_a.cpp": '''
        #include "ops.h"
        TORCH_LIBRARY(twice, m) { m.def("scaled_mul(Tensor x, float a) -> Tensor"); }
        TORCH_LIBRARY_IMPL(twice, CPU, m) { m.impl("scaled_mul", &scaled_mul); }
    ''',
    "csrc/twice_b.cpp": '''
        #include "ops.h"
        TORCH_LIBRARY(twice, m) { m.def("clamp01(Tensor x) -> Tensor"); }
        TORCH_LIBRARY_IMPL(twice, CPU, m) { m.impl("clamp01", &clamp01); }
    ''',
    "csrc/fakeless.cpp": '''
        #include "ops.h"
        TORCH_LIBRARY(fakeless, m) {
          m.def("scaled_mul(Tensor x, float a) -> Tensor");
          m.def("clamp01(Tensor x) -> Tensor");
        }
        TORCH_LIBRARY_IMPL(fakeless, CPU, m) {
          m.impl("scaled_mul", &scaled_mul);
          m.impl("clamp01", &clamp01);
        }
    ''',
    "setup.py": '''
        from setuptools import setup
        from torch.utils.cpp_extension import BuildExtension, CppExtension

        def ext(name, source):
            return CppExtension(name, [source], include_dirs=["csrc"],
                                extra_compile_args={"cxx": ["-O0", "-g0"]})

        setup(
            name="planted-causes",
            version="1.0",
            packages=["myops", "implz", "lazyops", "twice", "fakeless", "pyreg", "nothing"],
            ext_modules=[ext("myops._C", "csrc/myops.cpp"), ext("implz._C", "csrc/implz.cpp"),
                         ext("lazyops._C", "csrc/lazyops.cpp"),
                         ext("twice._a", "csrc/twice_a.cpp"), ext("twice._b", "csrc/twice_b.cpp"),
                         ext("fakeless._C", "csrc/fakeless.cpp")],
            cmdclass={"build_ext": BuildExtension},
        )
    ''',
    "myops/__init__.py": '''
        import glob
        import os

        import torch

        torch.ops.load_library(glob.glob(os.path.join(os.path.dirname(__file__), "_C*.so"))[0])


        @torch.library.register_fake("myops::scaled_add")
        def _(x, y, a):
            return torch.empty_like(x)


        def scaled_add(x, y, a):
            return torch.ops.myops.scaled_add(x, y, a)
    ''',
    "implz/__init__.py": '''
        import glob
        import os

        import torch

        torch.ops.load_library(glob.glob(os.path.join(os.path.dirname(__file__), "_C*.so"))[0])


        @torch.library.register_fake("implz::scaled_add")
        def _(x, y, a):
            return torch.empty_like(x)
    ''',
    # the author forgot `from . import _C`
    "lazyops/__init__.py": '''
        import torch


        def scaled_add(x, y, a):
            return torch.ops.lazyops.scaled_add(x, y, a)
    ''',
    "twice/__init__.py": '''
        import glob
        import os

        import torch

        for _lib in sorted(glob.glob(os.path.join(os.path.dirname(__file__), "_*.so"))):
            torch.ops.load_library(_lib)
    ''',
    "fakeless/__init__.py": '''
        import glob
        import os

        import torch

        torch.ops.load_library(glob.glob(os.path.join(os.path.dirname(__file__), "_C*.so"))[0])


        @torch.library.register_fake("fakeless::scaled_mul")
        def _(x, a):
            return torch.empty_like(x)
    ''',
    "pyreg/__init__.py": '''
        import torch

        _lib = torch.library.Library("pyreg", "DEF")
        _lib.define("scaled_add(Tensor x, Tensor y, float a) -> Tensor")
        _lib.impl("scaled_add", lambda x, y, a: x + y * a, "CPU")


        @torch.library.register_fake("pyreg::scaled_ad")
        def _(x, y, a):
            return torch.empty_like(x)
    ''',
    "nothing/__init__.py": '''
        """A package that registers no op."""
        VALUE = 1
    ''',
}


def write_project(root: Path) -> Path:
    (root / "csrc").mkdir(parents=True, exist_ok=True)
    (root / "csrc" / "ops.h").write_text(textwrap.dedent(OPS_H).lstrip(), encoding="utf-8")
    for name, text in SOURCES.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return root


LOADING_INIT = b"import torch\nfrom . import _C  # noqa: F401\n"


def _gcc(*args: str) -> None:
    subprocess.run(["gcc", *args], check=True, capture_output=True, text=True)


def broken_binaries(work: Path) -> dict[str, bytes]:
    """Wheel members (path -> bytes) of the packages whose library cannot load, made by gcc."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "dep.c").write_text("int dep_value(void) { return 1; }\n", encoding="utf-8")
    (work / "lib.c").write_text(
        "int dep_value(void);\nint touch(void) { return dep_value(); }\n",
        encoding="utf-8")
    (work / "plain.c").write_text(
        "#include <string.h>\n"
        "void touch(char *a, const char *b, unsigned long n) { memcpy(a, b, n); }\n",
        encoding="utf-8")
    # a stand-in for torch's CUDA library, linked by name and then left out
    _gcc("-shared", "-fPIC", "-o", str(work / "libc10_cuda.so"), "-Wl,-soname,libc10_cuda.so",
         str(work / "dep.c"))
    _gcc("-shared", "-fPIC", "-o", str(work / "cudaside.so"), str(work / "lib.c"),
         f"-L{work}", "-lc10_cuda")
    _gcc("-shared", "-fPIC", "-fno-builtin", "-o", str(work / "plain.so"), str(work / "plain.c"))
    plain = (work / "plain.so").read_bytes()
    # the version a newer glibc would have given memcpy (same length: the binary stays valid)
    assert b"GLIBC_2.2.5" in plain or b"GLIBC_2.14" in plain
    newer = plain.replace(b"GLIBC_2.2.5", b"GLIBC_9.9.9").replace(b"GLIBC_2.14", b"GLIBC_9.99")
    files = {
        "cudaside/__init__.py": LOADING_INIT, "cudaside/_C.so": (work / "cudaside.so").read_bytes(),
        "newglibc/__init__.py": LOADING_INIT, "newglibc/_C.so": newer,
        "notelf/__init__.py": LOADING_INIT, "notelf/_C.so": b"version https://git-lfs.github.com\n",
        "oldpy/__init__.py": LOADING_INIT, "oldpy/_C.cpython-39-x86_64-linux-gnu.so": plain,
    }
    return files


def drifted_binary(work: Path) -> bytes:
    """A library calling a c10 function the running torch does not export (``undefined
    symbol``), as one built against another torch release does when that function moved."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "drift.c").write_text("void _ZN3c1023opforge_planted_removedEv(void);\n"
                                  "void call(void) { _ZN3c1023opforge_planted_removedEv(); }\n",
                                  encoding="utf-8")
    _gcc("-shared", "-fPIC", "-o", str(work / "drift.so"), str(work / "drift.c"))
    return (work / "drift.so").read_bytes()

