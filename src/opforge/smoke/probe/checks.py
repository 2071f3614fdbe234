"""The checks of one op, as a table: ``CHECKS`` (one row each: its name, the dispatch keys
whose absence explains its failure, the function that runs it) and those functions.

A check function takes the ``OpRunner`` (runs.py: the report, torch, the census rows, the
recipe plumbing) and the op's ``Call``. Adding a check is one function and one row: the
driver runs it, a failure gets its census explanation, a recipe's ``skip`` may name it (the
function asks ``runner.skipped``), and the report gives it a column in the runs table.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .common import AUTOCAST_KEY, DEVICE_KEY, first_line
from .crashes import recipe_kind
from .recipes import RecipeError, where
from .speed import block_timer, calls_per_block, paired, seconds, synchronizer
from .values import compare, outputs_of, to_device

# the smoke speed check: blocks of about this long, rounds until this budget is spent
SPEED_BLOCK_S = 0.005
SPEED_BUDGET_S = 0.1


@dataclass
class Call:
    """One op called with one of its recipe's dtypes: what each check of it is given."""

    op: str
    fn: object            # the op's overload, torch.ops.<namespace>.<op>.<overload>
    recipe: dict
    dtype: object
    tag: str = ""         # ":float64" when the recipe runs more than one dtype
    cpu_out: list | None = None  # the CPU's results (the run check sets them) to compare with


@dataclass(frozen=True)
class Check:
    """One row of the check table.

    ``explained_by``: the dispatch keys whose absence from the census explains a failure
    (``{device}``: the device's backend key, ``{autocast}``: its autocast key).
    ``run``: the function that runs it for one ``Call``; None when another check
    runs it (backward runs after each device's forward, against the CPU's gradients).
    ``every_dtype``: run with each of the recipe's dtypes, not only the first.
    ``skippable``: a recipe's ``skip`` may name it. ``column``: its column in the report's
    runs table (``device``: the device's, shared with the forward run; None: its own).
    """

    name: str
    explained_by: tuple[str, ...] = ()
    run: Callable[[Any, Call], None] | None = None  # (runs.OpRunner, Call): runs imports this
    every_dtype: bool = False
    skippable: bool = True
    column: str | None = None

    def keys(self, device: str | None) -> list[str | None]:
        """The dispatch keys that explain this check failing on ``device``."""
        named = {"{device}": DEVICE_KEY.get(device or "cpu"),
                 "{autocast}": AUTOCAST_KEY.get(device or "")}
        return [named.get(key, key) for key in self.explained_by]


def known_answer(runner, op: str, recipe: dict, fn, args: list, out) -> str | None:
    """What the recipe's ``check`` or ``expected`` finds wrong with the CPU's result, or None."""
    t = runner.t
    if "check" in recipe:
        try:
            verdict = recipe["check"](fn, args, out)
        except AssertionError as exc:
            return f"{op} on cpu: {exc or 'the recipe check failed'}"
        except Exception as exc:  # noqa: BLE001
            raise RecipeError(f"recipe {op!r} check raised {first_line(exc)} at "
                              f"{where(exc, runner.path or '')}") from None
        return None if verdict in (None, True) else f"{op} on cpu: {verdict}"
    if "expected" in recipe:
        want = recipe["expected"]
        got = runner.results(recipe, args, out)
        got = got[0] if len(got) == 1 else got
        if isinstance(want, t.Tensor) and isinstance(got, t.Tensor):
            same = want.shape == got.shape and (
                t.allclose(got.double(), want.double(), atol=recipe.get("atol", 1e-4),
                           rtol=recipe.get("rtol", 1e-3))
                if got.is_floating_point() else t.equal(got, want.to(got.dtype)))
        else:
            as_list = got.tolist() if isinstance(got, t.Tensor) else got
            same = as_list == (want.tolist() if isinstance(want, t.Tensor) else want)
        if not same:
            shown = got.tolist() if isinstance(got, t.Tensor) else got
            return f"{op} on cpu gave {shown}, the recipe expects " \
                   f"{want.tolist() if isinstance(want, t.Tensor) else want}"
    return None


