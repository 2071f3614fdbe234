"""Kernels that say, in their own source, that the op has no kernel for a device by design.

``opforge init`` proposes ``- op: {no_kernel: [cpu]}`` in matrix.yaml when an op's every
kernel for the device does nothing but raise an error whose words say so (``No CPU version
supported``, ``not implemented on CPU``), read with the probe's own vocabulary
(``opforge.smoke.probe.rejections.no_kernel_device``: ``Not compiled with CUDA support`` is a
build fault, never a design). The evidence must be plain, or nothing is proposed:

- a kernel registered for the device's key (``TORCH_LIBRARY_IMPL(ns, CPU, m)``,
  ``DispatchKey::CPU``, ``register_kernel(op, "cpu")``) whose whole body is that raise;
- a kernel for every device (``m.def("op", &fn)``, a ``RegisterOperators`` op with no key, a
  ``custom_op`` with no device types) that tests the device at its top level and, on the
  device's path, only raises: ``if (x.is_cuda()) {...} else { AT_ERROR("No CPU version") }``,
  ``if (x.is_cpu()) AT_ERROR(...)``, or ``if (x.is_cuda()) { return ...; } AT_ERROR(...)``.

A raise is unconditional (``AT_ERROR``, ``TORCH_CHECK(false, ...)``, ``throw ...``, Python's
``raise``); a ``TORCH_CHECK`` with a condition is an argument check, never evidence. A raise
under a preprocessor conditional, a kernel whose source is not found (or defined twice), a
registration not read, or any kernel of the device that runs: nothing is proposed.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

from opforge.dispatch_keys import NO_KERNEL_DEVICES
from opforge.scan.cxx import preprocessor_condition
from opforge.scan.model import Kernel, Scan, ScannedOp
from opforge.scan.signatures import MAX_BODY, _callee
from opforge.scan.text import split_top
from opforge.smoke.probe.rejections import no_kernel_device

CATCH_ALL = ("CompositeImplicitAutograd", "CompositeExplicitAutograd")
_STRING = r'"((?:[^"\\\n]|\\.)*)"'
_UNSAFE = re.compile(r"[\x00-\x1f\x7f\x85\u2028\u2029\ufeff]")
_DEVICES = ("cpu", "cuda", "mps", "xpu")


def find_no_kernel(scan: Scan) -> None:
    """Set ``op.no_kernel`` (device -> the evidence) for every op of the scan."""
    for ops in scan.namespaces.values():
        for op in ops.values():
            for device in NO_KERNEL_DEVICES:
                why = _decide(scan, op, device)
                if why:
                    op.no_kernel[device] = why


def _decide(scan: Scan, op: ScannedOp, device: str) -> str | None:
    key = NO_KERNEL_DEVICES[device]
    keyed = [k for k in op.kernels if k.key == key]
    if not keyed and key in op.named:
        return None  # registered for the key in a way the scan did not keep: no evidence
    kernels = keyed or [k for k in op.kernels if k.key in CATCH_ALL]
    found = [_evidence(scan, k, device, branch=not keyed) for k in kernels]
    return found[0] if found and all(found) else None


def _evidence(scan: Scan, kernel: Kernel, device: str, branch: bool) -> str | None:
    if kernel.raises is not None:  # a Python kernel, read when it was scanned
        return kernel.raises.get(device)
    source = _cxx_source(scan, kernel)
    if source is None:
        return None
    body, rel, first = source
    stmts = _statements(body, 1, len(body))
    raised = _device_path_raise(stmts, device) if branch else _sole_raise(stmts)
    if raised is None:
        return None
    at, message = raised
    if no_kernel_device(message) != device or preprocessor_condition(body, at) is not None:
        return None
    line = first + body.count("\n", 0, at)
    return f'{rel}:{line} raises "{_shown(message)}"'


def _cxx_source(scan: Scan, kernel: Kernel) -> tuple[str, str, int] | None:
    """(body from its ``{``, file, the line it starts on) of a C++ kernel: a lambda in the
    registration, or the function it names, defined once and read whole."""
    rel = kernel.where.rsplit(":", 1)[0]
    lam = re.search(r"\[[^\]]*\]\s*\([^()]*\)\s*(?:->\s*[\w:<>]+\s*)?\{", kernel.args)
    if lam and kernel.args.lstrip().startswith("["):
        opened = lam.end() - 1
        end = _match(kernel.args, opened)
        return kernel.args[opened:end], rel, kernel.line + kernel.args.count("\n", 0, opened)
    name = _callee(split_top(kernel.args)[0]) if kernel.args.strip() else None
    sites = scan.cxx_sites.get(name or "", [])
    if name not in scan.cxx_functions or len(sites) != 1:
        return None
    body = scan.cxx_functions[name][1]
    if len(body) >= MAX_BODY:
        return None  # cut short: its statements cannot be told
    return body, sites[0][0], sites[0][1]


# ------------------------------------------------------------------ C++ statements


@dataclass
class _Stmt:
    kind: str                 # simple, if, block, pp, other
    at: int                   # offset in the text
    text: str = ""            # simple: the statement; if: its condition
    then: list[_Stmt] = field(default_factory=list)
    orelse: list[_Stmt] | None = None


def _match(text: str, i: int) -> int:
    """The index of the bracket closing the one at ``i`` (string and character literals
    skipped), or len(text)."""
    pairs = {"(": ")", "{": "}", "[": "]"}
    stack = []
    while i < len(text):
        ch = text[i]
        if ch in "\"'":
            i += 1
            while i < len(text) and text[i] != ch and text[i] != "\n":
                i += 2 if text[i] == "\\" else 1
            if not stack:
                return i  # the literal's own end
        elif ch in pairs:
            stack.append(pairs[ch])
        elif ch in ")}]":
            if not stack or stack.pop() != ch:
                return len(text)
            if not stack:
                return i
        i += 1
    return len(text)


def _skip_space(text: str, i: int, end: int) -> int:
    while i < end and text[i].isspace():
        i += 1
    return i


def _word(text: str, i: int, word: str) -> bool:
    return text.startswith(word, i) and not (text[i + len(word):i + len(word) + 1].isalnum()
                                             or text[i + len(word):i + len(word) + 1] == "_")


def _statements(text: str, i: int, end: int) -> list[_Stmt]:
    out = []
    while True:
        i = _skip_space(text, i, end)
        if i >= end:
            return out
        stmt, i = _statement(text, i, end)
        out.append(stmt)


def _statement(text: str, i: int, end: int) -> tuple[_Stmt, int]:
    if text[i] == "#":  # a directive, with its continuation lines
        j = i
        while True:
            j = text.find("\n", j)
            if j == -1 or j >= end or text[j - 1] != "\\":
                break
            j += 1
        j = end if j == -1 or j > end else j
        return _Stmt("pp", i, text[i:j]), j
    if text[i] == "{":
        j = min(_match(text, i), end)
        return _Stmt("block", i, then=_statements(text, i + 1, j)), j + 1
    if _word(text, i, "if"):
        p = text.find("(", i)
        if p == -1 or p >= end:
            return _Stmt("other", i), end
        q = min(_match(text, p), end)
        then, j = _statement(text, _skip_space(text, q + 1, end), end) if q + 1 < end \
            else (_Stmt("other", q), end)
        stmt = _Stmt("if", i, text[p + 1:q], then=_flat(then))
        k = _skip_space(text, j, end)
        if k < end and _word(text, k, "else"):
            orelse, j = _statement(text, _skip_space(text, k + 4, end), end)
            stmt.orelse = _flat(orelse)
        return stmt, j
    for word in ("for", "while", "switch", "do", "try"):
        if _word(text, i, word):  # not read inside: a raise there is not the device's path
            j = i + len(word)
            while True:
                j = _skip_space(text, j, end)
                if j >= end:
                    return _Stmt("other", i), end
                if text[j] == "{":
                    j = _match(text, j) + 1
                    k = _skip_space(text, j, end)
                    if not (_word(text, k, "catch") or _word(text, k, "while")):
                        return _Stmt("other", i), j
                    j = k
                elif text[j] == ";":
                    return _Stmt("other", i), j + 1
                elif text[j] in "([":
                    j = _match(text, j) + 1
                else:
                    j += 1
    j = i
    while j < end and text[j] != ";":
        j = _match(text, j) + 1 if text[j] in "([{\"'" else j + 1
    return _Stmt("simple", i, text[i:j + 1]), j + 1


def _flat(stmt: _Stmt) -> list[_Stmt]:
    return stmt.then if stmt.kind == "block" else [stmt]


_RAISE = re.compile(r"(AT_ERROR|TORCH_CHECK\w*|STD_TORCH_CHECK\w*|C10_THROW_ERROR)\s*\(")
_THROW = re.compile(r"throw\s+(?:::)?(?:\w+::)*\w+\s*[({]")


def _raise_message(stmt: _Stmt) -> str | None:
    """The words of an unconditional raise, or None (a check with a condition included)."""
    if stmt.kind != "simple":
        return None
    text = stmt.text.strip()
    m = _RAISE.match(text) or _THROW.match(text)
    if not m:
        return None
    opened = m.end() - 1
    close = _match(text, opened)
    if text[close + 1:].strip() != ";":
        return None
    args = split_top(text[opened + 1:close])
    if m.re is _RAISE and m.group(1) == "C10_THROW_ERROR":
        args = args[1:]  # C10_THROW_ERROR(NotImplementedError, "...")
    elif m.re is _RAISE and m.group(1) != "AT_ERROR":
        if not args or args[0].strip() not in ("false", "0"):
            return None  # TORCH_CHECK(cond, ...): an argument check
        args = args[1:]
    words = "".join(s for a in args for s in re.findall(_STRING, a))
    return words or None


def _sole_raise(stmts: list[_Stmt]) -> tuple[int, str] | None:
    """A block that is one unconditional raise and nothing else: (offset, words)."""
    if len(stmts) != 1:
        return None
    message = _raise_message(stmts[0])
    return (stmts[0].at, message) if message else None


_TEST = re.compile(r"(!?)\(?[\w.:>\-()\[\]]*?(?:\.|->)is_(cpu|cuda|mps|xpu)\(\)\)?")
_TYPE_TEST = re.compile(r"\(?[\w.:>\-()\[\]]*?(?:\.|->)(?:device\(\)(?:\.type\(\))?|"
                        r"device_type\(\))(==|!=)(?:\w+::)*k?(CPU|CUDA|MPS|XPU)\)?")


def _device_test(cond: str) -> tuple[str, bool] | None:
    """``x.is_cuda()`` -> ('cuda', True), ``!x.is_cuda()`` -> ('cuda', False),
    ``x.device().type() == at::kCPU`` -> ('cpu', True); tests of one device joined by && or
    ||; anything else None."""
    text = re.sub(r"\s+", "", cond)
    while text.startswith("(") and _match(text, 0) == len(text) - 1:
        text = text[1:-1]
    atoms = re.split(r"&&|\|\|", text)
    seen = set()
    for atom in atoms:
        m = _TEST.fullmatch(atom)
        if m:
            seen.add((m.group(2), not m.group(1)))
            continue
        m = _TYPE_TEST.fullmatch(atom)
        if not m:
            return None
        seen.add((m.group(2).lower(), m.group(1) == "=="))
    return seen.pop() if len(seen) == 1 else None


def _serves(test: tuple[str, bool] | None, device: str) -> bool:
    """Does a branch taken when ``test`` holds serve ``device`` (and only it, or the CPU as
    what is left when another device is ruled out)?"""
    if test is None:
        return False
    tested, positive = test
    return tested == device if positive else (device == "cpu" and tested != "cpu")


def _ends(stmts: list[_Stmt]) -> bool:
    """The branch leaves the function: its last statement returns or raises."""
    last = [s for s in stmts if s.kind != "pp"]
    return bool(last) and last[-1].kind == "simple" and (
        _word(last[-1].text.strip(), 0, "return") or _raise_message(last[-1]) is not None)


def _device_path_raise(stmts: list[_Stmt], device: str) -> tuple[int, str] | None:
    """The raise on ``device``'s path of a kernel that tests the device at its top level:
    the branch that serves it, the ``else`` after tests of other devices (the CPU's), or the
    last statement after ``if``s of other devices that each leave the function (the CPU's)."""
    others = False  # tests of other devices seen, each branch leaving the function
    for stmt in stmts:
        if stmt.kind != "if":
            continue
        chain, rest = [], stmt
        while rest is not None:  # if / else if / else
            chain.append((_device_test(rest.text), rest.then))
            nxt, rest = rest.orelse, None
            if nxt and len(nxt) == 1 and nxt[0].kind == "if":
                rest = nxt[0]
            elif nxt is not None:
                chain.append(("else", nxt))
        for test, branch in chain:
            if test != "else" and _serves(test, device):
                return _sole_raise(branch)
        tests = [t for t, _ in chain if t != "else"]
        if device == "cpu" and all(t is not None and t[1] and t[0] != "cpu" for t in tests):
            if chain[-1][0] == "else":
                return _sole_raise(chain[-1][1])
            if all(_ends(branch) for _, branch in chain):
                others = True
                continue
            return None
        if all(t is None for t in tests) and not any(_ends(b) for _, b in chain):
            continue  # a test of something else that falls through (``if (!out) out = ...``)
        return None
    tail = [s for s in stmts if s.kind != "pp"]
    message = _raise_message(tail[-1]) if tail else None
    return (tail[-1].at, message) if others and message else None


def _shown(message: str) -> str:
    text = _UNSAFE.sub(" ", message).replace('"', "'")
    return text if len(text) <= 100 else text[:97] + "..."


# ------------------------------------------------------------------ Python kernels


def python_raises(func: ast.FunctionDef | None, rel: str, devices: list[str] | None
                  ) -> dict[str, str] | None:
    """What a Python kernel raises "no kernel" for: ``devices`` (those it is registered for)
    when its whole body is that raise; for a kernel of every device (``devices`` None), the
    device whose path it tests for at its top level and only raises on. None: the kernel's
    source is not known."""
    if func is None:
        return None
    body = list(func.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]  # the docstring
    out: dict[str, str] = {}
    if devices is not None:
        raised = _py_sole_raise(body)
        if raised and raised[1] in devices:
            out[raised[1]] = f'{rel}:{raised[0]} raises "{_shown(raised[2])}"'
        return out
    for device in NO_KERNEL_DEVICES:
        raised = _py_path_raise(body, device)
        if raised and raised[1] == device:
            out[device] = f'{rel}:{raised[0]} raises "{_shown(raised[2])}"'
    return out


def _py_path_raise(body: list[ast.stmt], device: str) -> tuple[int, str, str] | None:
    """As ``_device_path_raise``, for a Python kernel's statements."""
    others = False
    for node in body:
        if not isinstance(node, ast.If):
            continue
        chain, rest = [], node
        while rest is not None:  # if / elif / else
            chain.append((_py_device_test(rest.test), rest.body))
            nxt, rest = rest.orelse, None
            if len(nxt) == 1 and isinstance(nxt[0], ast.If):
                rest = nxt[0]
            elif nxt:
                chain.append(("else", nxt))
        for test, branch in chain:
            if test != "else" and _serves(test, device):
                return _py_sole_raise(branch)
        tests = [t for t, _ in chain if t != "else"]
        if device == "cpu" and all(t is not None and t[1] and t[0] != "cpu" for t in tests):
            if chain[-1][0] == "else":
                return _py_sole_raise(chain[-1][1])
            if all(_py_ends(branch) for _, branch in chain):
                others = True
                continue
            return None
        if all(t is None for t in tests) and not any(_py_ends(b) for _, b in chain):
            continue
        return None
    return _py_sole_raise(body[-1:]) if others else None


def _py_ends(body: list[ast.stmt]) -> bool:
    return bool(body) and isinstance(body[-1], (ast.Return, ast.Raise))


def _py_sole_raise(body: list[ast.stmt]) -> tuple[int, str, str] | None:
    """(line, device, words) of a body that is one raise naming a device it has no kernel
    for."""
    if len(body) != 1 or not isinstance(body[0], ast.Raise):
        return None
    exc = body[0].exc
    args = exc.args if isinstance(exc, ast.Call) else []
    words = ""
    for arg in args[:1]:
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            words = arg.value
        elif isinstance(arg, ast.JoinedStr):
            words = "".join(v.value if isinstance(v, ast.Constant) else "{}"
                            for v in arg.values)
    device = no_kernel_device(words) if words else None
    return (body[0].lineno, device, words) if device else None


def _py_device_test(test: ast.expr) -> tuple[str, bool] | None:
    """``x.is_cuda`` / ``x.device.type == "cpu"`` / ``not ...`` as (device, positive)."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _py_device_test(test.operand)
        return (inner[0], not inner[1]) if inner else None
    if isinstance(test, ast.Attribute) and test.attr.startswith("is_") and \
            test.attr[3:] in _DEVICES:
        return test.attr[3:], True
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and \
            isinstance(test.ops[0], (ast.Eq, ast.NotEq)) and \
            isinstance(test.left, ast.Attribute) and test.left.attr == "type" and \
            isinstance(test.comparators[0], ast.Constant) and \
            test.comparators[0].value in _DEVICES:
        return test.comparators[0].value, isinstance(test.ops[0], ast.Eq)
    return None
