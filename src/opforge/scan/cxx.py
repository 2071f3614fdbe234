"""C++ registrations: ``(STABLE_)TORCH_LIBRARY(_FRAGMENT/_IMPL)`` blocks, ``RegisterOperators``
chains and ``PYBIND11_MODULE`` modules."""

from __future__ import annotations

import re
from pathlib import Path

from opforge.scan.model import ALIAS_KEYS, Scan, ScannedOp
from opforge.scan.signatures import signature
from opforge.scan.text import closing, line_of, read_source, schema_name, split_top, strip_comments

_LIBRARY = re.compile(r"\b(?:STABLE_)?TORCH_LIBRARY(?:_FRAGMENT)?\s*\(\s*(\w+)\s*,\s*(\w+)\s*\)")
_LIBRARY_IMPL = re.compile(
    r"\b(?:STABLE_)?TORCH_LIBRARY_IMPL\s*\(\s*(\w+)\s*,\s*(\w+)\s*,\s*(\w+)\s*\)")
_STRING = r'"((?:[^"\\]|\\.)*)"'


_REGISTER_OPERATORS = re.compile(r"\b(?:torch|c10)::RegisterOperators\b\s*(?:\(|\{)")
_PYBIND_MODULE = re.compile(r"\bPYBIND11_MODULE\s*\(\s*(\w+)\s*,\s*(\w+)\s*\)")

def _blocks(text: str, pattern: re.Pattern):
    """(match, body) for each ``MACRO(...) { body }``, braces balanced."""
    for match in pattern.finditer(text):
        start = text.find("{", match.end())
        if start == -1:
            continue
        yield match, text[start + 1:closing(text, start)]


def scan_cxx(scan: Scan, path: Path) -> None:
    raw = read_source(path)
    text = strip_comments(raw)
    rel = path.relative_to(scan.root).as_posix()
    registered = scan.registers.setdefault(rel, set())
    for match, body in _blocks(text, _LIBRARY):
        namespace = match.group(1)
        scan.namespaces.setdefault(namespace, {})
        names = []
        for d in re.finditer(r"\.def\s*\(\s*(?:TORCH_SELECTIVE_SCHEMA\s*\(\s*)?((?:" + _STRING
                             + r"\s*)+)", body):
            schema = "".join(re.findall(_STRING, d.group(1)))
            ns, name = schema_name(schema)
            op = scan.op(ns or namespace, name, rel)
            registered.add(f"{ns or namespace}::{name}")
            names.append(name)
            op.where = rel  # where the op is defined, rather than first seen
            if "(" in schema:
                op.schema = schema
            op.mutating = op.mutating or "!)" in schema
            # m.def("schema", &fn): a catch-all kernel, used for every key
            rest = body[d.end():closing(body, d.start() + body[d.start():].find("("), "(", ")")]
            if rest.lstrip().startswith(","):
                op.keys.update(ALIAS_KEYS["CompositeImplicitAutograd"])
                if "(" not in schema and op.schema is None:
                    _infer(op, scan, rest.lstrip()[1:])
        kind = match.group(0).split("(")[0].strip()
        scan.abi_kinds.add("stable" if kind.startswith("STABLE_") else "legacy")
        scan.saw(rel, f"{kind}({namespace}): " + (f"defines {', '.join(names)}" if names
                                                  else "no m.def"))
    for match, body in _blocks(text, _LIBRARY_IMPL):
        namespace, key = match.group(1), match.group(2)
        names = []
        for i in re.finditer(r"\.impl\s*\(\s*(?:TORCH_SELECTIVE_NAME\s*\(\s*)?" + _STRING, body):
            ns, name = schema_name(i.group(1))
            op = scan.op(ns or namespace, name, rel)
            op.register(key)
            if key in ("CPU", "CompositeExplicitAutograd", "CompositeImplicitAutograd") and \
                    not op.hints:
                impl = body[i.end():closing(body, body.rfind("(", 0, i.start() + 6), "(", ")")]
                impl = impl.lstrip()[1:] if impl.lstrip().startswith(",") else impl
                op.pending_impl = impl
            registered.add(f"{ns or namespace}::{name}")
            names.append(name)
        scan.saw(rel, f"{match.group(0).split('(')[0].strip()}({namespace}, {key}): "
                      f"{', '.join(names) or 'no m.impl'}")
    _register_operators(scan, text, rel, registered)
    _pybind_modules(scan, text, rel)


def _infer(op: ScannedOp, scan: Scan, fn_args: str) -> None:
    params, op.hints = signature(scan, fn_args)
    if params is not None:
        op.schema, op.inferred = f"{op.name}({params}) -> ...", True
        op.mutating = op.mutating or "!)" in params


