"""A read wheel judged against its matrix variant: ``check_against_variant`` lists the ways the
wheel contradicts its entry (tags, torch pin or floor, build record, variant label, the ABI
audit, the backend's own device-code rules); ``opforge inspect --expect-variant cu130`` and
``opforge build`` exit 1 on any. ``opforge.wheels`` reads the wheel; this module knows the
matrix."""

from __future__ import annotations

from packaging.version import InvalidVersion, Version

from opforge.matrix import Variant
from opforge.pins import exact_pin, floor_of
from opforge.platforms import backend_of
from opforge.stamp import RECORD_NAME
from opforge.wheels import WheelReport


def check_stable_tags(report: WheelReport, variant: Variant,
                      pythons: tuple[str, ...] = ()) -> list[str]:
    """A stable variant's wheel: tagged abi3, installable on every Python the matrix lists,
    requiring torch>=floor."""
    problems = []
    abi_tags = [t.split("-") for t in report.tags]
    if not abi_tags or any(abi != "abi3" for _, abi, _ in abi_tags):
        problems.append(f"tags {', '.join(report.tags)} are not abi3: a stable-ABI wheel is "
                        "one wheel for every Python (Py_LIMITED_API, py_limited_api)")
    else:
        lowest = min((tuple(int(x) for x in p.rstrip("t").split(".")) for p in pythons
                      if not p.endswith("t")), default=None)
        for interpreter, _, _ in abi_tags:
            digits = interpreter.removeprefix("cp")
            tagged = (int(digits[0]), int(digits[1:])) if digits.isdigit() else None
            if tagged and lowest and tagged > lowest:
                problems.append(f"tag {interpreter}-abi3 needs Python >= {tagged[0]}."
                                f"{tagged[1]}, but the matrix lists Python "
                                f"{lowest[0]}.{lowest[1]}: build with py_limited_api "
                                f"cp{lowest[0]}{lowest[1]}")
    floor = floor_of(report.torch_requirement)
    if floor is None:
        problems.append(f"Requires-Dist has no torch>={variant.torch_floor} (found "
                        f"{report.torch_requirement or 'none'})")
    elif floor != Version(variant.torch_floor or "0"):
        problems.append(f"requires torch>={floor}, but the variant's torch_floor is "
                        f"{variant.torch_floor}")
    return problems


def check_against_variant(report: WheelReport, variant: Variant,
                          pythons: tuple[str, ...] = (), *, extra_env_ok: bool = False) -> list[str]:
    """Every way the wheel contradicts its matrix entry (empty list: consistent).

    ``pythons``: the matrix's, which a stable variant's abi3 wheel must all install on."""
    problems = []
    # a wheel variant has the public version: every variant of a release shares it
    variant_wheel = isinstance(report.build_info, dict) and "wheel_variant" in report.build_info
    local = None if variant_wheel else variant.wheel_local_version
    if report.local_version != local:
        expected = (f"+{local}" if local else "none (a wheel variant)" if variant_wheel else
                    f"none (variant {variant.name} goes to PyPI, which refuses local versions)")
        problems.append(f"local version is {report.local_version or 'missing'}, expected "
                        f"{expected}")
    pinned = exact_pin(report.torch_requirement)
    if variant.stable:
        problems += check_stable_tags(report, variant, pythons)
    elif pinned is None:
        problems.append(f"no exact torch pin in Requires-Dist (found "
                        f"{report.torch_requirement or 'none'})")
    info = report.build_info
    if not info or "error" in info:
        problems.append(f"no readable build record (.dist-info/{RECORD_NAME}): the wheel was "
                        "not stamped by opforge build")
        info = {}
    else:
        if info.get("variant") != variant.name:
            problems.append(f"build info says variant {info.get('variant')!r}, expected "
                            f"{variant.name!r}")
        built = info.get("torch_version")
        try:
            built_version = Version(built) if built else None
        except InvalidVersion:
            problems.append(f"build info's torch_version {built!r} is not a version")
            built_version = None
        if built_version and pinned:
            if pinned.public != built_version.public:
                problems.append(f"torch pin {report.torch_requirement} differs from the torch "
                                f"it was built against ({built})")
        if info.get("version") and info["version"] != report.version:
            problems.append(f"build record says version {info['version']}, the wheel is "
                            f"{report.version}")
        if info.get("omitted_kernels"):  # records of opforge before --build-env
            problems.append(f"kernels left out at build time: {info['omitted_kernels']}")
        if info.get("build_env") and not extra_env_ok:
            given = ", ".join(f"{k}={v}" for k, v in info["build_env"].items())
            problems.append(f"built with extra build environment ({given}): not a release build")
    compiled = report.libraries
    problems += [f"{lib.path}: {lib.note}" for lib in compiled if lib.note]
    cuda_major = backend_of(variant).record_fields(variant)["cuda_major"]
    problems += report.abi_problems(stable=variant.stable, torch_floor=variant.torch_floor,
                                    cuda_major=cuda_major or "")
    # the platform backend's rules: device code (from the code itself; a pure-Python wheel
    # of custom_op kernels has none), toolkit and architectures, platform tags
    problems += backend_of(variant).check_wheel(report, variant, info)
    return problems
