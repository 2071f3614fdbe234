"""Call each op the way its recipe says: ``OpRunner`` finds the op and its recipe, builds
the arguments, and runs the check table (``checks.CHECKS``: on every present device,
backward, fake, compile, autocast, speed) for each of the recipe's dtypes. The probe knows no
op: everything op-specific comes from the recipes file."""

from __future__ import annotations

from . import checks, crashes, rejections
from .common import ALWAYS_LISTED, DEVICES, Report, first_line
from .recipes import RecipeError, validate, where
from .values import outputs_of


class _ExplainingReport:
    """Adds to a failing run the census gap that explains it (no CPU kernel, no Meta kernel),
    and judges the exception of one that has none (``rejections``): a stub's inputs refused by
    the op's own checks are a warning that names the recipe to write; an op saying it has no
    kernel for a device gets the matrix.yaml declaration that would say so."""

    def __init__(self, report: Report, rows: dict[str, dict], namespace: str = "",
                 path: str | None = None):
        self.report, self.rows, self.doc = report, rows, report.doc
        self.ns, self.path = namespace, path
        self.stubs: set[str] = set()        # ops whose recipe is a stub
        self.rejected: dict[str, str] = {}  # op -> the id of the CPU run its op refused

    def explanation(self, category: str, op: str, device: str | None) -> str | None:
        check = next((c for c in checks.CHECKS if c.name == category), None)
        keys = check.keys(device) if check else []
        cells = self.rows.get(op, {}).get("keys", {})
        gaps = [k for k in keys if cells.get(k or "", {}).get("status") in ("missing", "absent")]
        return f"census: {op} has no {' and no '.join(gaps)} kernel" if gaps else None

    def check(self, check_id, category, status, message, error=None, **fields):
        if status == "fail" and fields.get("op") and not fields.get("recipe_error"):
            op = fields["op"]
            why = self.explanation(category, op, fields.get("device"))
            if why:
                message, fields["explained_by"] = f"{message} [{why}]", why
            elif error is not None:
                kind, detail = rejections.classify(error)
                fields["error_kind"] = kind
                if kind == rejections.NO_KERNEL:
                    message += (f" [{op} says it has no {detail} kernel: if that is its design, "
                                f"declare it in matrix.yaml (extension.ops: - {op}: "
                                f"{{no_kernel: [{detail}]}})]")
                elif kind == rejections.REJECTED and op in self.stubs:
                    status, message = "warn", self.stub_rejected(op, category, fields, error)
                    fields["reason"] = "stub-rejected"
                    if category == "run" and fields.get("device") == "cpu":
                        self.rejected[op] = check_id
        return self.report.check(check_id, category, status, message, **fields)

    def stub_rejected(self, op: str, category: str, fields: dict, error) -> str:
        said = rejections.op_message(error)
        fields["rejected"] = said
        where_ = {"run": f" on {fields.get('device')}", "backward": " in backward",
                  "fake": " under FakeTensorMode", "compile": " in torch.compile",
                  "autocast": f" under autocast on {fields.get('device')}"}.get(category, "")
        where_ = "" if where_ == " on cpu" else where_
        recipes = self.path or "the recipes file (matrix.yaml: extension.recipes)"
        return (f"stub inputs rejected by {self.ns}::{op}{where_}: \"{said}\" \u2014 write a "
                f"recipe for {op} in {recipes} (docs/adopt.md#2-fill-in-the-recipes) or run "
                "opforge recipes --derive")


