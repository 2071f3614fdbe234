"""The kernel's own words, read against a call: a name in a message or a C++ condition
resolved to a parameter (the kernel's spelling first, then the schema's, or ``__pN`` by
position), a failed condition (``x.dim() == 2 && idx.size(0) == x.size(0)``) evaluated
against the call, and the calls one or two changes away that make it true."""

from __future__ import annotations

import itertools
import re

from opforge.recipes.calls import (
    SIZE,
    Call,
    Literal,
    Param,
    TensorValue,
    tensor_positions,
    with_arg,
    with_rank,
    with_size,
)

_TERM = re.compile(r"(\w+)\s*(?:\.|->)\s*(dim|ndimension|numel|size|sizes)\s*\(\s*([^()]*?)\s*\)"
                   r"(?:\s*\[\s*([^\]]*?)\s*\])?")


_POSITION = re.compile(r"__p(\d+)")   # a parameter by position (the condition solver's)


_PREFIX = re.compile(r"^(?:optional_|opt_|input_|in_)")
_SUFFIX = re.compile(r"(?:_t|_|_opt|_data|_tensor|_contiguous)$")


def _spellings(name: str) -> set[str]:
    """A name lowercased, without a prefix/suffix, without a plural ``s``."""
    low = name.lower()
    out = {low, _SUFFIX.sub("", low), _PREFIX.sub("", low), _PREFIX.sub("", _SUFFIX.sub("", low))}
    out |= {w[:-1] for w in out if len(w) > 3 and w.endswith("s")}
    return {w for w in out if w}


def resolve(name: str | None, params: list[Param]) -> int | None:
    """The parameter a C++ or message name means. The kernel's own names go first (its
    checks and messages use them, and they may reuse a schema name at another position:
    ``lpc(Tensor a, ...)`` implemented by ``lpc_cpu(x, a, zi)``), then the schema's; each
    exactly, then without case, a prefix/suffix or a plural ``s`` ("Initials")."""
    if not name:
        return None
    m = _POSITION.fullmatch(name)
    if m:
        i = int(m.group(1))
        return i if i < len(params) else None
    spellings = ([p.cxx for p in params], [p.name for p in params])
    for names in spellings:
        if name in names:
            return names.index(name)
    wanted = _spellings(name)
    for names in spellings:
        for i, p in enumerate(names):
            if p and _spellings(p) & wanted:
                return i
    return None


# --------------------------------------------------------------------------- conditions

def _term_value(m: re.Match, params: list[Param], call: Call, env: dict[str, int]) -> int:
    i = resolve(m.group(1), params)
    if i is None or not isinstance(call[i], TensorValue):
        raise LookupError(m.group(1))
    value: TensorValue = call[i]
    attr = m.group(2)
    if attr in ("dim", "ndimension"):
        return value.rank
    if attr == "numel":
        return value.numel
    index = m.group(4) if attr == "sizes" else m.group(3)
    d = _number(index, params, call, env)
    if not -value.rank <= d < value.rank:
        raise LookupError(index)
    return value.shape[d]


def _number(text: str | None, params: list[Param], call: Call, env: dict[str, int]) -> int:
    text = (text or "").strip()
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    m = re.fullmatch(r"(\w+)\s*([+-])\s*(\d+)", text)
    if m:
        base = _number(m.group(1), params, call, env)
        return base + int(m.group(3)) * (1 if m.group(2) == "+" else -1)
    if text in env:
        return env[text]
    i = resolve(text, params)
    if i is not None and isinstance(call[i], Literal) and re.fullmatch(r"-?\d+", call[i].text):
        return int(call[i].text)
    raise LookupError(text)


def _variables(cond: str, params: list[Param]) -> list[str]:
    """The loop variables a condition indexes sizes with (``src.size(i)``): not parameters."""
    found = []
    for m in _TERM.finditer(cond):
        index = (m.group(4) if m.group(2) == "sizes" else m.group(3)) or ""
        for word in re.findall(r"[A-Za-z_]\w*", index):
            if resolve(word, params) is None and word not in found:
                found.append(word)
    return found[:2]


