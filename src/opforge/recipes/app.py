"""``opforge recipes --derive``: a working call for every stub recipe, written into the
recipes file as a plain recipe marked ``"derived": True``.

The package is installed where users run it (a fresh environment with the variant's wheel,
or ``--python``); ``worker.TrialWorker`` runs each call the search proposes there, on the
CPU, twice, with a time limit; ``derive.Search`` proposes them from the op's schema (the one
the dispatcher holds, else the stub's ``# schema`` comment), the scan's hints and the op's
own error messages. The recipes file is rewritten whole (a scratch file, then a rename):
stubs replaced, everything else left as it was.
"""

from __future__ import annotations

import difflib
import re
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from opforge.errors import OpforgeError, UsageError
from opforge.files import check_target, read_text, write_file
from opforge.matrix import load_matrix
from opforge.matrix.dist import identify_wheel, latest_wheel
from opforge.recipes import calls as calls_mod
from opforge.recipes.derive import MAX_TRIES, Search
from opforge.recipes.recipes_file import Entry, derived_lines, note_line, rewrite, stub_entries
from opforge.recipes.worker import TrialWorker
from opforge.scan import scan_extension
from opforge.smoke.runner import Target, cleanup, prepare_environment
from opforge.torchsource import resolve_index

OP_WALL_S = 180.0   # one op's search stops after this long, tries left or not


@dataclass
class Outcome:
    table: str
    key: str
    tries: int
    exprs: list[str] | None = None      # the working call's inputs
    described: str = ""
    error: str | None = None            # what the best try ended on, or why none was made
    skipped: bool = False

    @property
    def derived(self) -> bool:
        return self.exprs is not None


@dataclass(frozen=True)
class Limits:
    tries: int = MAX_TRIES
    op_wall_s: float = OP_WALL_S


def _written(entry: Entry) -> str | None:
    """The stub's ``# schema`` comment (init copies the schema or signature there)."""
    comment = entry.comment or ""
    return comment if "(" in comment and (comment.rstrip().endswith(")") or "->" in comment) \
        else None


def params_of(entry: Entry, worker) -> list[calls_mod.Param] | None:
    """The op's parameters as the dispatcher has them (types and defaults), named as the
    sources name them where the dispatcher has only positions (``_0``: a schema torch
    inferred from a C++ function); else those of the stub's ``# schema`` comment."""
    written = _written(entry)
    source = calls_mod.parse_params(written) if written else None
    if entry.table == "RECIPES":
        found = worker.schema(entry.key, entry.overload)
    else:   # a module function: the signature it has where it is installed, if none written
        found = None if source else worker.schema(entry.key, kind="function")
    if not found:
        return source
    params = calls_mod.parse_params(found)
    if source and len(source) == len(params):
        params = [replace(p, name=s.name) if re.fullmatch(r"_\d+|arg\d+", p.name) else p
                  for p, s in zip(params, source)]
    return params


def with_kernel_names(params: list[calls_mod.Param], hints: dict | None) -> list[calls_mod.Param]:
    """The params with the C++ kernel's name at each position (the scan's ``cxx`` hint): the
    kernel's messages and checks name its own parameters, not the schema's."""
    hints = hints or {}
    return [replace(p, cxx=hints[p.name]["cxx"])
            if isinstance(hints.get(p.name), dict) and hints[p.name].get("cxx") else p
            for p in params]


