"""The build matrix as frozen, typed objects: an extension and its ops, the torch channel,
platforms, variants and the jobs they expand to.

``opforge.matrix.parser`` makes these from matrix.yaml; everything after it receives them.
A variant answers, in one place each: what its wheel promises (``Matrix.promises``), where
its wheels go (``Matrix.dist_dir``), which variant a wheel is (``Matrix.identify``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from packaging.version import Version

from opforge.dispatch_keys import NO_KERNEL_DEVICES, backward_keys, device_of
from opforge.errors import UsageError
from opforge.platforms import get

CHANNELS = ("stable", "test", "nightly")


def check_channel_variable(name: str, value: str) -> None:
    """OPFORGE_TORCH_CHANNEL's value: one of the matrix's channels."""
    if value not in CHANNELS:
        raise UsageError(f"{name}={value!r} is not one of {', '.join(CHANNELS)}")
# the words a compat_torch list may hold beside release versions
COMPAT_WORDS = ("floor", "matrix", "latest", "nightly")


class MatrixError(UsageError):
    """matrix.yaml is malformed; the message is ``file:line: key: what is wrong``."""


# --------------------------------------------------------------------------- typed objects


@dataclass(frozen=True)
class Op:
    """One op of the namespace and how its expected keys differ from its variant's defaults.

    ``keys`` replaces the defaults, ``add`` / ``remove`` edit them; a backward-only op
    (``backward: true``) defaults to the variant's backend keys and Meta. In a variant that
    does not build a device, that device's keys (CUDA, AutocastCUDA, ...) are dropped.
    ``no_kernel`` names the devices the op has no kernel for by design (its kernel raises
    "No CPU version supported"): their keys are not expected, and the smoke test skips the
    op's checks there with that reason.
    """

    name: str
    backward: bool = False
    keys: tuple[str, ...] | None = None
    add: tuple[str, ...] = ()
    remove: tuple[str, ...] = ()
    no_kernel: tuple[str, ...] = ()     # devices (cpu, cuda, mps) without a kernel by design
    max_slowdown: float | None = None   # the smoke speed check's factor for this op

    def expected_keys(self, variant: Variant) -> tuple[str, ...]:
        if self.keys is not None:
            keys = list(self.keys)
        elif self.backward:
            keys = list(variant.backend_keys)
        else:
            keys = list(variant.expected_keys)
        keys += [k for k in self.add if k not in keys]
        keys = [k for k in keys if k not in self.remove and k not in self.no_kernel_keys]
        return tuple(k for k in keys if device_of(k) in (None, *variant.backends))

    @property
    def no_kernel_keys(self) -> frozenset[str]:
        """The keys of the ``no_kernel`` devices: the backend's, its autocast's and autograd's."""
        words = [NO_KERNEL_DEVICES[d] for d in self.no_kernel]
        return frozenset(k for w in words for k in (w, f"Autocast{w}", f"Autograd{w}"))


@dataclass(frozen=True)
class Module:
    """A compiled module the package ships for one backend (``extension.modules``).

    ``load: import``: a Python extension module (pybind11) that must import and export
    ``functions``; ``load: library``: a library the package loads with
    ``torch.ops.load_library`` that must register ``functions`` (its ops). A variant promises
    the cpu modules and those of the backends it builds.
    """

    name: str                        # the dotted import name, e.g. mypkg._ext_cuda
    backend: str = "cpu"
    load: str = "import"
    functions: tuple[str, ...] = ()


MODULE_BACKENDS = ("cpu", "cuda", "mps")
MODULE_LOADS = ("import", "library")


@dataclass(frozen=True)
class Promises:
    """What a wheel must hold, and all the smoke probe is told: the keys each op must register,
    which ops are backward-only, the keys an op nobody declared gets, the compiled modules."""

    op_keys: dict[str, tuple[str, ...]] = field(default_factory=dict, hash=False)
    backward_ops: tuple[str, ...] = ()
    default_keys: tuple[str, ...] = ()
    modules: tuple[Module, ...] = ()
    # op -> the devices it has no kernel for by design (matrix.yaml: no_kernel)
    no_kernel: dict[str, tuple[str, ...]] = field(default_factory=dict, hash=False)

    @property
    def empty(self) -> bool:
        return not (self.op_keys or self.default_keys or self.modules)