def evaluate(cond: str, params: list[Param], call: Call) -> bool | None:
    """Whether ``call`` meets a C++ condition: True, False, or None (it cannot tell).

    A loop variable (``src.size(i) == index.size(i)``) takes every dimension; the condition
    must hold wherever its sizes exist."""
    if not _TERM.search(cond):
        return None
    variables = _variables(cond, params)
    results = []
    for values in itertools.product(range(5), repeat=len(variables)):
        env = dict(zip(variables, values))
        try:
            text = _TERM.sub(lambda m, env=env: str(_term_value(m, params, call, env)), cond)
        except LookupError:
            continue
        text = text.replace("&&", " and ").replace("||", " or ")
        text = re.sub(r"!(?!=)", " not ", text)
        text = re.sub(r"\b(?!and\b|or\b|not\b)[A-Za-z_]\w*",
                      lambda m, env=env: _lookup(m.group(0), params, call, env), text)
        if not re.fullmatch(r"[\d\s+\-*/%()<>=!andort]*", text) or "**" in text:
            return None
        try:
            results.append(bool(eval(text, {"__builtins__": {}}, {})))  # noqa: S307 - digits and operators only
        except (SyntaxError, ZeroDivisionError, TypeError, ValueError):
            return None
    if not results:
        return None
    return all(results)


def _lookup(word: str, params: list[Param], call: Call, env: dict[str, int]) -> str:
    if word in ("true", "false"):
        return "1" if word == "true" else "0"
    try:
        return str(_number(word, params, call, env))
    except LookupError:
        return "x"  # an unknown name: the text no longer evaluates


def condition_fixes(cond: str, params: list[Param], call: Call) -> list[Call]:
    """Calls that meet the condition, one change (else two) away, smallest changes first.
    A tensor the condition names by a C++ name that is no parameter's (the kernel's own
    ``indptr`` for the schema's ``ptr``) is read as each unnamed tensor parameter in turn."""
    names = list(dict.fromkeys(m.group(1) for m in _TERM.finditer(cond)))
    unknown = [n for n in names if resolve(n, params) is None][:2]
    if not unknown:
        return _solve(cond, params, call)
    named = {resolve(n, params) for n in names} - {None}
    free = [i for i in tensor_positions(call) if i not in named]
    out: list[Call] = []
    for chosen in itertools.permutations(free, len(unknown)):
        text = cond
        for old, new in zip(unknown, chosen):
            text = re.sub(rf"\b{re.escape(old)}\b", f"__p{new}", text)
        out += [c for c in _solve(text, params, call) if c not in out]
    return out[:8]


def _solve(cond: str, params: list[Param], call: Call) -> list[Call]:
    if evaluate(cond, params, call) is not False:
        return []
    moves = []
    referenced = {resolve(m.group(1), params) for m in _TERM.finditer(cond)} - {None}
    pool = {1, 2, SIZE - 1, SIZE, SIZE + 1}
    for i in sorted(referenced):
        value = call[i]
        if isinstance(value, TensorValue):
            pool.update(value.shape)
            pool.update(s + 1 for s in value.shape)
            pool.update(s - 1 for s in value.shape if s > 1)
    for i in sorted(referenced):
        value = call[i]
        if not isinstance(value, TensorValue):
            continue
        for rank in range(1, 5):
            if rank != value.rank:
                moves.append((abs(rank - value.rank), i, with_rank(value, rank)))
        for d in range(value.rank):
            for size in sorted(pool):
                if size != value.shape[d]:
                    moves.append((1, i, with_size(value, d, size)))
    for p_index, p in enumerate(params):
        if p.kind == "int" and any(n and re.search(rf"\b{re.escape(n)}\b", cond)
                                   for n in (p.name, p.cxx, f"__p{p_index}")):
            for text in ("0", "1", "-1", "2", str(SIZE)):
                if call[p_index] != Literal(text):
                    moves.append((1, p_index, Literal(text)))
    singles = []
    for _cost, i, value in sorted(moves, key=lambda m: (m[0], m[1])):
        new = with_arg(call, i, value)
        if new is not None and evaluate(cond, params, new):
            singles.append(new)
    if singles:
        return singles[:6]
    pairs = []
    for (_c1, i1, v1), (_c2, i2, v2) in itertools.combinations(moves[:60], 2):
        if i1 == i2:
            continue
        new = with_arg(with_arg(call, i1, v1), i2, v2)
        if new is not None and evaluate(cond, params, new):
            pairs.append(new)
            if len(pairs) >= 4:
                break
    return pairs