class OpRunner:
    def __init__(self, report: Report, t, namespace: str, rows: dict[str, dict],
                 devices: list[str], recipes: dict | None, recipes_path: str | None,
                 speed: dict | None = None, no_kernel: dict | None = None,
                 crumb: crashes.Breadcrumb | None = None, crashed: dict | None = None):
        self.report = _ExplainingReport(report, rows, namespace, recipes_path)
        self.crumb = crumb or crashes.Breadcrumb(None)
        self.crashed = crashed or {}  # calls that killed an earlier probe (crashes.key -> where)
        self.speed = speed or {}
        self.no_kernel = {op: list(devices) for op, devices in (no_kernel or {}).items()}
        self.t, self.ns, self.rows, self.devices = t, namespace, rows, devices
        self.recipes, self.path = recipes, recipes_path

    # ----------------------------------------------------------------- recipe plumbing

    def recipe_call(self, op: str, what: str, fn, *args):
        """Call a recipe's own function; its exception becomes a RecipeError naming file:line."""
        try:
            return fn(*args)
        except Exception as exc:  # noqa: BLE001 - the recipe's bug, reported as such
            raise RecipeError(f"recipe {op!r} {what} raised {first_line(exc)} at "
                              f"{where(exc, self.path or '')}") from None

    def inputs(self, op: str, recipe: dict, dtype) -> list:
        args = self.recipe_call(op, "inputs", recipe["inputs"], dtype)
        if not isinstance(args, (list, tuple)):
            raise RecipeError(f"recipe {op!r} inputs returned {type(args).__name__}, expected "
                              f"a list of arguments ({self.path})")
        return list(args)

    def results(self, recipe: dict, args: list, out) -> list:
        values = [args[i] for i in recipe["mutates"]] if recipe.get("mutates") else outputs_of(out)
        if recipe.get("outputs") is not None:
            values = [values[i] for i in recipe["outputs"] if i < len(values)]
        return values

    def dtypes(self, recipe: dict) -> list:
        out = []
        for d in recipe.get("dtypes") or [self.t.float32]:
            dtype = getattr(self.t, d, None) if isinstance(d, str) else d
            if not isinstance(dtype, self.t.dtype):
                raise RecipeError(f"recipe dtypes: {d!r} is not a torch dtype ({self.path})")
            out.append(dtype)
        return out

    def skipped(self, op: str, recipe: dict, check: str, check_id: str, category: str,
                **fields) -> bool:
        reason = (recipe.get("skip") or {}).get(check)
        if reason:
            self.report.check(check_id, category, "skip", f"recipe: {reason}", op=op,
                              reason="recipe", **fields)
        return bool(reason)

    # ----------------------------------------------------------------- driver

    def run_all(self, import_ok: bool):
        t = self.t
        for op, row in self.rows.items():
            if not row["found"] or not row["declared"] or row["internal"]:
                continue  # a backward-only op is reached through its forward op's backward
            if not import_ok:
                self.report.check(f"run:{op}", "run", "skip", "import failed", op=op,
                                  reason="import-failed")
                continue
            recipe = (self.recipes or {}).get(op)
            if recipe is None:
                where_ = f"add one to {self.path}" if self.path else \
                    "name a recipes file in matrix.yaml (extension.recipes)"
                self.report.check(f"run:{op}", "run", "warn", f"census only: no recipe says "
                                  f"how to call {op} ({where_})", op=op, reason="no-recipe")
                continue
            problem = validate(op, recipe, self.path or "recipes", checks.skippable())
            if problem:
                self.report.check(f"run:{op}", "run", "fail", problem, op=op, recipe_error=True)
                continue
            if recipe.get("stub"):
                self.report.stubs.add(op)
                self.report.check(f"stub:{op}", "run", "warn", f"the recipe for {op} is the "
                                  "stub opforge init wrote from its schema: it calls the op once "
                                  "per device; edit it (known answers, grad, workloads) and drop "
                                  "\"stub\"", op=op, reason="stub")
            if crashes.report_crash(self.report.report, self.crashed, "op", op, self.ns,
                                    self.path):
                continue
            try:
                packet = getattr(getattr(t.ops, self.ns), op)
                fn = getattr(packet, recipe.get("overload") or "default")
            except (AttributeError, RuntimeError) as exc:
                self.report.check(f"run:{op}", "run", "fail", f"no overload "
                                  f"{recipe.get('overload') or 'default'!r} to call: "
                                  f"{first_line(exc)}", op=op, recipe_error=True)
                continue
            try:
                dtypes = self.dtypes(recipe)
                for i, dtype in enumerate(dtypes):
                    tag = "" if len(dtypes) == 1 else f":{str(dtype).replace('torch.', '')}"
                    call = checks.Call(op, fn, recipe, dtype, tag)
                    for check in checks.CHECKS:
                        if check.run is not None and (i == 0 or check.every_dtype):
                            self.crumb.at(kind="op", name=op, check=check.name + tag,
                                          recipe=crashes.recipe_kind(recipe))
                            check.run(self, call)
            except RecipeError as exc:
                self.report.check(f"recipe:{op}", "run", "fail", str(exc), op=op,
                                  recipe_error=True)
            except Exception as exc:  # noqa: BLE001 - one op's surprise must not end the probe
                self.report.check(f"run:{op}", "run", "fail", f"probing {op} raised "
                                  f"{first_line(exc)}", op=op)
            finally:
                self.crumb.clear()
        for op in sorted(set(self.recipes or {}) - set(self.rows)):
            self.report.check(f"recipe:{op}", "run", "warn", f"{self.path} has a recipe for "
                              f"{op}, which is not an op of torch.ops.{self.ns}")

    def device_types(self) -> list[str]:
        """The devices each op's checks go over: those every report lists, and one the probe
        found this torch built for (xpu)."""
        listed = self.report.doc.get("devices") or {}
        return [d for d in DEVICES if d in ALWAYS_LISTED or d in listed]

    def absent(self, device: str) -> tuple[str, str]:
        entry = self.report.doc["devices"][device]
        if entry.get("present"):
            return "present, device checks disabled (--device-checks skip)", "disabled"
        return f"skipped-no-device: {entry.get('detail')}", "no-device"

    def by_design(self, op: str, missing: str, check_id: str, category: str, **fields) -> bool:
        """Skip (and say so) a check that needs a device's kernel matrix.yaml says the op has
        not, by design (``missing``: that device)."""
        if missing not in self.no_kernel.get(op, ()):
            return False
        self.report.check(check_id, category, "skip", f"by design: matrix.yaml declares that "
                          f"{op} has no {missing} kernel (no_kernel: [{missing}])", op=op,
                          reason="by-design", **fields)
        return True

    def blocked(self, op: str, check_id: str, category: str, **fields) -> bool:
        """Skip a check that needs the CPU run when the op refused its stub's inputs there."""
        refused = self.report.rejected.get(op)
        if refused is None:
            return False
        self.report.check(check_id, category, "skip", f"{op} refused the stub's inputs on cpu "
                          f"({refused}): nothing to check until its recipe is written", op=op,
                          reason="stub-rejected", **fields)
        return True

    def runnable(self, op: str, key: str) -> bool:
        """Run when the kernel is registered, or promised (then the user sees the real error)."""
        return self.rows[op]["keys"].get(key, {}).get("status") in ("ok", "present", "missing")
