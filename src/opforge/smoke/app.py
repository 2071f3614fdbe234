"""``opforge smoke``'s application: the plan made (``opforge.smoke.plan``), the wheel installed
where users run, the probe run there, the causes added, the report and its files; ``--compat``:
the one wheel beside each torch.

``opforge.cli.smoke`` parses the command line and calls ``run``.
"""

from __future__ import annotations

import json
import sys

from packaging.version import InvalidVersion, Version

from opforge.errors import UsageError
from opforge.files import write_atomic
from opforge.matrix import COMPAT_WORDS
from opforge.progress import say
from opforge.smoke import compat, report
from opforge.smoke.plan import (
    Options,
    Plan,
    choose_installed,
    load_matrix_of,
    make_plan,
)
from opforge.smoke.probe.causes import add_cause
from opforge.smoke.runner import (
    add_check,
    cleanup,
    device_code_cause,
    prepare_environment,
    run_probe,
    torch_mismatch,
)
from opforge.torchsource import resolve_index


def run(options: Options) -> int:
    """``opforge smoke`` with its options: the exit code (0 pass, 1 fail)."""
    if options.compat_torch is not None and not options.compat_torch:
        raise UsageError("--compat-torch '': name at least one torch (2.13.0, floor, matrix, "
                         "latest, nightly), or leave the option out")
    plan = make_plan(options)
    target, request, choice = plan.target, plan.request, plan.choice
    variant = choice.variant
    if options.compat or options.compat_torch:
        return run_compat(plan)
    if request.default_keys:
        expecting = f", expecting {','.join(request.default_keys)}"
        if any(keys != request.default_keys for keys in request.op_keys.values()):
            expecting += " (some ops their own keys)"
    elif choice.pending:
        expecting = ", expected keys from the variant the installed build info names"
    else:
        expecting = ", no expected keys (census is informational; pass --variant or --expect-keys)"
    say(f"opforge smoke: {target.describe()}" + (f", variant {variant}" if variant else "")
        + expecting)
    env = prepare_environment(target)
    try:
        request, choice = choose_installed(options, env, request, choice)
        variant = choice.variant
        doc = run_probe(env, request)
    finally:
        cleanup(env, keep=options.keep_env)
    if variant:
        doc["variant"] = variant
        if choice.source:
            doc["variant_source"] = choice.source
    mismatch = torch_mismatch(target.variant_torch, env.torch_installed)
    if mismatch:
        add_check(doc, "torch-variant", "fail", mismatch, category="environment")
        if not any(c["class"] == "wrong_torch" for c in doc.get("causes") or []):
            add_cause(doc, "wrong_torch", "the environment's torch is not the variant's",
                      [mismatch], f"install {target.variant_torch} (the matrix's torch for "
                      f"{variant}) before the wheel, or fix the wheel's torch pin",
                      explains=["torch-variant"])
    matrix = plan.matrix if variant and target.wheel else None  # a variant comes from it
    if matrix is not None:
        device_code_cause(doc, target.wheel, matrix.variant(variant))
    if choice.pending:
        # neither the arguments nor the build record named a variant: nothing was promised
        names = [v.name for v in plan.matrix.variants]  # pending: the matrix's own package
        add_check(doc, "variant", "warn", f"{request.package} names no variant of "
                  f"{', '.join(names)} in its build record, so no kernel was "
                  "required: pass --variant", category="environment")
    report.render_terminal(doc)
    if options.keep_env and env.env_dir:
        print(f"environment kept at {env.env_dir} (python: {env.python})", file=sys.stderr)
    return emit(options, doc)


def emit(options: Options, doc: dict) -> int:
    """The report's files (--json, --junit) and the GitHub summary; the exit code."""
    if options.json:
        write_atomic(options.json, json.dumps(doc, indent=1) + "\n")
    if options.junit:
        report.write_junit(doc, options.junit)
    report.publish_github(doc)
    return report.exit_code(doc)


def compat_torches(options: Options, variant: str | None) -> list[str]:
    """--compat-torch, else the variant's compat_torch list (its words resolved)."""
    if options.compat_torch:
        for entry in options.compat_torch:
            if entry in COMPAT_WORDS:
                continue
            try:
                Version(entry)
            except InvalidVersion:
                raise UsageError(f"--compat-torch: {entry!r} is not a torch release (2.13.0) "
                                 f"nor one of {', '.join(COMPAT_WORDS)}") from None
        words = [e for e in options.compat_torch if e in COMPAT_WORDS[:2]]  # floor, matrix
        if not words:
            return list(dict.fromkeys(options.compat_torch))
        if variant is None:
            raise UsageError(f"--compat-torch: {words[0]!r} is the floor or build torch of a "
                             "stable variant: give --variant V")
    elif variant is None:
        raise UsageError("--compat needs --variant V (a stable-ABI variant: its compat_torch "
                         "list) or --compat-torch V1,V2")
    matrix = load_matrix_of(options.file, required=True)
    v = matrix.variant(variant)
    if not v.stable:
        if options.compat_torch:
            raise UsageError(f"--compat-torch: floor and matrix name a stable variant's "
                             f"torches; {variant!r} is abi: {v.abi}")
        raise UsageError(f"--compat: variant {variant!r} is abi: {v.abi}; its wheel pins one "
                         "torch. A torch compat matrix needs abi: stable (or --compat-torch)")
    return matrix.compat_torches(v, options.compat_torch or None)


def run_compat(plan: Plan) -> int:
    """``--compat``: the plan's wheel beside each torch, each in a fresh environment."""
    options, target, request = plan.options, plan.target, plan.request
    variant, choice = plan.variant, plan.choice
    if target.python is not None:
        raise UsageError("--compat installs the wheel beside each torch in fresh environments; "
                         "give --wheel or --variant, not --python")
    if options.torch_spec or options.env_dir:
        raise UsageError("--compat chooses each environment's torch: drop --torch / --env-dir")
    torches = compat_torches(options, variant)
    what = target.wheel.name if target.wheel else target.requirement
    print(f"opforge smoke --compat: {what} beside torch {', '.join(torches)}", file=sys.stderr,
          flush=True)
    nightly = None
    if "nightly" in torches:
        matrix = plan.matrix
        channel = matrix.nightly_index(matrix.variant(variant)) if matrix and variant else None
        nightly = resolve_index(channel, options.torch_index)
    # a variant only the installed build record names is chosen in each environment
    choose = (lambda env, req: choose_installed(options, env, req, choice)[0]) \
        if choice is not None and choice.pending else None
    rows = compat.run_compat(target, request, torches, keep_env=options.keep_env, choose=choose,
                             log=lambda line: print(line, file=sys.stderr, flush=True),
                             nightly_index=nightly)
    doc = compat.combined(rows, what)
    if variant:
        doc["variant"] = variant
    compat.render(rows, what)
    return emit(options, doc)