def device_runs(runner, call: Call):
    """Forward on every device (the CPU's against the recipe's known answer, the others
    against the CPU's), each followed by its backward when the recipe names ``grad``."""
    t = runner.t
    op, fn, recipe, dtype, tag = call.op, call.fn, call.recipe, call.dtype, call.tag
    cpu_out = cpu_grads = None
    for device in runner.device_types():
        check_id = f"run:{op}:{device}{tag}"
        wants_grad = bool(recipe.get("grad")) and "backward" not in (recipe.get("skip") or {})
        if runner.by_design(op, device, check_id, "run", device=device):
            continue
        if device not in runner.devices:
            message, reason = runner.absent(device)
            runner.report.check(check_id, "run", "skip", message, op=op, device=device,
                                reason=reason)
            if wants_grad:
                runner.report.check(f"{check_id}:backward", "backward", "skip", message,
                                    op=op, device=device, reason=reason)
            continue
        key = DEVICE_KEY[device]
        if not runner.runnable(op, key):
            runner.report.check(check_id, "run", "skip", f"no {key} kernel registered and "
                                "none expected", op=op, device=device, reason="no-kernel")
            continue
        if runner.skipped(op, recipe, "run", check_id, "run", device=device) or \
                runner.blocked(op, check_id, "run", device=device):
            continue
        cpu_args = runner.inputs(op, recipe, dtype)
        args = [to_device(t, a, device) for a in cpu_args]
        runner.crumb.at(kind="op", name=op, check="run" + tag, device=device,
                        recipe=recipe_kind(recipe))
        try:
            out = fn(*args)
            got = [o.cpu() if isinstance(o, t.Tensor) else o
                   for o in runner.results(recipe, args, out)]
            if device != "cpu" and "cpu" in runner.no_kernel.get(op, ()):
                problem = None  # no CPU kernel by design: nothing to compare with
                ok_message = f"{op} on {device} runs (no cpu kernel to compare with, by design)"
            elif device != "cpu":
                problem = compare(t, cpu_out, got, recipe.get("atol", 1e-4),
                                  recipe.get("rtol", 1e-3)) if cpu_out is not None else \
                    "CPU run failed, nothing to compare with"
                ok_message = f"{op} on {device} matches CPU"
            else:
                cpu_out = got
                problem = known_answer(runner, op, recipe, fn, args, out)
                known = "check" in recipe or "expected" in recipe
                ok_message = f"{op} on cpu gives the known answer" if known else \
                    f"{op} on cpu runs, finite output"
                if problem is None and any(isinstance(o, t.Tensor) and o.is_floating_point()
                                           and not bool(t.isfinite(o).all()) for o in got):
                    problem = f"{op} on cpu returned non-finite values"
            runner.report.check(check_id, "run", "fail" if problem else "pass",
                                problem or ok_message, op=op, device=device)
        except RecipeError:
            raise
        except Exception as exc:  # noqa: BLE001
            runner.report.check(check_id, "run", "fail", f"{op} on {device}: {first_line(exc)}",
                                op=op, device=device, error=exc)
            continue
        if wants_grad:
            runner.crumb.at(kind="op", name=op, check="backward" + tag, device=device,
                            recipe=recipe_kind(recipe))
            grads = backward(runner, op, fn, recipe, dtype, device, cpu_grads, check_id)
            if device == "cpu":
                cpu_grads = grads
    call.cpu_out = cpu_out