def promises(extension: Extension | None, variant: Variant | None, *,
             keys: Sequence[str] | None = None, ops: Sequence[str] | None = None,
             backward_ops: Sequence[str] | None = None) -> Promises:
    """What ``variant``'s wheel of ``extension`` promises, or what ``keys`` / ``ops`` /
    ``backward_ops`` (the command line's) say instead.

    ``keys`` replaces the variant's keys for every op (each op's own rules then do not apply;
    a backward-only op gets their backend keys and Meta); ``ops`` / ``backward_ops`` replace
    the extension's op lists. With no extension and no variant, only the given ones.
    """
    default = tuple(keys) if keys is not None else (variant.expected_keys if variant else ())
    forward = tuple(ops) if ops is not None else (extension.ops if extension else ())
    backward = tuple(backward_ops) if backward_ops is not None else \
        (extension.internal_ops if extension else ())
    specs = {op.name: op for op in extension.op_specs} if extension else {}
    op_keys = {}
    for op in (*forward, *backward):
        if keys is None and variant is not None and op in specs:
            op_keys[op] = specs[op].expected_keys(variant)
        elif op in backward:
            op_keys[op] = backward_keys(default)
        else:
            op_keys[op] = default
    modules = extension.modules_for(variant) if extension and variant else ()
    no_kernel = {op: specs[op].no_kernel for op in op_keys
                 if op in specs and specs[op].no_kernel}
    return Promises(op_keys=op_keys, backward_ops=backward, default_keys=default,
                    modules=modules, no_kernel=no_kernel)


@dataclass(frozen=True)
class Extension:
    path: str
    package: str
    distribution: str
    namespace: str
    op_specs: tuple[Op, ...]
    recipes: str | None = None    # the recipes file, relative to the matrix file's directory
    # smoke fails a device kernel more than this many times slower than the CPU's
    max_slowdown: float = 10.0
    # the ABI every variant builds for unless it says otherwise (see Variant)
    abi: str = "legacy"
    torch_floor: str | None = None
    compat_torch: tuple[str, ...] = ()
    modules: tuple[Module, ...] = ()

    def modules_for(self, variant: Variant) -> tuple[Module, ...]:
        """The compiled modules ``variant``'s wheel must hold: cpu ones and its backends'."""
        return tuple(m for m in self.modules if m.backend in variant.backends)

    def slowdown_factors(self) -> dict[str, float]:
        """op -> its own max_slowdown, for the ops that override the extension's."""
        return {op.name: op.max_slowdown for op in self.op_specs if op.max_slowdown is not None}

    @property
    def ops(self) -> tuple[str, ...]:
        """The forward ops (each called by the smoke test when its recipe says how)."""
        return tuple(op.name for op in self.op_specs if not op.backward)

    @property
    def internal_ops(self) -> tuple[str, ...]:
        """Backward-only ops (reached through their forward op's backward)."""
        return tuple(op.name for op in self.op_specs if op.backward)

    def op_keys(self, variant: Variant) -> dict[str, tuple[str, ...]]:
        """op name -> the keys its wheel must register in ``variant``."""
        return {op.name: op.expected_keys(variant) for op in self.op_specs}

    def promises(self, variant: Variant) -> Promises:
        """Everything ``variant``'s wheel promises: each op's keys, its compiled modules."""
        return promises(self, variant)


@dataclass(frozen=True)
class TorchChannel:
    channel: str
    version: str
    index: str

    def index_url(self, index_variant: str) -> str:
        base = self.index.rstrip("/")
        sub = {"stable": "", "test": "/test", "nightly": "/nightly"}[self.channel]
        return f"{base}{sub}/{index_variant}"


@dataclass(frozen=True)
class Platform:
    name: str
    runner: str
    # Linux: the image every cell of this platform builds in unless its variant names one
    # (a manylinux_2_28 image: the wheel's glibc floor is the image's, not the runner's)
    container: str | None = None

    @property
    def os(self) -> str:
        return self.name.split("-", 1)[0]

    @property
    def arch(self) -> str:
        return self.name.split("-", 1)[1]


