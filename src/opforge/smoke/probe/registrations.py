"""What the package registered, observed: the dispatcher's listings before and after each load.

While the package imports, ``Observer`` wraps the three ways a compiled library gets loaded
(an extension module's import, ``torch.ops.load_library``, ``ctypes.CDLL``) and the
``torch.library`` functions that register Python kernels, and records per load which op
schemas and which orphan kernels (kernels for a name with no schema) appeared. Nothing is
guessed from source: what a library added is the difference of torch's own listings.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import os
import re
import traceback

from .common import first_line

# torch.library functions whose first argument names the op they register for
PY_REGISTRATIONS = ("register_fake", "register_autograd", "register_kernel", "impl_abstract",
                    "register_torch_dispatch", "register_vmap", "register_autocast")
_KEY_LINE = re.compile(r"^(\w+): registered at (.*?)(?: \[.*\])?$", re.M)


def op_names(t, orphans=None) -> set[str]:
    """Every op with a schema, ``ns::name`` (overloads folded into their op).

    torch's listing also holds names that only have kernels (orphans): those are left out.
    """
    orphans = orphan_kernels(t) if orphans is None else orphans
    return {name.split(".", 1)[0] for name in t._C._dispatch_get_all_op_names()} - set(orphans)


def orphan_kernels(t) -> dict[str, dict[str, str]]:
    """Kernels registered for a name that has no schema: ``ns::name`` -> {key: where}."""
    find = getattr(t._C, "_dispatch_find_dangling_impls", None)
    out: dict[str, dict[str, str]] = {}
    for entry in (find() if find else []):
        name = re.search(r"^name: (\S+)", entry, re.M)
        if name:
            out[name.group(1)] = {k: where for k, where in _KEY_LINE.findall(entry)
                                  if k not in ("name", "schema", "debug")}
    return out


def namespaces(names) -> dict[str, int]:
    counts: dict[str, int] = {}
    for name in names:
        ns = name.split("::", 1)[0]
        counts[ns] = counts.get(ns, 0) + 1
    return counts


def loaded_paths(t) -> set[str]:
    """Real paths of the shared libraries this process has mapped (Linux), plus torch's list."""
    paths = {os.path.realpath(p) for p in getattr(t.ops, "loaded_libraries", ()) or ()}
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                parts = line.split(None, 5)
                if len(parts) == 6 and parts[5].startswith("/"):
                    paths.add(os.path.realpath(parts[5].strip()))
    except OSError:
        pass
    return paths


def _caller() -> str | None:
    """The first frame outside torch and this module: the package line that registered."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        path = frame.filename.replace(os.sep, "/")
        if "/torch/" in path or path.endswith("/registrations.py") or "<frozen" in path:
            continue
        return f"{frame.filename}:{frame.lineno}"
    return None


def _qualname(op) -> str | None:
    if isinstance(op, str):
        return op.split(".", 1)[0] if "::" in op else None
    for attr in ("_qualname", "_name", "name"):
        value = getattr(op, attr, None)
        value = value() if callable(value) else value
        if isinstance(value, str) and "::" in value:
            return value.split(".", 1)[0]
    return None


class Observer:
    """Records, during ``with observer:``, each library load and Python registration."""

    def __init__(self, t, root: str | None = None):
        self.t = t
        # loads outside ``root`` (the package) are not snapshotted one by one: importing a
        # dependency's hundred extension modules must not cost a hundred listings
        self.root = os.path.join(os.path.realpath(root), "") if root else None
        self.loads: list[dict] = []
        self.python: list[dict] = []
        self._depth = 0
        self._undo: list = []

    def snapshot(self) -> tuple[set[str], dict]:
        orphans = orphan_kernels(self.t)
        return op_names(self.t, orphans), orphans

    def around(self, path: str, via: str, call):
        """Run ``call`` (a load of ``path``) and record what it added to the dispatcher."""
        if self._depth or (self.root and via != "probe"
                           and not os.path.realpath(path or "/").startswith(self.root)):
            return call()
        self._depth += 1
        ops0, orphans0 = self.snapshot()
        event = {"path": os.path.realpath(path) if path else path, "via": via, "error": None}
        try:
            return call()
        except BaseException as exc:
            event["error"] = first_line(exc)
            raise
        finally:
            self._depth -= 1
            ops1, orphans1 = self.snapshot()
            event["added_ops"] = sorted(ops1 - ops0)
            event["added_orphans"] = {n: k for n, k in orphans1.items()
                                      if orphans0.get(n) != k}
            self.loads.append(event)

    def _patch(self, owner, name: str, make):
        original = getattr(owner, name)
        setattr(owner, name, make(original))
        self._undo.append((owner, name, original))

    def __enter__(self):
        obs, t = self, self.t

        def create_module(original):
            def wrapper(loader, spec):
                return obs.around(spec.origin or "", "import", lambda: original(loader, spec))
            return wrapper

        def load_library(original):
            def wrapper(ops, path, *a, **k):
                return obs.around(str(path), "torch.ops.load_library",
                                  lambda: original(ops, path, *a, **k))
            return wrapper

        def cdll_init(original):
            def wrapper(lib, name, *a, **k):
                return obs.around(str(name) if name else "", "ctypes.CDLL",
                                  lambda: original(lib, name, *a, **k))
            return wrapper

        self._patch(importlib.machinery.ExtensionFileLoader, "create_module", create_module)
        self._patch(type(t.ops), "load_library", load_library)
        self._patch(ctypes.CDLL, "__init__", cdll_init)
        for api in PY_REGISTRATIONS:
            if hasattr(t.library, api):
                self._patch(t.library, api, lambda original, api=api: self._python(api, original))
        return self

    def _python(self, api: str, original):
        obs = self

        def wrapper(op, *a, **k):
            entry = {"api": api, "op": _qualname(op), "where": _caller(), "error": None}
            obs.python.append(entry)
            try:
                result = original(op, *a, **k)
            except BaseException as exc:
                entry["error"] = first_line(exc)
                raise
            if callable(result) and not a and "func" not in k and api != "register_autograd":
                def decorator(fn, *da, **dk):  # the decorator form: register_fake("ns::op")(fn)
                    try:
                        return result(fn, *da, **dk)
                    except BaseException as exc:
                        entry["error"] = first_line(exc)
                        raise
                return decorator
            return result
        return wrapper

    def __exit__(self, *exc):
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)
        self._undo.clear()
        return False