def backward(runner, op, fn, recipe, dtype, device, cpu_grads, run_id):
    """The backward of ``grad``'s arguments on ``device``, against the CPU's gradients."""
    t = runner.t
    check_id = f"{run_id}:backward"
    if not runner.runnable(op, "Autograd"):
        runner.report.check(check_id, "backward", "skip", "no Autograd kernel registered and "
                            "none expected", op=op, device=device, reason="no-kernel")
        return None
    args = [to_device(t, a, device) for a in runner.inputs(op, recipe, dtype)]
    leaves = []
    for i in recipe["grad"]:
        if i >= len(args) or not isinstance(args[i], t.Tensor) or \
                not args[i].is_floating_point():
            raise RecipeError(f"recipe {op!r} grad names argument {i}, which is not a "
                              f"floating-point tensor ({runner.path})")
        args[i] = args[i].detach().requires_grad_(True)
        leaves.append(args[i])
    try:
        with warnings.catch_warnings():
            # torch's autograd-fallback warning means backward silently skips the op
            warnings.filterwarnings("error", message=".*autograd kernel was not registered")
            outs = [o for o in runner.results(recipe, args, fn(*args))
                    if isinstance(o, t.Tensor) and o.is_floating_point() and o.requires_grad]
            if not outs:
                raise RuntimeError("no output requires grad: the op did not record a "
                                   "backward for its inputs")
            g = t.Generator().manual_seed(2)
            loss = sum((o * t.rand(o.shape, generator=g).to(device=device, dtype=o.dtype)).sum()
                       for o in outs)
            grads = t.autograd.grad(loss, leaves, allow_unused=True)
        grads = [None if x is None else x.cpu() for x in grads]
        if any(x is None for x in grads):
            problem = "backward left some inputs without a gradient"
        elif device == "cpu":
            problem = next((f"gradient {i} is not finite" for i, x in enumerate(grads)
                            if not bool(t.isfinite(x).all())), None)
        elif cpu_grads is None:
            problem = "CPU backward failed, nothing to compare with"
        else:
            problem = compare(t, cpu_grads, grads, recipe.get("grad_atol", 1e-3),
                              recipe.get("grad_rtol", 1e-3))
        runner.report.check(check_id, "backward", "fail" if problem else "pass",
                            problem or f"{op} backward on {device} "
                            + ("runs" if device == "cpu" else "matches CPU"),
                            op=op, device=device)
        return grads
    except Exception as exc:  # noqa: BLE001
        runner.report.check(check_id, "backward", "fail", f"{op} backward on {device}: "
                            f"{first_line(exc)}", op=op, device=device, error=exc)
        return None



def fake_run(runner, call: Call):
    """Under FakeTensorMode: the fake (Meta) kernel's shapes and dtypes against the CPU's."""
    t = runner.t
    op, fn, recipe, dtype, cpu_out = call.op, call.fn, call.recipe, call.dtype, call.cpu_out
    if runner.skipped(op, recipe, "fake", f"fake:{op}", "fake") or \
            runner.blocked(op, f"fake:{op}", "fake"):
        return
    meta = runner.rows[op]["keys"].get("Meta", {}).get("status") in ("ok", "present")
    if not meta and runner.by_design(op, "cpu", f"fake:{op}", "fake"):
        return  # fake tensors of CPU tensors reach its CPU kernel unless it has a Meta one
    cpu_args = runner.inputs(op, recipe, dtype)
    # FakeTensorMode and ShapeEnv (~0.2 s past torch): only for this check
    try:
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.symbolic_shapes import ShapeEnv
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with FakeTensorMode(shape_env=ShapeEnv()) as mode:
                args = [mode.from_tensor(a) if isinstance(a, t.Tensor) else a
                        for a in cpu_args]
                out = [o for o in runner.results(recipe, args, fn(*args))
                       if isinstance(o, t.Tensor)]
        problem = None
        if cpu_out is not None:
            real = [o for o in cpu_out if isinstance(o, t.Tensor)]
            for i, (f, r) in enumerate(zip(out, real)):
                static = [d if isinstance(d, int) else None for d in f.shape]
                if f.dtype != r.dtype or len(static) != r.dim() or any(
                        s is not None and s != d for s, d in zip(static, r.shape)):
                    problem = (f"fake output {i} is {f.dtype}{list(f.shape)}, the real one "
                               f"{r.dtype}{list(r.shape)}")
        runner.report.check(f"fake:{op}", "fake", "fail" if problem else "pass",
                            problem or f"{op} runs under FakeTensorMode", op=op)
    except Exception as exc:  # noqa: BLE001
        runner.report.check(f"fake:{op}", "fake", "fail", f"{op} under FakeTensorMode: "
                            f"{first_line(exc)}", op=op, error=exc)