@dataclass(frozen=True)
class Variant:
    name: str
    platforms: tuple[str, ...]
    expected_keys: tuple[str, ...]
    container: str | None = None
    torch_version: str | None = None
    index_variant: str | None = None
    device_checks: bool = True
    runner: str | None = None
    abi: str = "legacy"                   # "stable": one abi3 wheel per platform, torch>=floor
    torch_floor: str | None = None        # stable only: the oldest torch the wheel loads on
    compat_torch: tuple[str, ...] = ()    # stable only: the torches its compat smoke runs on
    # variables its build gets as written, after opforge's toolchain (CUDA_HOME for a cpu
    # variant that needs a toolkit's headers, a switch of the project's own build)
    build_env: tuple[tuple[str, str], ...] = ()
    pypi: bool = False                    # its wheels go to PyPI: no local label (+cpu)
    # its platform backend (opforge.platforms): cpu, cuda, mps, rocm, xpu or one registered;
    # toolkit: its toolkit version (CUDA 13.0, matrix.yaml's cuda:; ROCm 6.4; oneAPI 2025.1);
    # options: the settings only its backend reads, (key, value) pairs in the backends'
    # option_fields order (arch_list, macos_deployment_target)
    backend: str = "cpu"
    toolkit: str | None = None
    options: tuple[tuple[str, str], ...] = ()

    def option(self, key: str, default: str | None = None) -> str | None:
        """One of its backend's settings (``arch_list``...), or ``default`` when unset."""
        return next((value for k, value in self.options if k == key), default)

    @property
    def stable(self) -> bool:
        return self.abi == "stable"

    @property
    def torch_requirement_floor(self) -> str | None:
        """``torch>=2.10`` for a stable variant (None: legacy, pinned to its build torch)."""
        return f"torch>={self.torch_floor}" if self.stable else None

    @property
    def backends(self) -> tuple[str, ...]:
        device = get(self.backend).device
        return ("cpu", device) if device else ("cpu",)

    @property
    def backend_keys(self) -> tuple[str, ...]:
        """The keys backward-only ops must register by default: backends plus Meta."""
        return backward_keys(self.expected_keys)

    @property
    def local_version(self) -> str:
        """The wheel's PEP 440 local label: the name, normalized (``cpu_stable`` ->
        ``cpu.stable``, as pip and packaging spell it)."""
        return self.name.replace("_", ".")

    @property
    def wheel_local_version(self) -> str | None:
        """The label its wheels carry: none for the PyPI variant (PyPI refuses local
        versions; its build record keeps the variant)."""
        return None if self.pypi else self.local_version

    @property
    def build_session(self) -> str:
        return f"build_{self.name}"

    def dist_dir(self, root: Path) -> Path:
        """Where its wheels go under the repository ``root``: ``dist/<variant>``."""
        return Path(root) / "dist" / self.name


@dataclass(frozen=True)
class Job:
    """One cell: a wheel for one variant, platform and Python."""

    variant: Variant
    platform: Platform
    python: str
    torch_spec: str
    torch_index: str
    distribution: str = "extension"

    @property
    def name(self) -> str:
        return f"{self.variant.name}-{self.platform.name}-py{self.python}"

    @property
    def runner(self) -> str:
        return self.variant.runner or self.platform.runner

    @property
    def artifact(self) -> str:
        """The wheel's artifact: one per cell, or one per platform for a stable variant."""
        if self.variant.stable:
            return f"wheel-{self.variant.name}-{self.platform.name}-abi3"
        return f"wheel-{self.name}"

    @property
    def container(self) -> str | None:
        """The image the cell builds in: its variant's, else its Linux platform's."""
        return self.variant.container or self.platform.container

    @property
    def torch_install(self) -> str:
        pre = "--pre " if ".dev" in self.torch_spec or self.torch_spec == "torch" else ""
        return f"pip install {pre}{self.torch_spec} --index-url {self.torch_index}"

    def as_dict(self) -> dict[str, Any]:
        v = self.variant
        record = get(v.backend).record_fields(v)  # the build record's cuda and mps
        return {
            "name": self.name,
            "build_name": f"{self.distribution}-{v.name}-{self.platform.name}-py{self.python}",
            "variant": v.name,
            "platform": self.platform.name,
            "os": self.platform.os,
            "arch": self.platform.arch,
            "python": self.python,
            "runner": self.runner,
            "container": self.container or "",
            # the CPython inside a manylinux builder image (its PATH python is conda's)
            "container_python": (f"/opt/python/cp{self.python.replace('.', '')}-"
                                 f"cp{self.python.replace('.', '')}/bin/python"
                                 if self.container else ""),
            "pypi": v.pypi,
            "backend": v.backend,
            "toolkit": v.toolkit or "",
            "cuda": record["cuda_version"] or "",
            "arch_list": v.option("arch_list") or "",
            "mps": record["mps"],
            "macos_deployment_target": record["macos_deployment_target"] or "",
            "torch_spec": self.torch_spec,
            "torch_index": self.torch_index,
            "torch_install": self.torch_install,
            "build_session": v.build_session,
            "artifact": self.artifact,
            "expected_keys": ",".join(v.expected_keys),
            "device_checks": v.device_checks,
            "abi": v.abi,
            "torch_floor": v.torch_floor or "",
            "compat_torch": ",".join(v.compat_torch),
        }


