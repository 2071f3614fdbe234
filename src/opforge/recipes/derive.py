"""Find a call of an op that runs: candidates from the schema, refined by the op's own error
messages. Pure: no I/O; the caller runs each call (``opforge.recipes.app``) and tells the
search what happened.

``Search`` starts from ``calls.first_call`` and keeps a queue of untried calls. Each failure
is read for clues (``clues.read``); every clue gives targeted fixes (the dtype the message
asks for, the rank, sizes made to agree, ``dim`` moved into range, a failed C++ condition
made true by evaluating it against the call). A failure whose message differs from its
parent's made progress: its fixes and a small space of plain variations (each tensor's dtype
and rank, each scalar's value) are tried before anything older, so the search follows the
messages deeper; a fix that changed nothing waits behind its siblings. It is deterministic
and bounded: at most ``limit`` tries, each call tried once.
"""

from __future__ import annotations

import heapq
import itertools
import re
from dataclasses import dataclass, replace

from opforge.recipes import clues as C
from opforge.recipes.calls import (
    HIGH,
    SIZE,
    Call,
    Literal,
    Param,
    TensorValue,
    first_call,
    name_class,
    prior_tensor,
    with_dtype,
    with_rank,
    with_size,
)

MAX_TRIES = 40
_TERM = re.compile(r"(\w+)\s*(?:\.|->)\s*(dim|ndimension|numel|size|sizes)\s*\(\s*([^()]*?)\s*\)"
                   r"(?:\s*\[\s*([^\]]*?)\s*\])?")
_RANDOM_NAMES = re.compile(r"random|shuffle|train|stochastic|sample|drop", re.I)


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


def _condition_fixes(cond: str, params: list[Param], call: Call) -> list[Call]:
    """Calls that meet the condition, one change (else two) away, smallest changes first.
    A tensor the condition names by a C++ name that is no parameter's (the kernel's own
    ``indptr`` for the schema's ``ptr``) is read as each unnamed tensor parameter in turn."""
    names = list(dict.fromkeys(m.group(1) for m in _TERM.finditer(cond)))
    unknown = [n for n in names if resolve(n, params) is None][:2]
    if not unknown:
        return _solve(cond, params, call)
    named = {resolve(n, params) for n in names} - {None}
    free = [i for i in _tensors(call) if i not in named]
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
        new = _set(call, i, value)
        if new is not None and evaluate(cond, params, new):
            singles.append(new)
    if singles:
        return singles[:6]
    pairs = []
    for (_c1, i1, v1), (_c2, i2, v2) in itertools.combinations(moves[:60], 2):
        if i1 == i2:
            continue
        new = _set(_set(call, i1, v1), i2, v2)
        if new is not None and evaluate(cond, params, new):
            pairs.append(new)
            if len(pairs) >= 4:
                break
    return pairs


def _set(call: Call | None, i: int, value) -> Call | None:
    if call is None or value is None:
        return None
    return call[:i] + (value,) + call[i + 1:]


# --------------------------------------------------------------------------- fixes

def _tensors(call: Call) -> list[int]:
    return [i for i, v in enumerate(call) if isinstance(v, TensorValue)]


def _named_first(indices: list[int], params: list[Param], integral: bool) -> list[int]:
    """Index-like names first when an integer tensor is wanted, the others first otherwise."""
    def order(i: int) -> tuple[int, int]:
        like = name_class(params[i].name) in ("index", "ptr")
        return (0 if like == integral else 1, i)
    return sorted(indices, key=order)


