"""From the evidence the probe gathered, the causes: one block each, reported before symptoms.

A cause is a check of category ``cause`` (so JUnit, annotations and the exit code see it) and
an entry of the document's ``causes``: its class, a one-line title, evidence lines, a ``fix``
and the ids of the checks it explains (those checks carry ``explained_by``). The classes:

namespace_mismatch, orphan_kernels, empty_namespace, library_not_loaded, load_error,
duplicate_namespace, python_registration, missing_fake, device_code, wrong_torch, and
import_error (the import failed in Python before registering anything).
"""

from __future__ import annotations

import difflib
import os
import re
import sys

from .checks import explained_by
from .load import classify_load_error, other_python
from .registrations import namespaces, op_names, orphan_kernels

# causes after which every other failure is a consequence: nothing of the namespace works
ROOT_CLASSES = ("load_error", "duplicate_namespace", "namespace_mismatch", "empty_namespace",
                "python_registration", "import_error")
_DUPLICATE = re.compile(r"Only a single TORCH_LIBRARY can be used to register the namespace "
                        r"(\w+)")
_WHERE = re.compile(r"Previous registration of TORCH_LIBRARY was registered at (.*?); latest "
                    r"registration was registered at (.*?)(?:$|\n| \(|\. )")
# namespaces every torch has: never the package's
_TORCH_NAMESPACES = {"aten", "prim", "prims", "quantized", "_quantized", "_test", "profiler",
                     "inductor", "_inductor_test", "mkldnn", "mkl", "onednn", "_c10d_functional",
                     "_c10d_functional_autograd", "c10d", "_dtensor", "fbgemm", "sparse",
                     "cuda", "debugprims", "rngprims", "higher_order", "_nested_tensor",
                     "_TorchScriptTesting", "xnnpack", "_caffe2", "torchvision_testing"}


FAKE_APIS = ("register_fake", "impl_abstract")


def near(name: str, candidates, n: int = 3) -> list[str]:
    return difflib.get_close_matches(name, sorted(set(candidates)), n=n, cutoff=0.6)


def _listed(names, limit: int = 6) -> str:
    names = list(names)
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def add_cause(doc: dict, cls: str, title: str, evidence: list[str], fix: str,
              status: str = "fail", explains=(), **data) -> dict:
    """Record a cause in ``doc``: its entry, its check, and ``explained_by`` on its symptoms."""
    causes = doc.setdefault("causes", [])
    same = sum(1 for c in causes if c["class"] == cls)
    cause_id = f"cause:{cls}" + (f":{same + 1}" if same else "")
    cause = {"id": cause_id, "class": cls, "status": status, "title": title,
             "evidence": [e for e in evidence if e], "fix": fix, "explains": [], **data}
    causes.append(cause)
    doc.setdefault("checks", []).append({"id": cause_id, "category": "cause", "status": status,
                                         "message": cause_message(cause), "cause": cls})
    for check in doc["checks"]:
        if check["id"] in set(explains) and check["category"] != "cause" \
                and check["status"] in ("fail", "warn") and not check.get("explained_by_cause"):
            check["explained_by_cause"] = cause_id
            cause["explains"].append(check["id"])
    return cause


def cause_message(cause: dict) -> str:
    """The cause as one check message: title, evidence, fix (JUnit, annotations)."""
    evidence = "; ".join(cause["evidence"])
    return f"{cause['title']}" + (f" [{evidence}]" if evidence else "") + f" fix: {cause['fix']}"


def refresh(doc: dict) -> None:
    """Evidence added after a cause was recorded reaches its check's message."""
    by_id = {c["id"]: c for c in doc.get("causes", [])}
    for check in doc.get("checks", []):
        if check["id"] in by_id:
            check["message"] = cause_message(by_id[check["id"]])


def _problems(doc: dict, ops=None, categories=None) -> list[str]:
    return [c["id"] for c in doc.get("checks", [])
            if c["status"] in ("fail", "warn") and c["category"] not in ("cause", "environment")
            and (ops is None or c.get("op") in ops)
            and (categories is None or c["category"] in categories)]


def _fix_of(message: str) -> tuple[str, str]:
    head, _, fix = message.partition(" Fix: ")
    return head, fix.rstrip(".") or "rebuild the library against this environment's torch"