def compile_run(runner, call: Call):
    """torch.compile(fullgraph=True, backend="aot_eager") on the CPU, against eager."""
    t = runner.t
    op, fn, recipe, dtype, cpu_out = call.op, call.fn, call.recipe, call.dtype, call.cpu_out
    if "cpu" not in runner.devices or \
            runner.skipped(op, recipe, "compile", f"compile:{op}", "compile") or \
            runner.blocked(op, f"compile:{op}", "compile") or \
            runner.by_design(op, "cpu", f"compile:{op}", "compile"):
        return
    cpu_args = runner.inputs(op, recipe, dtype)
    try:
        t._dynamo.reset()
        const = {i: a for i, a in enumerate(cpu_args) if not isinstance(a, t.Tensor)}
        tensors = [a for a in cpu_args if isinstance(a, t.Tensor)]
        mutates = recipe.get("mutates")

        def traced(*ts):
            it = iter(ts)
            args = [const[i] if i in const else next(it) for i in range(len(cpu_args))]
            out = fn(*args)
            return tuple(args[i] for i in mutates) if mutates else out

        compiled = t.compile(traced, fullgraph=True, backend="aot_eager")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = compiled(*tensors)
        got = outputs_of(out)
        if recipe.get("outputs") is not None:
            got = [got[i] for i in recipe["outputs"] if i < len(got)]
        problem = compare(t, cpu_out, got, recipe.get("atol", 1e-4),
                          recipe.get("rtol", 1e-3)) if cpu_out is not None else None
        runner.report.check(f"compile:{op}", "compile", "fail" if problem else "pass",
                            problem or f"{op} compiles with fullgraph=True, backend=aot_eager "
                                     "and matches eager", op=op)
    except Exception as exc:  # noqa: BLE001
        runner.report.check(f"compile:{op}", "compile", "fail",
                            f"torch.compile(fullgraph=True, backend='aot_eager') of {op}: "
                            f"{first_line(exc)}", op=op, error=exc)



def autocast_runs(runner, call: Call):
    """Under torch.autocast on every device, the recipe's ``autocast`` arguments lowered."""
    t = runner.t
    op, fn, recipe = call.op, call.fn, call.recipe
    if not recipe.get("autocast"):
        return
    for device in runner.device_types():
        check_id = f"autocast:{op}:{device}"
        key = AUTOCAST_KEY[device]
        if runner.by_design(op, device, check_id, "autocast", device=device):
            continue
        if device not in runner.devices:
            message, reason = runner.absent(device)
            runner.report.check(check_id, "autocast", "skip", message, op=op, device=device,
                                reason=reason)
            continue
        if not runner.runnable(op, key):
            runner.report.check(check_id, "autocast", "skip", f"no {key} kernel registered and "
                                "none expected", op=op, device=device, reason="no-kernel")
            continue
        if runner.skipped(op, recipe, "autocast", check_id, "autocast", device=device) or \
                runner.blocked(op, check_id, "autocast", device=device):
            continue
        low = t.bfloat16 if device == "cpu" else t.float16
        ref_args = [to_device(t, a, device) for a in runner.inputs(op, recipe, t.float32)]
        args = [to_device(t, a, device) for a in runner.inputs(op, recipe, t.float32)]
        for i in recipe["autocast"]:
            args[i] = args[i].to(low)
        try:
            with t.autocast(device, dtype=low):
                out = runner.results(recipe, args, fn(*args))
            ref = runner.results(recipe, ref_args, fn(*ref_args))
            tol = recipe.get("autocast_atol", 2e-2)
            problem = compare(t, [r.float() if isinstance(r, t.Tensor) and
                                  r.is_floating_point() else r for r in ref],
                              [o.float() if isinstance(o, t.Tensor) and
                               o.is_floating_point() else o for o in out], tol, tol)
            runner.report.check(check_id, "autocast", "fail" if problem else "pass",
                                f"{op} under torch.autocast('{device}', {low}): {problem}"
                                if problem else f"{op} under torch.autocast('{device}', {low}) "
                                "with reduced-precision inputs matches float32", op=op,
                                device=device)
        except Exception as exc:  # noqa: BLE001
            runner.report.check(check_id, "autocast", "fail", f"{op} under torch.autocast("
                                f"'{device}', {low}): {first_line(exc)}", op=op, device=device,
                                error=exc)