def _dtype_fixes(clue: C.Dtype, params: list[Param], call: Call) -> list[Call]:
    def dtype_of(v: TensorValue) -> str:
        return "float32" if v.dtype == "dtype" else v.dtype

    named = resolve(clue.arg, params)
    targets = [named] if named is not None and isinstance(call[named], TensorValue) else \
        [i for i in _tensors(call) if clue.found is None or dtype_of(call[i]) == clue.found]
    if clue.want is not None:
        targets = [i for i in targets if dtype_of(call[i]) != clue.want]
        wants = [clue.want]
    elif clue.found in ("float32", "float64", "float16", "bfloat16"):
        wants = ["int64", "float64"]
    else:
        wants = ["float32", "int32"]
    out = []
    for want in wants:
        integral = not want.startswith(("float", "bfloat"))
        ordered = _named_first(targets, params, integral)
        for i in ordered:
            out.append(_set(call, i, with_dtype(call[i], want)))
        if len(ordered) > 1:
            every = call
            for i in ordered:
                every = _set(every, i, with_dtype(every[i], want))
            out.append(every)
    return out


def _rank_fixes(clue: C.Rank, params: list[Param], call: Call) -> list[Call]:
    named = resolve(clue.arg, params)
    targets = [named] if named is not None and isinstance(call[named], TensorValue) else \
        _tensors(call)
    return [_set(call, i, with_rank(call[i], rank)) for rank in clue.ranks for i in targets
            if call[i].rank != rank]


def _same_rank_fixes(params: list[Param], call: Call) -> list[Call]:
    tensors = _tensors(call)
    if not tensors:
        return []
    top = max(call[i].rank for i in tensors)
    out, every = [], call
    for i in tensors:
        if call[i].rank != top:
            out.append(_set(call, i, with_rank(call[i], top)))
            every = _set(every, i, with_rank(every[i], top))
    return out + ([every] if len(out) > 1 else [])


def _size_fixes(clue: C.Sizes, call: Call) -> list[Call]:
    out = []
    for have, want in ((clue.a, clue.b), (clue.b, clue.a)):
        for i in _tensors(call):
            for d, size in enumerate(call[i].shape):
                if size == have:
                    out.append(_set(call, i, with_size(call[i], d, want)))
        for i, v in enumerate(call):
            if isinstance(v, Literal) and v.text == str(have):
                out.append(_set(call, i, Literal(str(want))))
    return out


def _dim_fixes(clue: C.DimRange, params: list[Param], call: Call) -> list[Call]:
    out = []
    ints = [i for i, v in enumerate(call) if isinstance(v, Literal) and v.text == str(clue.got)]
    ints.sort(key=lambda i: (name_class(params[i].name) != "dim", i))
    for i in ints:
        for value in dict.fromkeys((clue.high, clue.low, 0)):
            out.append(_set(call, i, Literal(str(value))))
    for i in _tensors(call):
        if call[i].rank == clue.high + 1 and clue.got >= 0:
            out.append(_set(call, i, with_rank(call[i], clue.got + 1)))
    return out


def _index_fixes(clue: C.IndexRange, call: Call) -> list[Call]:
    out, every = [], call
    for i in _tensors(call):
        v = call[i]
        if v.fill in ("index", "range", "const") and not v.floating:
            high = min(v.high, clue.size) if clue.size else 1
            high = 1 if high >= v.high else max(1, high)
            new = replace(v, fill="index", high=high) if v.fill == "range" else \
                replace(v, high=high)
            out.append(_set(call, i, new))
            every = _set(every, i, new)
    return ([every] if len(out) > 1 else []) + out


def _same_dtype_fixes(clue: C.SameDtype, params: list[Param], call: Call) -> list[Call]:
    """One side given the other's dtype, the named one first; unnamed: every tensor given
    the first tensor's dtype."""
    a, b = resolve(clue.a, params), resolve(clue.b, params)
    pairs = [(a, b), (b, a)] if a is not None and b is not None else []
    if not pairs:
        tensors = _tensors(call)
        pairs = [(i, tensors[0]) for i in tensors[1:]]
    out = []
    for i, j in pairs:
        if isinstance(call[i], TensorValue) and isinstance(call[j], TensorValue) and \
                call[i].dtype != call[j].dtype:
            out.append(_set(call, i, with_dtype(call[i], call[j].dtype)))
    return out


def _sorted_fixes(call: Call) -> list[Call]:
    return [_set(call, i, replace(call[i], fill="index", high=min(call[i].high, HIGH)))
            for i in _tensors(call) if call[i].fill in ("range", "const")
            and not call[i].floating]