def derive_one(entry: Entry, worker, hints: dict | None, limits: Limits,
               no_kernel: tuple[str, ...] = ()) -> Outcome:
    """One stub's search. It stops at once where no arguments can help: the op has no CPU
    kernel (by design, as matrix.yaml's ``no_kernel`` says, or missing) or does not exist."""
    outcome = Outcome(entry.table, entry.key, 0)
    if entry.table == "FUNCTIONS" and entry.devices and "cpu" not in entry.devices:
        outcome.skipped = True
        outcome.error = (f"its recipe runs on {', '.join(entry.devices)} only; derive calls "
                         "on the CPU")
        return outcome
    if "cpu" in no_kernel:
        outcome.skipped = True
        outcome.error = "matrix.yaml says it has no CPU kernel (no_kernel: [cpu])"
        return outcome
    try:
        params = params_of(entry, worker)
        if params is None:
            outcome.error = (f"no schema or signature to start from: {worker.schema_error}"
                             if getattr(worker, "schema_error", None) else
                             "no schema or signature to start from")
            return outcome
        params = with_kernel_names(params, hints)
        search = Search(params, hints, limits.tries)
    except calls_mod.Unsupported as exc:
        outcome.error = f"cannot make the arguments: {exc}"
        return outcome
    kind = "op" if entry.table == "RECIPES" else "function"
    deadline = time.monotonic() + limits.op_wall_s
    while (call := search.next()) is not None:
        exprs = calls_mod.render_call(call)
        search.tell(worker.call(entry.key, kind, f"lambda dtype: [{', '.join(exprs)}]",
                                overload=entry.overload, mutates=entry.mutates))
        if getattr(worker, "final", False):
            break    # no kernel, no such op: a fault other arguments cannot get past
        if time.monotonic() > deadline and search.found is None:
            break
    outcome.tries = len(search.tries)
    if search.found is not None:
        outcome.exprs = calls_mod.render_call(search.found)
        outcome.described = calls_mod.describe(params, search.found)
    else:
        best = search.best
        outcome.error = best.error if best else "no call to try"
        if time.monotonic() > deadline:
            outcome.error = f"(stopped after {limits.op_wall_s:.0f} s) {outcome.error}"
    return outcome


def derive_text(text: str, entries: list[Entry], worker, hints_of, limits: Limits,
                log=None, no_kernel: dict[str, tuple[str, ...]] | None = None
                ) -> tuple[str, list[Outcome]]:
    """The recipes file with each stub in ``entries`` derived where a call was found."""
    outcomes, replacements, notes = [], {}, {}
    no_kernel = no_kernel or {}
    for entry in entries:
        declared = no_kernel.get(entry.key, ()) if entry.table == "RECIPES" else ()
        outcome = derive_one(entry, worker, hints_of(entry), limits, declared)
        outcomes.append(outcome)
        where = (entry.table, entry.key)
        if outcome.derived:
            replacements[where] = derived_lines(entry, outcome.exprs)
        elif not outcome.skipped:
            notes[where] = note_line(entry, outcome.tries, outcome.error or "")
        if log:
            log(outcome)
    return rewrite(text, replacements, notes, entries), outcomes


def select(entries: list[Entry], ops: tuple[str, ...] | None, label: str) -> list[Entry]:
    """The stubs ``--ops`` names (all without it); a name that is no stub is a usage error."""
    if not ops:
        return entries
    keys = {e.key for e in entries}
    unknown = [op for op in ops if op not in keys]
    if unknown:
        shown = ", ".join(sorted(keys)) or "none"
        raise UsageError(f"--ops: {', '.join(unknown)}: no stub recipe of that name in {label} "
                         f"(its stubs: {shown})")
    return [e for e in entries if e.key in ops]


def scan_hints(root: Path):
    """entry -> the scan's hints for its arguments (``x.dim() == 2``); empty when the
    sources are not there or cannot be read."""
    try:
        scan = scan_extension(root) if root.is_dir() else None
    except (OpforgeError, OSError, ValueError, RecursionError):
        scan = None
    ops: dict[str, dict] = {}
    functions: dict[str, dict] = {}
    if scan is not None:
        for namespace_ops in scan.namespaces.values():
            for op in namespace_ops.values():
                ops.setdefault(op.name, op.hints)
        for module in scan.modules.values():
            for fn, hints in module.hints.items():
                functions[f"{module.name}.{fn}"] = hints

    def hints_of(entry: Entry) -> dict:
        return (ops if entry.table == "RECIPES" else functions).get(entry.key) or {}
    return hints_of


# --------------------------------------------------------------------------- the report