def crash_cause(text: str) -> dict | None:
    """A cause from the text a failed load or a dying probe printed (duplicate namespace)."""
    m = _DUPLICATE.search(text or "")
    if not m:
        return None
    ns = m.group(1)
    where = _WHERE.search(text)
    evidence = [f"first TORCH_LIBRARY({ns}, ...) at {where.group(1)}",
                f"second at {where.group(2)}"] if where else [text.strip().splitlines()[-1][:300]]
    return {"cls": "duplicate_namespace",
            "title": f"namespace {ns} is defined twice: two TORCH_LIBRARY({ns}, m) blocks "
                     "(two libraries, or two translation units of one) each claim it",
            "evidence": evidence,
            "fix": f"keep one TORCH_LIBRARY({ns}, m) with every m.def; other files use "
                   f"TORCH_LIBRARY_FRAGMENT({ns}, m), or load only one of the libraries",
            "namespace": ns}


class Diagnosis:
    """Decides the causes of one probe document (after the census and the runs)."""

    def __init__(self, doc: dict, t, namespace: str, package: str, spec: dict | None = None):
        self.doc, self.t, self.ns, self.package = doc, t, namespace, package
        # an extension of compiled modules only (pybind11): its namespace may rightly be empty
        self.modules_only = bool((spec or {}).get("modules")) and not (spec or {}).get("op_keys")
        self.info = doc.get("import") or {}
        self.reg = self.info.get("registered") or {}
        self.orphans_now = orphan_kernels(t)
        self.ops = op_names(t, self.orphans_now)
        self.ns_counts = namespaces(self.ops)
        libs = self.info.get("libraries") or []
        # what the package brought: its import, and its libraries loaded by hand afterwards
        self.added_ops = set(self.reg.get("ops") or [])
        self.added_orphans = dict(self.reg.get("orphans") or {})
        for lib in libs:
            self.added_ops |= set(lib.get("added_ops") or [])
            self.added_orphans.update(lib.get("added_orphans") or {})
        self.added_orphans = {n: k for n, k in self.added_orphans.items()
                              if n in self.orphans_now}

    def cause(self, *classes: str) -> dict | None:
        return next((c for c in self.doc.get("causes", []) if c["class"] in classes
                     and c["status"] == "fail"), None)

    def origin(self, qualname: str) -> str:
        """Which library (or Python) added ``qualname``, by the observed loads."""
        for event in self.reg.get("loads") or []:
            if qualname in event.get("added_ops", ()) or qualname in event.get("added_orphans", {}):
                return os.path.basename(event["path"] or "?")
        for lib in self.info.get("libraries") or []:
            if qualname in (lib.get("added_ops") or ()) or qualname in (lib.get("added_orphans")
                                                                        or {}):
                return os.path.basename(lib["path"])
        return "the package's Python"

    def run(self) -> None:
        self.load_errors()
        self.other_pythons()
        self.empty()
        self.python_registrations()
        self.not_loaded()
        self.orphans()
        self.missing_fakes()
        self.wrong_torch()
        roots = [c for c in self.doc.get("causes", []) if c["class"] in ROOT_CLASSES
                 and c["status"] == "fail"]
        if roots:  # everything else that failed follows from the first root cause
            for check in self.doc["checks"]:
                if check["id"] in _problems(self.doc) and not check.get("explained_by_cause"):
                    check["explained_by_cause"] = roots[0]["id"]
                    roots[0]["explains"].append(check["id"])
        refresh(self.doc)

    # ------------------------------------------------------------------ classes

    def load_errors(self) -> None:
        libs = self.info.get("libraries") or []
        texts = [lib.get("error") or "" for lib in libs] + [self.info.get("error") or ""]
        for text in texts:
            dup = crash_cause(text)
            if dup:
                cls = dup.pop("cls")
                add_cause(self.doc, cls, explains=_problems(self.doc), **dup)
                return

        build = self.doc.get("build") or {}
        running = (self.doc.get("environment") or {}).get("torch_version")
        for lib in libs:
            if lib.get("loaded"):
                continue
            diag = classify_load_error(lib["path"], lib.get("error") or "", build, self.t)
            head, fix = _fix_of(diag["message"])
            evidence = [f"built against torch {build['built_against_torch']}, running torch "
                        f"{running}" if build.get("built_against_torch") else None,
                        f"library {lib['path']}",
                        f"dlopen: {(lib.get('error') or '').strip()[:300]}"]
            add_cause(self.doc, "load_error", head.split("; built against")[0], evidence, fix,
                      kind=diag["kind"], library=lib["path"], symbol=diag.get("demangled"),
                      explains=["import", *_problems(self.doc)])

    def other_pythons(self) -> None:
        if any(c["class"] == "load_error" for c in self.doc.get("causes", [])):
            return
        for lib in self.info.get("libraries") or []:
            other = other_python(lib["path"])
            if other and not lib.get("loaded_by_import"):
                add_cause(self.doc, "load_error",
                          f"{os.path.basename(lib['path'])} is an extension module for {other}, "
                          f"and this is Python {sys.version_info.major}.{sys.version_info.minor}: "
                          "the interpreter skips it", [f"library {lib['path']}"],
                          "install the wheel built for this Python (or rebuild it here)",
                          kind="other_python", library=lib["path"],
                          explains=["import", *_problems(self.doc)])

    def python_registrations(self) -> None:
        seen = set()
        for entry in self.reg.get("python") or []:
            op = entry.get("op")
            if not op or op in self.ops or op in seen:
                continue
            seen.add(op)
            ns, _, name = op.partition("::")
            mismatch = self.cause("namespace_mismatch")
            if mismatch and ns == self.ns:  # a consequence of the namespace: evidence there
                mismatch["evidence"].append(f"torch.library.{entry['api']}({op!r}) at "
                                            f"{entry.get('where') or '?'}"
                                            + (f" fails: {entry['error']}" if entry.get("error")
                                               else ""))
                continue
            pool = [q for q in self.ops if q.startswith(ns + "::")] or sorted(self.added_ops)
            nearest = near(op, pool, 1)
            failed = entry.get("error")
            evidence = [f"torch.library.{entry['api']}({op!r}) at {entry.get('where') or '?'}",
                        f"{ns} defines: {_listed(q.split('::', 1)[1] for q in sorted(pool))}"
                        if pool and pool[0].startswith(ns + "::") else
                        f"namespace {ns} has no ops" + (
                            f"; the package defined {_listed(sorted(self.added_ops))}"
                            if self.added_ops else "")]
            if failed:
                evidence.append(f"import {self.package} fails: {failed}")
            meant = f"; did you mean {nearest[0]}?" if nearest else ""
            add_cause(self.doc, "python_registration",
                      f"{entry['api']} for {op}, which the library does not define{meant}",
                      evidence, f"register for {nearest[0]}" if nearest else
                      f"define {op} (m.def in TORCH_LIBRARY({ns}, m)) before registering for it",
                      status="fail", op=op, nearest=nearest[0] if nearest else None,
                      api=entry["api"],
                      explains=["import"] if failed else ())

    def not_loaded(self) -> None:
        pkg_dir = self.info.get("package_dir") or ""
        for lib in self.info.get("libraries") or []:
            added = list(lib.get("added_ops") or []) + list(lib.get("added_orphans") or {})
            if lib.get("loaded_by_import") or not lib.get("loaded") or not added:
                continue
            rel = os.path.relpath(lib["path"], os.path.dirname(pkg_dir) or ".")
            module = re.sub(r"(\.cpython-[^.]*|\.abi3|\.cp\d+[^.]*)?\.(so|pyd|dylib)$", "",
                            rel).replace(os.sep, ".")
            ours = [q for q in added if q.startswith(self.ns + "::")]
            if not ours and self.ns_counts.get(self.ns):
                continue  # another namespace's library, loaded on demand: not this check's
            add_cause(self.doc, "library_not_loaded",
                      f"{os.path.basename(lib['path'])} is in the package but import "
                      f"{self.package} never loads it: its ops exist only if something loads it "
                      "by hand", [f"library {lib['path']}",
                                  f"it defines {_listed(sorted(added))} when loaded (the probe "
                                  "loaded it to see; a user's process does not)"],
                      f"load it when {self.package} is imported: `import {module}` in "
                      f"{self.package}/__init__.py, or torch.ops.load_library(<path of "
                      f"{os.path.basename(lib['path'])}>)", library=lib["path"],
                      explains=_problems(self.doc, ops={q.split('::', 1)[1] for q in ours}))

    def orphans(self) -> None:
        by_ns: dict[str, dict[str, dict]] = {}
        for qualname, keys in self.added_orphans.items():
            ns, _, name = qualname.partition("::")
            by_ns.setdefault(ns, {})[name] = keys
        defined = {ns for ns in self.ns_counts if ns not in _TORCH_NAMESPACES}
        for ns, names in sorted(by_ns.items()):
            where = sorted({w for keys in names.values() for w in keys.values()})
            keys = sorted({k for k in (x for keys in names.values() for x in keys)})
            mismatch = self.cause("namespace_mismatch")
            if mismatch and ns == self.ns:  # TORCH_LIBRARY_IMPL(ns) agrees with the config
                mismatch["evidence"].append(f"{', '.join(keys)} kernels for "
                                            f"{_listed(sorted(names))} went to {ns}, which has "
                                            "no schemas")
                continue
            if ns not in self.ns_counts:
                target = (near(ns, defined, 1) or [None])[0]
                meant = f"; did you mean {target}?" if target else ""
                affected = {n for n in names if target and f"{target}::{n}" in self.ops}
                add_cause(self.doc, "orphan_kernels",
                          f"{', '.join(keys)} kernels registered for namespace {ns}, which has "
                          f"no schemas (a TORCH_LIBRARY_IMPL({ns}, ...) typo?){meant}",
                          [f"orphan kernels: {_listed(f'{ns}::{n}' for n in sorted(names))}",
                           f"registered at {_listed(where, 3)}" if where else None,
                           f"{target} defines {_listed(sorted(affected))}" if affected else None],
                          f"TORCH_LIBRARY_IMPL({target}, ...) instead of TORCH_LIBRARY_IMPL({ns}, "
                          "...)" if target else f"define the ops with TORCH_LIBRARY({ns}, m)",
                          namespace=ns, nearest=target, orphans=sorted(names),
                          explains=_problems(self.doc, ops=affected) if target == self.ns
                          else ())
                continue
            pool = [q.split("::", 1)[1] for q in self.ops if q.startswith(ns + "::")]
            pairs = {n: (near(n, pool, 1) or [None])[0] for n in sorted(names)}
            meant = ", ".join(f"{n} -> {m}" for n, m in pairs.items() if m)
            affected = {m for m in pairs.values() if m}
            add_cause(self.doc, "orphan_kernels",
                      f"{', '.join(keys)} kernels registered for {_listed(f'{ns}::{n}' for n in names)}, "
                      f"which {ns} does not define" + (f" (did you mean: {meant})" if meant else ""),
                      [f"registered at {_listed(where, 3)}" if where else None,
                       f"{ns} defines: {_listed(sorted(pool))}"],
                      "m.impl with the name m.def declared" + (f" ({meant})" if meant else ""),
                      namespace=ns, orphans=sorted(names), nearest=sorted(affected),
                      explains=_problems(self.doc, ops=affected) if ns == self.ns else ())

    def import_error(self) -> bool:
        """The import failed in Python before anything was registered: that is the cause."""
        diagnosis = self.info.get("diagnosis") or {}
        if self.info.get("ok", True) or self.added_ops or diagnosis.get("kind") not in (
                "python_error", "no_library", "not_installed"):
            return False
        if any(e.get("error") for e in self.reg.get("python") or []):
            return False  # a registration for an undefined op: python_registration says it
        head, fix = _fix_of(diagnosis.get("message", ""))
        if diagnosis.get("kind") == "no_library":  # the error itself is the evidence below
            head = head.split(") and its import fails", 1)[0] + ")"
        frames = [line.strip().splitlines()[0] for line in self.info.get("traceback") or []
                  if line.strip().startswith("File ")][-1:]
        add_cause(self.doc, "import_error", f"import {self.package} fails: {head}",
                  [self.info.get("error", "")[:300], *frames],
                  fix if " Fix: " in diagnosis.get("message", "") else
                  "fix the error at the line above; nothing was registered before it",
                  kind=diagnosis.get("kind"), explains=["import", *_problems(self.doc)])
        return True

    def empty(self) -> None:
        if self.ns_counts.get(self.ns) or self.cause("load_error", "duplicate_namespace") \
                or self.modules_only or self.import_error():
            return
        added = namespaces(self.added_ops)
        others = {ns: n for ns, n in added.items() if ns != self.ns}
        every = [ns for ns in self.ns_counts if ns not in _TORCH_NAMESPACES]
        meant = near(self.ns, list(others) or every, 1)
        if others:
            ns2 = max(others, key=lambda ns: (ns in meant, others[ns]))
            ops = sorted(q.split("::", 1)[1] for q in self.added_ops if q.startswith(ns2 + "::"))
            spelled = " (a near-miss spelling)" if ns2 in meant else ""
            add_cause(self.doc, "namespace_mismatch",
                      f"the package registered its ops under {ns2}{spelled}, not {self.ns}: "
                      f"torch.ops.{self.ns} has none",
                      [f"{self.origin(f'{ns2}::{ops[0]}')} defined {ns2}::"
                       f"{{{_listed(ops)}}} ({len(ops)} ops)"],
                      f"TORCH_LIBRARY({self.ns}, m) in the library's source, or namespace "
                      f"{ns2} in matrix.yaml (extension.namespace, or --namespace {ns2})",
                      configured=self.ns, found=ns2, ops=ops, explains=_problems(self.doc))
            return
        hint = f"; did you mean {meant[0]}?" if meant else ""
        add_cause(self.doc, "empty_namespace",
                  f"torch.ops.{self.ns} has no ops after import {self.package}{hint}",
                  [f"import {self.package} registered no op schema in any namespace"
                   + (f" (orphan kernels only: {_listed(sorted(self.added_orphans))})"
                      if self.added_orphans else ""),
                   f"namespaces with ops here: {_listed(sorted(every))}" if every else None],
                  f"check --namespace / extension.namespace ({self.ns}) against the library's "
                  "TORCH_LIBRARY, and that importing the package loads its library",
                  configured=self.ns, explains=_problems(self.doc))

    def missing_fakes(self) -> None:
        prefix = self.ns + "::"
        promised = {op: "Meta" in keys for op, keys in (self.doc.get("op_keys") or {}).items()}
        fake = []
        for row in (self.doc.get("census") or {}).get("ops", []):
            if not row.get("found"):
                continue
            has = self.t._C._dispatch_has_kernel_for_dispatch_key
            q = prefix + row["op"]
            if any(has(q, k) for k in ("Meta", "CompositeImplicitAutograd",
                                       "CompositeExplicitAutograd")) or self._python_fake(q):
                continue
            fake.append(row["op"])
        for cause in self.doc.get("causes", []):  # a fake registered under a misspelt name
            if cause["class"] == "python_registration" and cause.get("nearest") in \
                    {prefix + op for op in fake} and cause.get("api") in FAKE_APIS:
                fake.remove(cause["nearest"][len(prefix):])
                cause["evidence"].append(f"so {cause['nearest']} has no fake kernel")
        if not fake:
            return
        must = [op for op in fake if promised.get(op) or (
            not promised and "Meta" in (self.doc.get("expected_keys") or []))]
        status = "fail" if must else "warn"
        add_cause(self.doc, "missing_fake",
                  f"{len(fake)} op{'s' if len(fake) > 1 else ''} without a fake (Meta) kernel: "
                  f"torch.compile, torch.export and FakeTensorMode fail on {_listed(fake)}",
                  [f"{prefix}{op}: no Meta kernel and no Python fake" for op in fake[:6]],
                  "torch.library.register_fake(\"" + prefix + fake[0] + "\") (or a Meta kernel "
                  "in C++) for each" + ("" if must else "; or promise no Meta for them"),
                  status=status, ops=fake,
                  explains=[i for i in _problems(self.doc, ops=set(fake),
                                                 categories=("census", *explained_by("Meta")))
                            if i.endswith(":Meta") or not i.startswith("census:")])

    def _python_fake(self, qualname: str) -> bool:
        # torch's private registry: only where torch is imported (the probe in the target)
        try:
            from torch._library import simple_registry
            entry = simple_registry.singleton.find(qualname)
            return entry.fake_impl.kernel is not None
        except Exception:  # noqa: BLE001 - an older torch without the registry
            return False

    def wrong_torch(self) -> None:
        match = next((c for c in self.doc.get("checks", []) if c["id"] == "torch-match"), None)
        if not match or match["status"] not in ("warn", "fail"):
            return
        if any(c.get("kind") in ("abi_drift", "stable_symbol_missing")
               for c in self.doc.get("causes", [])):
            return
        env, build = self.doc.get("environment") or {}, self.doc.get("build") or {}
        info = build.get("build_info") or {}
        cuda = f"; built with CUDA {info['cuda_version']}, torch's CUDA " \
               f"{env.get('torch_cuda_version') or 'none (CPU build)'}" \
            if info.get("cuda_version") and info["cuda_version"] != env.get("torch_cuda_version") \
            else ""
        add_cause(self.doc, "wrong_torch",
                  f"torch {env.get('torch_version')} is not the torch {self.package} was built "
                  f"for ({build.get('built_against_torch')})",
                  [f"{build.get('source') or 'build'}: built against torch "
                   f"{build.get('built_against_torch')}{cuda}",
                   f"running {env.get('torch_file') or 'torch'}"],
                  f"pip install the torch the wheel pins ({build.get('torch_requirement') or 'torch==' + str(build.get('built_against_torch'))}), "
                  "or rebuild the wheel against this torch",
                  status=match["status"], explains=["torch-match"])


def diagnose(report, t, namespace: str, package: str, spec: dict | None = None) -> None:
    Diagnosis(report.doc, t, namespace, package, spec or {}).run()