def _crash_fixes(clue: C.Crash, call: Call) -> list[Call]:
    """A division by zero: integer tensors without zeros (all ``HIGH``); an index past the
    end of something: smaller indices too."""
    out, every = [], call
    for i in _tensors(call):
        v = call[i]
        if not v.floating and v.fill in ("index", "range", "ptr", "bool"):
            new = replace(v, fill="const", high=HIGH)
            out.append(_set(call, i, new))
            every = _set(every, i, new)
    out = ([every] if len(out) > 1 else []) + out
    if clue.how != "SIGFPE":
        out = _index_fixes(C.IndexRange(), call) + out + _peer_shapes(call)
    return out


def _peer_shapes(call: Call) -> list[Call]:
    """A tensor the kernel read past the end of: an integer tensor given the shape of a
    larger one (``weight_index`` read as ``basis``'s E x S)."""
    out = []
    tensors = _tensors(call)
    for i in tensors:
        if call[i].floating:
            continue
        for j in tensors:
            if j != i and call[j].numel > call[i].numel:
                out.append(_set(call, i, replace(call[i], shape=call[j].shape)))
    return out


def _random_fixes(params: list[Param], call: Call) -> list[Call]:
    """A flag that asks for randomness turned off; else the op read memory it was not given
    (results that differ between two identical calls): a dimension of size 1 that its
    checks let through but its loop reads in full (``gamma.size(0) == 1 || ==
    x.size(0)``) made full size, or indices made smaller."""
    out: list[Call | None] = []
    for i, p in enumerate(params):
        if p.kind == "bool" and _RANDOM_NAMES.search(p.name):
            flipped = "False" if call[i] == Literal("True") else "True"
            out.append(_set(call, i, Literal(flipped)))
    for i in _tensors(call):
        for d, size in enumerate(call[i].shape):
            if size == 1:
                out.append(_set(call, i, with_size(call[i], d, SIZE)))
    out += _index_fixes(C.IndexRange(), call)
    return [c for c in out if c is not None]


def fixes(params: list[Param], call: Call, found: list[C.Clue]) -> list[Call]:
    """The calls each clue of a failure suggests, in the clues' order."""
    out: list[Call | None] = []
    for clue in found:
        if isinstance(clue, C.Dtype):
            out += _dtype_fixes(clue, params, call)
        elif isinstance(clue, C.Rank):
            out += _rank_fixes(clue, params, call)
        elif isinstance(clue, C.SameDtype):
            out += _same_dtype_fixes(clue, params, call)
        elif isinstance(clue, C.SameRank):
            out += _same_rank_fixes(params, call)
        elif isinstance(clue, C.Sizes):
            out += _size_fixes(clue, call)
        elif isinstance(clue, C.Condition):
            out += _condition_fixes(clue.text, params, call)
        elif isinstance(clue, C.DimRange):
            out += _dim_fixes(clue, params, call)
        elif isinstance(clue, C.IndexRange):
            out += _index_fixes(clue, call)
        elif isinstance(clue, C.Unsorted):
            out += _sorted_fixes(call)
        elif isinstance(clue, C.Random):
            out += _random_fixes(params, call)
        elif isinstance(clue, C.Crash):
            out += _crash_fixes(clue, call)
    return [c for c in out if c is not None]