def table(outcomes: list[Outcome]) -> list[str]:
    rows = [("op", "tries", "result", "call / the error its best try ended on")]
    for o in outcomes:
        result = "derived" if o.derived else "skipped" if o.skipped else "stub"
        rows.append((o.key, str(o.tries), result, o.described if o.derived else o.error or ""))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return [f"{r[0]:<{widths[0]}}  {r[1]:>{widths[1]}}  {r[2]:<{widths[2]}}  {r[3][:160]}"
            for r in rows]


def summary(outcomes: list[Outcome], what: str) -> str:
    derived = sum(o.derived for o in outcomes)
    skipped = sum(o.skipped for o in outcomes)
    tail = f"; {skipped} skipped (no CPU call)" if skipped else ""
    return f"{derived} of {len(outcomes) - skipped} ops got a working call ({what}){tail}"


def diff(old: str, new: str, path: Path) -> str:
    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                        str(path), f"{path} (derived)"))


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- the command

@dataclass(frozen=True)
class Request:
    """What ``opforge recipes --derive`` was asked: where the package is, which stubs."""

    matrix: Path | None = None
    recipes: Path | None = None
    variant: str | None = None
    wheel: Path | None = None
    python: Path | None = None
    torch_index: str | None = None
    ops: tuple[str, ...] | None = None
    dry_run: bool = False
    limits: Limits = Limits()
    call_timeout: float = 30.0


def _target(request: Request, matrix):
    if request.python is not None:
        return Target(python=request.python)
    variant = matrix.variant(request.variant) if request.variant else None
    wheel = request.wheel or latest_wheel(matrix, variant.name)
    if variant is None:
        found = identify_wheel(matrix, wheel)
        variant = found[0] if found else None
    index = resolve_index(matrix.torch_index(variant) if variant else None, request.torch_index)
    return Target(wheel=wheel, torch_index=index,
                  variant_torch=matrix.torch_spec(variant) if variant else None)


def run(request: Request) -> int:
    matrix = load_matrix(request.matrix)
    ext = matrix.extension
    path = request.recipes or (matrix.path.parent / ext.recipes if ext.recipes else None)
    if path is None:
        raise UsageError(f"{matrix.path}: extension.recipes names no recipes file (run "
                         "`opforge init`, or pass --recipes FILE)")
    text = read_text(path, what="recipes file")
    entries = select(stub_entries(text, str(path)), request.ops, str(path))
    if not request.dry_run:
        check_target(path, root=path.parent, what="recipes file")
    if not entries:
        say(f"opforge recipes: {path} has no stub recipe: nothing to derive")
        return 0
    hints_of = scan_hints((matrix.path.parent / ext.path).resolve())
    no_kernel = {op.name: op.no_kernel for op in ext.op_specs if op.no_kernel}
    target = _target(request, matrix)
    say(f"opforge recipes --derive: {len(entries)} stub(s) of {path.name}, called in the "
        f"{target.describe()}")
    env = prepare_environment(target)
    try:
        with TrialWorker(env.python, ext.package, ext.namespace, fresh=env.fresh,
                         call_timeout=request.call_timeout) as worker:
            worker.start()
            new, outcomes = derive_text(
                text, entries, worker, hints_of, request.limits, no_kernel=no_kernel,
                log=lambda o: say(f"  {o.key}: " + (f"derived in {o.tries} tries" if o.derived
                                                     else "skipped" if o.skipped else
                                                     f"no working call in {o.tries} tries")))
    finally:
        cleanup(env, keep=False)
    for line in table(outcomes):
        print(line)
    what = f"{ext.package}, torch.ops.{ext.namespace}, torch {worker.torch_version or '?'}"
    if request.dry_run:
        print(diff(text, new, path), end="")
        say(f"opforge recipes: {summary(outcomes, what)}; --dry-run: {path} not written")
        return 0
    if new != text:
        write_file(path, new, root=path.parent, what="recipes file")
    say(f"opforge recipes: {summary(outcomes, what)}; "
        + (f"wrote {path}" if new != text else f"{path} unchanged"))
    return 0
