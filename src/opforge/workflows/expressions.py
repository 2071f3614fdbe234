"""GitHub Actions expressions (``${{ ... }}``): parse, evaluate, render.

Enough of the language for the checks and for running a workflow's steps locally: literals,
contexts with ``.name`` / ``[index]``, ``! == != < > <= >= && ||`` (which, as on GitHub, return
an operand, so ``cond && 'a' || 'b'`` works), and the functions workflows use. Comparisons
follow GitHub's rules: strings compare case-insensitively, mixed types compare as numbers.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

EXPRESSION = re.compile(r"\$\{\{(.*?)\}\}", re.S)
_STATUS_FUNCTIONS = re.compile(r"\b(success|failure|always|cancelled)\s*\(", re.I)


class ExpressionError(ValueError):
    """An expression this module cannot parse or evaluate."""


_TOKEN = re.compile(r"""\s*(?:(?P<num>\d+(?:\.\d+)?)|(?P<str>'(?:[^']|'')*')
    |(?P<op>==|!=|<=|>=|&&|\|\||[!<>()\[\],.*])|(?P<name>[A-Za-z_][A-Za-z0-9_-]*))""", re.X)


def _tokens(src: str) -> list[tuple[str, str]]:
    out, pos, src = [], 0, src.strip()
    while pos < len(src):
        m = _TOKEN.match(src, pos)
        if not m or m.end() == pos:
            raise ExpressionError(f"cannot read {src[pos:]!r} in expression {src!r}")
        pos = m.end()
        kind = m.lastgroup
        out.append((kind, m.group(kind)))
    return out


class _Parser:
    """Recursive descent over GitHub's expression grammar, producing a tuple AST."""

    def __init__(self, src: str):
        self.src, self.toks, self.i = src, _tokens(src), 0

    def peek(self) -> tuple[str, str] | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self, value: str | None = None) -> tuple[str, str]:
        tok = self.peek()
        if tok is None or (value is not None and tok[1] != value):
            raise ExpressionError(f"expected {value or 'more'} in expression {self.src!r}")
        self.i += 1
        return tok

    def parse(self) -> tuple:
        node = self.disjunction()
        if self.peek() is not None:
            raise ExpressionError(f"unexpected {self.peek()[1]!r} in expression {self.src!r}")
        return node

    def disjunction(self) -> tuple:
        node = self.conjunction()
        while self.peek() == ("op", "||"):
            self.take()
            node = ("or", node, self.conjunction())
        return node

    def conjunction(self) -> tuple:
        node = self.comparison()
        while self.peek() == ("op", "&&"):
            self.take()
            node = ("and", node, self.comparison())
        return node

    def comparison(self) -> tuple:
        node = self.unary()
        tok = self.peek()
        if tok and tok[0] == "op" and tok[1] in ("==", "!=", "<", ">", "<=", ">="):
            self.take()
            node = ("cmp", tok[1], node, self.unary())
        return node

    def unary(self) -> tuple:
        if self.peek() == ("op", "!"):
            self.take()
            return ("not", self.unary())
        return self.postfix(self.primary())

    def primary(self) -> tuple:
        kind, value = self.take()
        if kind == "num":
            return ("lit", float(value))
        if kind == "str":
            return ("lit", value[1:-1].replace("''", "'"))
        if (kind, value) == ("op", "("):
            node = self.disjunction()
            self.take(")")
            return node
        if kind != "name":
            raise ExpressionError(f"unexpected {value!r} in expression {self.src!r}")
        if value in ("true", "false"):
            return ("lit", value == "true")
        if value == "null":
            return ("lit", None)
        if self.peek() == ("op", "("):
            self.take()
            args = []
            while self.peek() != ("op", ")"):
                args.append(self.disjunction())
                if self.peek() == ("op", ","):
                    self.take()
            self.take(")")
            return ("call", value.lower(), args)
        return ("ctx", value)

    def postfix(self, node: tuple) -> tuple:
        while self.peek() in (("op", "."), ("op", "[")):
            if self.take()[1] == ".":
                kind, name = self.take()
                if kind != "name":
                    raise ExpressionError(f"expected a property name in {self.src!r}")
                node = ("get", node, ("lit", name))
            else:
                index = self.disjunction()
                self.take("]")
                node = ("get", node, index)
        return node


def _truthy(value: Any) -> bool:
    if isinstance(value, float) and math.isnan(value):
        return False
    return value not in (None, False, 0, "")


def _number(value: Any) -> float:
    if value is None:
        return 0.0
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip() or 0)
        except ValueError:
            return math.nan
    return math.nan


def _compare(op: str, a: Any, b: Any) -> bool:
    if isinstance(a, str) and isinstance(b, str):
        a, b = a.casefold(), b.casefold()
    elif type(a) is not type(b) or not isinstance(a, (str, float, int, bool, type(None))):
        a, b = _number(a), _number(b)
    if op in ("==", "!="):
        return (a == b) == (op == "==")
    try:
        return {"<": a < b, ">": a > b, "<=": a <= b, ">=": a >= b}[op]
    except TypeError:
        return False