def speed_runs(runner, call: Call):
    """Each device kernel against the same op on this machine's CPU: fail far slower ones.

    The first workload's inputs (else the recipe's), forward only; ``speed`` (the spec's)
    gives ``factor`` (default 10), ``op_factors`` and ``devices``: more devices to time,
    for tests on a machine without an accelerator (``meta``, whose kernel a test
    extension makes slow on purpose).
    """
    t = runner.t
    op, fn, recipe, dtype = call.op, call.fn, call.recipe, call.dtype
    if runner.speed.get("enabled") is False or "cpu" not in runner.devices:
        return
    extra = [d for d in runner.speed.get("devices") or () if d not in runner.devices]
    devices = [d for d in runner.devices if d != "cpu"] + extra
    factor = float((runner.speed.get("op_factors") or {}).get(op, runner.speed.get("factor", 10)))
    workloads = recipe.get("workloads") or {}
    make = next(iter(workloads.values()))["inputs"] if workloads else recipe["inputs"]
    ran = {c["id"]: c["status"] for c in runner.report.doc["checks"]}
    for device in devices:
        check_id = f"speed:{op}:{device}"
        key = DEVICE_KEY.get(device, "Meta" if device == "meta" else device.upper())
        if runner.by_design(op, "cpu", check_id, "speed", device=device) or \
                runner.by_design(op, device, check_id, "speed", device=device) or \
                runner.blocked(op, check_id, "speed", device=device):
            continue  # timed against the CPU's kernel, which is not there or was not run
        if device not in extra and ran.get(f"run:{op}:{device}") != "pass":
            if f"run:{op}:{device}" in ran:
                runner.report.check(check_id, "speed", "skip", f"{op} on {device} did not "
                                    "run correctly: nothing to time", op=op, device=device,
                                    reason="run-failed")
            continue
        if not runner.runnable(op, key):
            continue
        cpu_args = runner.recipe_call(op, "workload inputs", make, dtype)
        args = [to_device(t, a, device) for a in cpu_args]
        try:
            time_against_cpu(runner, op, fn, device, cpu_args, args, factor, check_id)
        except Exception as exc:  # noqa: BLE001
            # an added device (a test's Meta) may not run every op (data-dependent shapes)
            status, reason = ("skip", "cannot-time") if device in extra else ("fail", None)
            runner.report.check(check_id, "speed", status, f"timing {op} on {device}: "
                                f"{first_line(exc)}", op=op, device=device, reason=reason)



def time_against_cpu(runner, op, fn, device, cpu_args, args, factor, check_id):
    """Paired rounds of the op on ``device`` and on the CPU; fail above ``factor``."""
    sync, no_sync = synchronizer(runner.t, device), synchronizer(runner.t, "cpu")
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cpu_call, dev_call = (lambda: fn(*cpu_args)), (lambda: fn(*args))
        n_cpu = calls_per_block(cpu_call, no_sync, SPEED_BLOCK_S)
        n_dev = calls_per_block(dev_call, sync, SPEED_BLOCK_S)
        result = paired(lambda: block_timer(cpu_call, no_sync, n_cpu),
                        lambda: block_timer(dev_call, sync, n_dev),
                        budget_s=SPEED_BUDGET_S)
    ratio = result["ratio"]
    slow = ratio > factor
    message = (f"{op} on {device}: {seconds(result['b_s'])} per call, on cpu "
               f"{seconds(result['a_s'])}: {ratio:.1f}x the CPU's time "
               f"({'more than' if slow else 'within'} the {factor:g}x allowed; median of "
               f"{result['rounds']} paired rounds)")
    runner.report.check(check_id, "speed", "fail" if slow else "pass", message, op=op,
                        device=device, device_s=result["b_s"], cpu_s=result["a_s"],
                        ratio=round(ratio, 3), factor=factor, spread=round(result["spread"], 3),
                        cost_s=round(time.perf_counter() - started, 3))


# The checks of one op, in the order they run and are reported. A recipe's ``skip`` names
# them; ``opforge.smoke.report`` lays out the runs table from them.
CHECKS = (
    Check("run", ("{device}",), device_runs, every_dtype=True, column="device"),
    Check("backward", ("Autograd", "{device}"), column="device"),  # run by device_runs
    Check("fake", ("Meta",), fake_run),
    Check("compile", ("Meta", "CPU"), compile_run),
    Check("autocast", ("{autocast}", "{device}"), autocast_runs),
    Check("speed", (), speed_runs, skippable=False),
)


def skippable() -> tuple[str, ...]:
    """The checks a recipe's ``skip`` may name."""
    return tuple(check.name for check in CHECKS if check.skippable)


def explained_by(key: str) -> tuple[str, ...]:
    """The checks whose failure the absence of dispatch key ``key`` explains (by their rows)."""
    return tuple(check.name for check in CHECKS if key in check.explained_by)