def _register_operators(scan: Scan, text: str, rel: str, registered: set[str]) -> None:
    """``torch::RegisterOperators().op("ns::name", &fn).op(...)`` and the options() form."""
    for match in _REGISTER_OPERATORS.finditer(text):
        end = text.find(";", match.end())
        while end != -1 and text.count("(", match.start(), end) > text.count(")", match.start(), end):
            end = text.find(";", end + 1)
        chain = text[match.start():end if end != -1 else len(text)]
        calls = []  # the argument text of each .op(...) and of the constructor
        for c in re.finditer(r"(?:\.op\s*\(|RegisterOperators\s*[({])", chain):
            opened = c.end() - 1
            calls.append(chain[opened + 1:closing(chain, opened, chain[opened],
                                                   ")" if chain[opened] == "(" else "}")])
        names = []
        for args in calls:
            strings = re.findall(_STRING, args)
            schema = next((s for s in strings if "::" in s), None)
            if schema is None:
                continue
            ns, name = schema_name(schema)
            if ns is None:
                continue
            op = scan.op(ns, name, rel)
            op.where = rel
            registered.add(f"{ns}::{name}")
            names.append(name)
            if "(" in schema:
                op.schema = schema.split("::", 1)[1]
                op.mutating = op.mutating or "!)" in schema
            else:
                after = args[args.find('"' + schema + '"') + len(schema) + 2:].lstrip()
                _infer(op, scan, after[1:] if after.startswith(",") else after)
            keys = re.findall(r"DispatchKey::(\w+)", args)
            for key in keys or ["CompositeImplicitAutograd"]:  # no key: a catch-all kernel
                op.register(key)
        scan.abi_kinds.add("legacy")
        if names:
            scan.saw(rel, f"RegisterOperators: {', '.join(names)}")
        else:
            scan.by_hand.append(f"{rel}:{line_of(text, match.start())}: a RegisterOperators "
                                "chain whose op names are not string literals: list its ops "
                                "under extension.ops in matrix.yaml by hand")


def _pybind_modules(scan: Scan, text: str, rel: str) -> None:
    for match, body in _blocks(text, _PYBIND_MODULE):
        name, var = match.group(1), match.group(2)
        functions: dict[str, str | None] = {}
        hints: dict[str, dict] = {}
        for d in re.finditer(rf"\b{var}\s*\.\s*def\s*\(\s*{_STRING}", body):
            condition = preprocessor_condition(body, d.start())
            if condition is not None:  # #ifdef WITH_CUDA: only some builds export it
                scan.saw(rel, f"{d.group(1)} is defined only under {condition}: not promised")
                continue
            opened = body.rfind("(", 0, d.end())
            args = body[d.end():closing(body, opened, "(", ")")].lstrip()
            args = args[1:] if args.startswith(",") else args
            params, hints[d.group(1)] = signature(scan, args)
            if params is not None:
                params = _pybind_defaults(params, args)
            functions[d.group(1)] = params
        scan.pybind[rel] = (name, functions, hints)
        scan.abi_kinds.add("legacy")


_DIRECTIVE = re.compile(r"^[ \t]*#[ \t]*(if|ifdef|ifndef|elif|else|endif)\b([^\n]*)", re.M)


def preprocessor_condition(text: str, pos: int) -> str | None:
    """The innermost ``#if`` / ``#ifdef`` (as written, with its ``#else``) ``pos`` of
    ``text`` sits in, or None when no conditional encloses it."""
    stack: list[str] = []
    for m in _DIRECTIVE.finditer(text, 0, pos):
        word, rest = m.group(1), m.group(2).strip()
        if word in ("if", "ifdef", "ifndef"):
            stack.append(f"#{word} {rest}".strip())
        elif word in ("elif", "else") and stack:
            stack[-1] = f"{stack[-1]} (its #{word}{' ' + rest if rest else ''})"
        elif word == "endif" and stack:
            stack.pop()
    return stack[-1] if stack else None


def _pybind_defaults(params: str, args: str) -> str:
    """Apply ``py::arg("k") = 3`` defaults (and names) to the inferred parameters."""
    given = re.findall(r"(?:py|pybind11)::arg\s*\(\s*" + _STRING + r"\s*\)\s*(?:=\s*([^,)]+))?",
                       args)
    parts = split_top(params)
    if not given or len(given) != len(parts):
        return params
    out = []
    for part, (name, default) in zip(parts, given):
        kind = part.split(" ", 1)[0]
        default = {"true": "True", "false": "False", "py::none()": "None"}.get(
            default.strip(), default.strip())
        out.append(f"{kind} {name}" + (f"={default}" if default else ""))
    return ", ".join(out)