def to_str(value: Any) -> str:
    """An expression value as GitHub writes it into text."""
    if isinstance(value, Placeholder):
        return str(value)
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)


def _call(name: str, args: list[Any], ctx: dict[str, Any]) -> Any:
    status = ctx.get("__status__", "success")
    if name in ("success", "failure", "always", "cancelled"):
        return {"success": status == "success", "failure": status == "failure",
                "always": True, "cancelled": status == "cancelled"}[name]
    if name == "fromjson":
        try:
            return json.loads(args[0])
        except (TypeError, ValueError, IndexError):
            raise ExpressionError(f"fromJSON of {args[:1]!r} is not JSON") from None
    if name == "tojson":
        return json.dumps(args[0], indent=2)
    if name == "format":
        return re.sub(r"\{(\d+)\}", lambda m: to_str(args[int(m.group(1)) + 1]), to_str(args[0]))
    if name == "join":
        sep = to_str(args[1]) if len(args) > 1 else ","
        return sep.join(map(to_str, args[0])) if isinstance(args[0], list) else to_str(args[0])
    if name in ("contains", "startswith", "endswith"):
        hay, needle = args
        if name == "contains" and isinstance(hay, list):
            return any(_compare("==", x, needle) for x in hay)
        hay, needle = to_str(hay).casefold(), to_str(needle).casefold()
        return {"contains": needle in hay, "startswith": hay.startswith(needle),
                "endswith": hay.endswith(needle)}[name]
    if name == "hashfiles":
        fn = ctx.get("__hashfiles__")
        return fn(*map(to_str, args)) if fn else "<hashFiles>"
    raise ExpressionError(f"function {name}() is not supported here")


def _eval(node: tuple, ctx: dict[str, Any]) -> Any:
    kind = node[0]
    if kind == "lit":
        return node[1]
    if kind == "ctx":
        if node[1] not in ctx:
            raise ExpressionError(f"unknown context {node[1]!r}")
        return ctx[node[1]]
    if kind == "get":
        base, key = _eval(node[1], ctx), _eval(node[2], ctx)
        if isinstance(base, dict):
            return base.get(key) if isinstance(key, str) else None
        if isinstance(base, list) and isinstance(key, float) and key.is_integer():
            return base[int(key)] if 0 <= key < len(base) else None
        return None
    if kind == "call":
        return _call(node[1], [_eval(arg, ctx) for arg in node[2]], ctx)
    if kind == "not":
        return not _truthy(_eval(node[1], ctx))
    if kind == "and":
        left = _eval(node[1], ctx)
        return _eval(node[2], ctx) if _truthy(left) else left
    if kind == "or":
        left = _eval(node[1], ctx)
        return left if _truthy(left) else _eval(node[2], ctx)
    return _compare(node[1], _eval(node[2], ctx), _eval(node[3], ctx))


def evaluate(expression: str, ctx: dict[str, Any]) -> Any:
    """Evaluate one expression (without ``${{ }}``) against the contexts in ``ctx``."""
    return _eval(_Parser(expression).parse(), ctx)


def render(text: Any, ctx: dict[str, Any]) -> Any:
    """Replace every ``${{ expr }}`` in ``text``; a string that is one expression keeps its type."""
    if not isinstance(text, str):
        return text
    whole = single_expression(text)
    if whole is not None:
        return evaluate(whole, ctx)
    return EXPRESSION.sub(lambda m: to_str(evaluate(m.group(1), ctx)), text)


def condition(text: Any, ctx: dict[str, Any]) -> bool:
    """Whether a step's or job's ``if:`` holds; like GitHub, ``success() &&`` is implied."""
    if text is None:
        return ctx.get("__status__", "success") == "success"
    if isinstance(text, bool):
        return text and ctx.get("__status__", "success") == "success"
    src = str(text).strip()
    src = single_expression(src) or src
    value = _truthy(evaluate(src, ctx))
    if not _STATUS_FUNCTIONS.search(src):
        value = value and ctx.get("__status__", "success") == "success"
    return value


def single_expression(text: str) -> str | None:
    """``expr`` when ``text`` is exactly one ``${{ expr }}``, else None."""
    m = EXPRESSION.fullmatch(text.strip())
    return m.group(1) if m and "}}" not in m.group(1) else None


def expressions(text: str) -> list[str]:
    return [m.group(1).strip() for m in EXPRESSION.finditer(text)]




RUNTIME = "__runtime:"  # how a value known only at run time renders: __runtime:steps.x.y__


class Placeholder(dict):
    """A value known only at run time (``steps.x.outputs.y``), rendered as ``RUNTIME + path``.

    ``needs.<job>.result`` is ``success``: the checks judge a job as if what it needs passed.
    """

    def __init__(self, path: str):
        super().__init__()
        self.path = path

    def get(self, key: Any, default: Any = None) -> Any:
        if key == "result" and self.path.startswith("needs."):
            return "success"
        return Placeholder(f"{self.path}.{key}")

    def __str__(self) -> str:
        return f"{RUNTIME}{self.path}__"
