"""Read an op extension's sources: its package, namespaces, ops and the kernels each op has.

What is recognised (``opforge init`` writes the configuration from it):

- C++ / CUDA / Objective-C++: ``TORCH_LIBRARY``, ``TORCH_LIBRARY_FRAGMENT`` and
  ``STABLE_TORCH_LIBRARY(_FRAGMENT)`` blocks with ``m.def("name(schema) -> ...")``
  (also through ``TORCH_SELECTIVE_SCHEMA``); ``TORCH_LIBRARY_IMPL(ns, KEY, m)`` and
  ``STABLE_TORCH_LIBRARY_IMPL`` blocks with ``m.impl("name", ...)``.
- Python: ``torch.library.custom_op("ns::name", ..., device_types=...)``, ``define``,
  ``Library(ns, ...)`` + ``lib.define`` / ``lib.impl``, ``register_fake`` / ``impl_abstract``,
  ``register_autograd``, ``register_kernel``, ``register_autocast``, ``impl`` — as calls or
  decorators, with the op named by a string literal.
- Old-style ``torch::RegisterOperators().op("ns::name(schema)" or "ns::name", &fn)`` chains
  (also ``RegisterOperators::options().schema(...).kernel(DispatchKey::X)``); a bare name's
  schema is inferred from the C++ signature of ``fn``, as torch infers it.
- ``PYBIND11_MODULE(name, m)`` with ``m.def("fn", &fn, py::arg(...))``: the module's import
  name comes from the build configuration (``TORCH_EXTENSION_NAME`` is the ``name=`` of the
  setup.py extension whose sources hold the file), and so does the backend it serves (named
  ``*_cuda`` or built only from ``.cu`` sources: CUDA). Libraries the package loads with
  ``torch.ops.load_library`` are the setup.py extensions that register ops but no module.
- The build configuration: ``[project] name`` in pyproject.toml, ``name=`` in setup.py or
  setup.cfg, the build backend, and the package directory.

For each file, what was found is kept (``Scan.found``), and what cannot be read statically
(a name built at run time, a module no build configuration names) is kept with what to write
in matrix.yaml by hand (``Scan.by_hand``).

Nothing is imported or executed: a name built at run time (an f-string, a variable) is not seen.

The readers, one module each: ``cxx`` and ``python`` (the registrations), ``build_files``
(pyproject.toml, setup.py, CMakeLists.txt, and which module each ``PYBIND11_MODULE`` is),
``signatures`` (C++ signatures as schemas, what kernels check); ``model`` holds what a scan
finds and ``text`` the file walk and the helpers they share. ``scan_extension`` runs them.
"""

from __future__ import annotations

import re
from pathlib import Path

from opforge.scan.build_files import resolve_modules, scan_build_config, scan_cmake, scan_setup_py
from opforge.scan.cxx import scan_cxx
from opforge.scan.model import (
    ALIAS_KEYS,
    BACKEND_SUFFIXES,
    CXX_SUFFIXES,
    SKIP_DIRS,
    BuiltExtension,
    Scan,
    ScannedModule,
    ScannedOp,
)
from opforge.scan.python import python_schema_type, scan_python
from opforge.scan.signatures import (
    cxx_params,
    index_functions,
    kernel_hints,
    schema_type,
    tensor_hints,
)
from opforge.scan.text import MAX_SOURCE_BYTES, read_source, source_files, strip_comments

__all__ = ["ALIAS_KEYS", "BACKEND_SUFFIXES", "CXX_SUFFIXES", "MAX_SOURCE_BYTES",
           "SKIP_DIRS", "BuiltExtension", "Scan", "ScannedModule", "ScannedOp", "cxx_params",
           "kernel_hints", "python_schema_type", "resolve_modules", "scan_build_config",
           "scan_cmake", "scan_cxx", "scan_extension", "scan_python", "scan_setup_py",
           "schema_type", "tensor_hints"]


def scan_extension(root: Path) -> Scan:
    scan = Scan(root=root.resolve())
    scan_build_config(scan)
    files = list(source_files(scan.root))
    cxx = [p for p in files if p.suffix in CXX_SUFFIXES]
    for path in cxx:  # every C++ function first: a registration may name one from another file
        index_functions(scan, strip_comments(read_source(path)))
    for path in files:
        suffix = path.suffix
        if suffix in (*CXX_SUFFIXES, ".metal", ".py"):
            scan.sources[suffix] = scan.sources.get(suffix, 0) + 1
        if suffix in CXX_SUFFIXES:
            scan_cxx(scan, path)
        elif suffix == ".py" and path.name not in ("setup.py", "noxfile.py"):
            scan_python(scan, path)
        elif path.name == "CMakeLists.txt":
            scan_cmake(scan, path)
    resolve_modules(scan)
    for ops in scan.namespaces.values():  # schemas and kernels may sit in different files
        for op in ops.values():
            if op.pending_impl and not op.hints:
                op.hints = kernel_hints(scan, op.schema, op.pending_impl)
    for path in (scan.root / "setup.py", scan.root / "CMakeLists.txt", scan.root / "pyproject.toml"):
        if path.is_file():  # 0x020a000000000000: torch 2.10
            m = re.search(r"TORCH_TARGET_VERSION\W+0x([0-9a-fA-F]{2})([0-9a-fA-F]{2})",
                          read_source(path))
            if m:
                scan.torch_floor = f"{int(m.group(1), 16)}.{int(m.group(2), 16)}"
    return scan
