"""What a scan finds: the ops, compiled modules and build-configured extensions of one
source tree (``Scan``), and the vocabulary the readers share."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

SKIP_DIRS = {".git", ".nox", ".venv", "venv", "build", "dist", "node_modules", "__pycache__",
             ".tox", "third_party", "docs", ".github", ".eggs"}
CXX_SUFFIXES = (".cpp", ".cc", ".cxx", ".cu", ".mm", ".h", ".hpp", ".cuh")
# what a registration alias provides, in the terms matrix.yaml uses
ALIAS_KEYS = {"CompositeExplicitAutograd": ("CPU", "CUDA", "MPS"),
              "CompositeImplicitAutograd": ("CPU", "CUDA", "MPS", "Autograd"),
              "AutogradCPU": ("Autograd",), "AutogradCUDA": ("Autograd",),
              "AutogradMPS": ("Autograd",), "Autograd": ("Autograd",)}

NOT_PACKAGES = {"tests", "test", "benchmarks", "examples", "docs", "scripts", "tools"}
BACKEND_SUFFIXES = (("cuda", ("_cuda", "cuda", "_gpu", "_cu")), ("mps", ("_mps", "_metal")),
                    ("cpu", ("_cpu", "cpu")))


@dataclass
class ScannedOp:
    name: str
    schema: str | None = None
    keys: set[str] = field(default_factory=set)
    mutating: bool = False
    where: str = ""
    inferred: bool = False   # schema inferred from a C++ or Python signature, not written
    hints: dict[str, dict] = field(default_factory=dict)  # argument -> {rank, dtype} checked
    pending_impl: str = ""   # the CPU kernel's registration, read for hints after the scan
    named: set[str] = field(default_factory=set)  # keys a registration named (not an alias)

    def register(self, key: str) -> None:
        """A kernel registered under ``key``: the keys it provides, in matrix.yaml's terms (an
        alias's several); a key named for itself is remembered in ``named``, so init can tell
        an HPU kernel from the composite kernel that also serves HPU."""
        if key in ALIAS_KEYS:
            self.keys.update(ALIAS_KEYS[key])
        else:
            self.keys.add(key)
            self.named.add(key)

    @property
    def backward_only(self) -> bool:
        return "backward" in self.name.lower()


@dataclass
class ScannedModule:
    """A compiled module of the package: a pybind11 module the package imports, or a library
    it loads with ``torch.ops.load_library`` (``load == "library"``), and the backend it serves."""

    name: str                                  # the dotted import name
    backend: str = "cpu"
    load: str = "import"
    functions: dict[str, str | None] = field(default_factory=dict)  # name -> signature
    hints: dict[str, dict[str, dict]] = field(default_factory=dict)  # name -> argument hints
    sources: list[str] = field(default_factory=list)
    where: str = ""


@dataclass
class BuiltExtension:
    """One extension module the build configuration compiles (setup.py or CMakeLists.txt)."""

    name: str
    sources: list[str] | None     # relative to the root; None when computed at build time
    kind: str
    where: str
    # "TLA_BUILD_EXT=1": built only when the package's own variable is set, which no variant
    # sets by default (an opt-in build): not promised
    opt_in: str | None = None

    @property
    def backend(self) -> str:
        last = self.name.rsplit(".", 1)[-1].lower()
        for backend, suffixes in BACKEND_SUFFIXES:
            if last.endswith(suffixes):
                return backend
        if self.sources and all(s.endswith((".cu", ".cuh")) for s in self.sources):
            return "cuda"
        if self.kind == "CUDAExtension" and self.sources and \
                any(s.endswith(".cu") for s in self.sources):
            return "cuda"  # nvcc compiles it: only a CUDA build has it
        return "cpu"


@dataclass
class Scan:
    root: Path
    distribution: str | None = None
    package: str | None = None
    build_backend: str | None = None
    namespaces: dict[str, dict[str, ScannedOp]] = field(default_factory=dict)
    modules: dict[str, ScannedModule] = field(default_factory=dict)
    extensions: list[BuiltExtension] = field(default_factory=list)
    sources: dict[str, int] = field(default_factory=dict)   # suffix -> count
    notes: list[str] = field(default_factory=list)
    found: dict[str, list[str]] = field(default_factory=dict)   # file -> what it registers
    by_hand: list[str] = field(default_factory=list)  # what could not be read, and what to write
    cxx_functions: dict[str, tuple[str, str]] = field(default_factory=dict)  # -> params, body
    # file -> (PYBIND11_MODULE name, functions, hints) before the module's name is resolved
    pybind: dict[str, tuple[str, dict[str, str | None], dict]] = field(default_factory=dict)
    registers: dict[str, set[str]] = field(default_factory=dict)  # file -> qualified op names
    abi_kinds: set[str] = field(default_factory=set)  # "stable" / "legacy" registrations seen
    torch_floor: str | None = None   # from TORCH_TARGET_VERSION in the build configuration
    renamed_backends: set[str] = field(default_factory=set)  # "npu": PrivateUse1 renamed

    @property
    def stable_only(self) -> bool:
        return self.abi_kinds == {"stable"}

    def op(self, namespace: str, name: str, where: str) -> ScannedOp:
        ops = self.namespaces.setdefault(namespace, {})
        if name not in ops:
            ops[name] = ScannedOp(name=name, where=where)
        return ops[name]

    def saw(self, rel: str, what: str) -> None:
        self.found.setdefault(rel, []).append(what)

    @property
    def has_cuda(self) -> bool:
        return bool(self.sources.get(".cu") or self.sources.get(".cuh"))

    @property
    def has_mps(self) -> bool:
        return bool(self.sources.get(".mm") or self.sources.get(".metal"))