def variations(params: list[Param], call: Call, hints: dict | None = None) -> list[Call]:
    """The plain space around a call, one change each: tensors' dtype and rank, an absent
    optional tensor given, scalars' values."""
    hints = hints or {}
    out: list[Call | None] = []
    for i in _tensors(call):
        v = call[i]
        out.append(_set(call, i, with_dtype(v, "int64" if v.floating else "float32")))
    for i in _tensors(call):
        for rank in (1, 2, 3):
            if rank != call[i].rank:
                out.append(_set(call, i, with_rank(call[i], rank)))
    for i, (p, v) in enumerate(zip(params, call)):
        if p.tensor and v == Literal("None"):
            out.append(_set(call, i, prior_tensor(p.name, hints.get(p.name))))
    for i, (p, v) in enumerate(zip(params, call)):
        if not isinstance(v, Literal):
            continue
        if p.kind == "int":
            choices = ("0", "-1", "1") if name_class(p.name) == "dim" else ("0", "2", str(SIZE))
        elif p.kind == "bool":
            choices = ("True", "False")
        elif p.kind == "float":
            choices = ("1.0", "2.0")
        elif p.kind == "str":
            choices = ('"sum"', '"mean"', '"max"')
        else:
            choices = ()
        out += [_set(call, i, Literal(c)) for c in choices if Literal(c) != v]
    for i in _tensors(call):
        if call[i].floating and call[i].dtype != "float64":
            out.append(_set(call, i, with_dtype(call[i], "float64")))
    return [c for c in out if c is not None]


# --------------------------------------------------------------------------- the search

def error_key(error: str) -> str:
    """A failure's message without what differs between runs of the same check (file:line)."""
    text = error.strip().splitlines()[0] if error.strip() else ""
    return re.sub(r'at "?[^"\s]+"?:\d+', "", text)[:300]


@dataclass
class _Node:
    call: Call
    level: int
    parent_key: str | None


@dataclass
class Try:
    call: Call
    error: str | None     # None: it ran
    level: int


class Search:
    """``next()`` the call to try, ``tell(error)`` what it did (None: it ran), until ``next``
    returns None: ``found`` is then the working call, or None."""

    def __init__(self, params: list[Param], hints: dict | None = None, limit: int = MAX_TRIES,
                 start: Call | None = None):
        self.params, self.hints, self.limit = params, hints or {}, limit
        self._heap: list[tuple[tuple[int, int, int], _Node]] = []
        self._seen: set[Call] = set()
        self._seq = itertools.count()
        self._current: _Node | None = None
        self.tries: list[Try] = []
        self.found: Call | None = None
        self._push(start if start is not None else first_call(params, self.hints), 0, None, 0)

    def _push(self, call: Call, level: int, parent_key: str | None, kind: int) -> None:
        if call in self._seen:
            return
        self._seen.add(call)
        heapq.heappush(self._heap, ((-level, kind, next(self._seq)),
                                    _Node(call, level, parent_key)))

    def next(self) -> Call | None:
        if self.found is not None or len(self.tries) >= self.limit or not self._heap:
            return None
        _, self._current = heapq.heappop(self._heap)
        return self._current.call

    def tell(self, error: str | None) -> None:
        node = self._current
        if node is None:
            raise RuntimeError("tell() without next()")
        self._current = None
        self.tries.append(Try(node.call, error, node.level))
        if error is None:
            self.found = node.call
            return
        key = error_key(error)
        found = C.read(error)
        # a crash got past the op's checks (its values are what is wrong): its fixes go
        # first, but the plain variations around it would undo what got it there
        crashed = any(isinstance(c, C.Crash) for c in found)
        progress = key != node.parent_key
        level = node.level + (1 if progress or crashed else 0)
        for call in fixes(self.params, node.call, found):
            self._push(call, level, key, 0)
        if progress:
            # after a crash the plain variations come last: they may undo what got it there
            for call in variations(self.params, node.call, self.hints):
                self._push(call, level, key, 2 if crashed else 1)

    @property
    def best(self) -> Try | None:
        """The failed try that got furthest (the latest of the deepest), for the report."""
        failed = [(t.level, i, t) for i, t in enumerate(self.tries) if t.error is not None]
        return max(failed, key=lambda x: (x[0], x[1]))[2] if failed else None


def search(params: list[Param], attempt, hints: dict | None = None,
           limit: int = MAX_TRIES) -> Search:
    """Run a whole search with ``attempt(call) -> error or None`` (tests; the app steps it)."""
    s = Search(params, hints, limit)
    while (call := s.next()) is not None:
        s.tell(attempt(call))
    return s