@dataclass(frozen=True)
class Matrix:
    path: Path
    extension: Extension
    torch: TorchChannel
    pythons: tuple[str, ...]
    pr_python: str
    platforms: dict[str, Platform] = field(hash=False)
    variants: tuple[Variant, ...]

    def variant(self, name: str) -> Variant:
        for variant in self.variants:
            if variant.name == name:
                return variant
        known = ", ".join(v.name for v in self.variants)
        raise UsageError(f"unknown variant {name!r} in {self.path.name} (known: {known})")

    @property
    def root(self) -> Path:
        """The repository the matrix describes: the matrix file's directory."""
        return self.path.parent

    def promises(self, variant: str | Variant) -> Promises:
        """What ``variant``'s wheel must hold (see ``Extension.promises``)."""
        if isinstance(variant, str):
            variant = self.variant(variant)
        return self.extension.promises(variant)

    def identify(self, record_variant: str | None = None,
                 local_label: str | None = None) -> tuple[Variant, str] | None:
        """Which variant a wheel is, and by what: the variant its build record names
        (``"build record"``), else the one whose local version label it carries
        (``"local version"``: ``+cpu.stable`` or ``+cpu_stable`` is cpu_stable); None when
        neither names one of this matrix's variants."""
        by_name = {v.name: v for v in self.variants}
        if record_variant in by_name:
            return by_name[record_variant], "build record"
        if local_label:
            label = local_label.replace("_", ".").lower()
            for v in self.variants:
                if v.local_version == label:
                    return v, "local version"
        return None

    def dist_dir(self, variant: str | Variant) -> Path:
        """Where ``variant``'s wheels go: ``dist/<variant>`` beside the matrix file."""
        if isinstance(variant, str):
            variant = self.variant(variant)
        return variant.dist_dir(self.root)

    def torch_spec(self, variant: Variant) -> str:
        version = variant.torch_version or self.torch.version
        if self.torch.channel == "nightly" and version == "latest":
            return "torch"
        return f"torch=={version}"

    def torch_index(self, variant: Variant) -> str:
        return self.torch.index_url(variant.index_variant or _default_index_variant(variant))

    def nightly_index(self, variant: Variant) -> str:
        """Where the compat list's ``nightly`` comes from: the variant's nightly index."""
        return replace(self.torch, channel="nightly").index_url(
            variant.index_variant or _default_index_variant(variant))

    def jobs(self, variant: str | None = None, platform: str | None = None,
             python: str | None = None, pull_request: bool = False) -> list[Job]:
        for value, known, what in ((variant, [v.name for v in self.variants], "variant"),
                                   (platform, list(self.platforms), "platform"),
                                   (python, list(self.pythons), "python")):
            if value is not None and value not in known:
                raise UsageError(f"unknown {what} {value!r} (known: {', '.join(known)})")
        jobs = []
        for v in self.variants:
            if variant is not None and v.name != variant:
                continue
            for plat in v.platforms:
                if platform is not None and plat != platform:
                    continue
                for py in self.pythons:
                    if python is not None and py != python:
                        continue
                    if pull_request and py != self.pr_python:
                        continue
                    jobs.append(Job(v, self.platforms[plat], py, self.torch_spec(v),
                                    self.torch_index(v), self.extension.distribution))
        return jobs

    def github_matrix(self, **filters: Any) -> dict[str, list[dict[str, Any]]]:
        return {"include": [job.as_dict() for job in self.jobs(**filters)]}

    def compat_torches(self, variant: Variant, entries: Sequence[str] | None = None) -> list[str]:
        """A stable variant's compat list (or ``entries``, e.g. from the command line) with
        its words resolved: ``floor`` -> the floor (``2.10`` -> ``2.10.0``), ``matrix`` -> the
        variant's build torch; ``latest`` (the newest release the index serves) and
        ``nightly`` stay words."""
        out: list[str] = []
        for entry in variant.compat_torch if entries is None else entries:
            if entry == "floor":
                value = str(Version(variant.torch_floor or "0"))
                value += ".0" * (2 - value.count("."))
            elif entry == "matrix":
                value = self.torch_spec(variant).removeprefix("torch==")
            else:
                value = entry
            if value not in out:
                out.append(value)
        return out


def _default_index_variant(variant: Variant) -> str:
    """A variant's PyTorch index, its backend's (opforge.platforms): cpu, cu<major><minor>,
    rocm<version>, xpu (matrix.yaml's index_variant says otherwise)."""
    return get(variant.backend).torch_index(variant)


def build_jobs(jobs: list[Job], pr_python: str | None = None) -> list[Job]:
    """The cells that compile: every legacy cell; one cell per platform for a stable variant
    (its abi3 wheel serves every Python), the one on ``pr_python`` when it is among them."""
    chosen: dict[tuple[str, str], Job] = {}
    out: list[Job] = []
    for job in jobs:
        if not job.variant.stable:
            out.append(job)
            continue
        key = (job.variant.name, job.platform.name)
        if key not in chosen:
            chosen[key] = job
            out.append(job)
        elif job.python == pr_python and chosen[key].python != pr_python:
            out[out.index(chosen[key])] = job
            chosen[key] = job
    return out


def compat_jobs(jobs: list[Job], pr_python: str | None = None) -> list[Job]:
    """One torch-compat cell per stable variant and platform (the build cell's Python)."""
    return [job for job in build_jobs(jobs, pr_python) if job.variant.stable]
