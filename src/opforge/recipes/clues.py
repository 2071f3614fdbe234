"""What an op's error message says about the call it wants: the clues ``derive`` refines a
call with. Pure: text in, clues out.

The messages are torch's own and those of extensions' argument checks: ``expected scalar type
Long but found Float``, ``The size of tensor a (7) must match the size of tensor b (8) at
non-singleton dimension 1``, ``Expected 2D (unbatched) or 3D (batched) input``, ``Dimension
out of range (expected to be in range of [-1, 0], but got 1)``, ``index 8 is out of bounds
for dimension 0 with size 8``, and the condition of a failed ``TORCH_CHECK`` (``Expected
src.dim() == 2 to be true, but got false``) or ``TORCH_INTERNAL_ASSERT`` (``idx <= next_idx
INTERNAL ASSERT FAILED at ...``), which ``derive`` evaluates against the call.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# torch's names of dtypes, as the messages write them -> torch attribute names
DTYPE_WORDS = {
    "long": "int64", "int64": "int64", "longtensor": "int64", "int64_t": "int64",
    "int": "int32", "int32": "int32", "inttensor": "int32", "int32_t": "int32",
    "float": "float32", "float32": "float32", "floattensor": "float32",
    "double": "float64", "float64": "float64", "doubletensor": "float64",
    "half": "float16", "float16": "float16", "bfloat16": "bfloat16",
    "byte": "uint8", "uint8": "uint8", "bytetensor": "uint8", "uint8_t": "uint8",
    "bool": "bool", "booltensor": "bool", "char": "int8", "int8": "int8",
    "short": "int16", "int16": "int16",
    "integer": "int64", "integral": "int64", "index": "int64", "indices": "int64",
    "floating": "float32", "floating point": "float32",
}
RANDOM = "results differ between two calls"
NONFINITE = "returned non-finite values"  # the smoke fails a CPU run on them: read past memory?


@dataclass(frozen=True)
class Dtype:
    """An argument (``arg``, or any) wants dtype ``want`` and has ``found`` (either may be
    None: "not implemented for 'Float'" says only what is wrong)."""

    want: str | None = None
    found: str | None = None
    arg: str | None = None


@dataclass(frozen=True)
class Rank:
    ranks: tuple[int, ...]
    arg: str | None = None


@dataclass(frozen=True)
class SameDtype:
    """Two arguments that must have one dtype: "Weights must have the same scalar type as
    input" (names as the message has them; None where it names none)."""

    a: str | None = None
    b: str | None = None


@dataclass(frozen=True)
class SameRank:
    """Tensors that must have as many dimensions as each other."""


@dataclass(frozen=True)
class Sizes:
    """Two sizes that must agree (one of them is some argument's)."""

    a: int
    b: int


@dataclass(frozen=True)
class Condition:
    """A C++ condition the call broke: ``src.size(dim) == indptr.size(dim) - 1``."""

    text: str


@dataclass(frozen=True)
class DimRange:
    low: int
    high: int
    got: int


@dataclass(frozen=True)
class IndexRange:
    size: int | None = None


@dataclass(frozen=True)
class Unsorted:
    """Indices that must be sorted (or pointers monotone)."""


@dataclass(frozen=True)
class Random:
    """The op gave different results for the same arguments."""


@dataclass(frozen=True)
class Crash:
    """The call killed the interpreter or hung: ``SIGFPE`` (an integer division by a zero
    the inputs hold), ``SIGSEGV`` (an index past the end), ``hang``."""

    how: str


Clue = (Dtype | Rank | SameDtype | SameRank | Sizes | Condition | DimRange | IndexRange | Unsorted | Random
        | Crash)
CRASHED = "the call crashed the interpreter"   # worker.TrialWorker's words
HUNG = "the call did not return within"


def dtype_word(word: str | None) -> str | None:
    if word is None:
        return None
    word = word.strip().strip("'\"").lower().removeprefix("torch.").removeprefix("at::k")
    word = word.removeprefix("k") if word.startswith("k") and word[1:] in DTYPE_WORDS else word
    return DTYPE_WORDS.get(word)


def _strip(message: str) -> str:
    """The message without the exception's type and torch's boilerplate."""
    text = re.sub(r"^\s*\w*(?:Error|Exception)\s*:\s*", "", message.strip())
    text = text.split("  (Could this error message be improved?", 1)[0]
    return text.split("\nException raised from", 1)[0]


_DTYPE_PATTERNS = (
    # (pattern, group of want, group of found, group of arg)
    (r"expected scalar type (\w+) but found (\w+)", 1, 2, None),
    (r"expected (?:object of )?scalar type (\w+) but got scalar type (\w+)"
     r"(?: for (?:argument #\d+ )?'?(\w+)'?)?", 1, 2, 3),
    (r"expected tensor for argument #\d+ '(\w+)' to have (?:one of the following )?scalar "
     r"types?:? (\w+)[\w, ]*; but got (?:torch\.)?(\w+)", 2, 3, 1),
    (r"found dtype (\w+) but expected (\w+)", 2, 1, None),
    (r"result type (\w+) can't be cast to the desired output type (\w+)", 1, 2, None),
    (r"expected (\w+) and \w+ to have the same dtype, but got: (\w+) != (\w+)", 2, 3, None),
    (r"expected dtype (?:int32/|int32 or )?(int64|long|float|double)\b[^.]*? for (\w+)", 1,
     None, 2),
    (r"(\w+) (?:must|should) (?:be|have) (?:of |a |an )*(?:type |dtype |scalar type )?"
     r"(long|int64|int32|int|float|double|float32|float64|bool|byte|uint8|integer|integral"
     r"|floating point|floating)\b", 2, None, 1),
    (r"(long|int64|int32|float|double|float32|float64|bool|byte|uint8|integer|floating point)"
     r" tensors? (?:expected|required) for (\w+)", 1, None, 2),
)
_RANK_WORDS = {"scalar": 0, "vector": 1, "matrix": 2}


def read(message: str) -> list[Clue]:
    """Every clue the message holds, most specific first."""
    text = _strip(message)
    low = text.lower()
    clues: list[Clue] = []
    if RANDOM in low or NONFINITE in low:
        return [Random()]
    if text.startswith((CRASHED, HUNG)):
        m = re.search(r"killed by (SIG\w+)", text)
        return [Crash(m.group(1) if m else "hang" if text.startswith(HUNG) else "exit")]
    for pattern, want, found, arg in _DTYPE_PATTERNS:
        m = re.search(pattern, low)
        if m:
            w = dtype_word(m.group(want)) if want else None
            f = dtype_word(m.group(found)) if found and m.group(found) else None
            name = _original(text, m.group(arg)) if arg and m.group(arg) else None
            if w or f:
                clues.append(Dtype(w, f, name))
                break
    m = re.search(r"not implemented for '(\w+)'", text)
    if m and dtype_word(m.group(1)):
        clues.append(Dtype(None, dtype_word(m.group(1))))
    clues += _conditions(text)
    clues += _ranks(text, low)
    for pattern in (r"size of tensor a \((\d+)\) must match the size of tensor b \((\d+)\)",
                    r"expanded size of the tensor \((\d+)\) must match the existing size "
                    r"\((\d+)\)",
                    r"expected size (\d+) but got size (\d+)"):
        m = re.search(pattern, low)
        if m:
            clues.append(Sizes(int(m.group(1)), int(m.group(2))))
    m = re.search(r"shapes cannot be multiplied \((\d+)x(\d+) and (\d+)x(\d+)\)", low)
    if m:
        clues.append(Sizes(int(m.group(2)), int(m.group(3))))
    m = re.search(r"dimension out of range \(expected to be in range of \[(-?\d+), (-?\d+)\], "
                  r"but got (-?\d+)\)", low)
    if m:
        clues.append(DimRange(int(m.group(1)), int(m.group(2)), int(m.group(3))))
    m = re.search(r"index -?\d+ is out of bounds for dimension \d+ with size (\d+)", low)
    if m:
        clues.append(IndexRange(int(m.group(1))))
    elif re.search(r"\bind(?:ex|ices)\b.*\bout of (?:range|bounds)|out of (?:range|bounds)"
                   r".*\bind(?:ex|ices)\b", low):
        clues.append(IndexRange())
    if re.search(r"\bsorted\b|monoton|ascending|non-?decreasing|\bidx <= next_idx\b", low):
        clues.append(Unsorted())
    m = re.search(r"(\w+) (?:tensors? )?(?:must|should) (?:have|be of) the same (?:scalar type|"
                  r"dtype|data type|type) as (?:the )?(\w+)", text, flags=re.I)
    if m:
        clues.append(SameDtype(m.group(1), m.group(2)))
    elif re.search(r"(?:same|matching) (?:scalar type|dtype|data type)s?\b|dtypes? (?:must|"
                   r"should) (?:match|be the same)", low):
        clues.append(SameDtype())
    if "same number of dimensions" in low:
        clues.append(SameRank())
    return clues


def _original(text: str, lowered: str) -> str:
    """The spelling of a name as the message has it (the patterns match lowercased text)."""
    m = re.search(re.escape(lowered), text, flags=re.I)
    return m.group(0) if m else lowered


def _conditions(text: str) -> list[Clue]:
    """A failed check's condition, and the dtype it names (``x.scalar_type() == at::kLong``)."""
    found = []
    for pattern in (r"Expected (.+?) to be true, but got false",
                    r"^(.+?) INTERNAL ASSERT FAILED at",
                    r"Check failed: (.+?)(?:\.\s|$)"):
        m = re.search(pattern, text, flags=re.M)
        if m:
            found.append(m.group(1).strip())
    clues: list[Clue] = []
    for cond in found:
        for name, kind in re.findall(r"(\w+)\s*(?:\.|->)\s*(?:scalar_type|dtype)\s*\(\s*\)\s*"
                                     r"==\s*(?:\w+::)*k?(\w+)", cond):
            dtype = dtype_word(kind)
            if dtype:
                clues.append(Dtype(dtype, None, name))
        clues.append(Condition(cond))
    return clues


def _ranks(text: str, low: str) -> list[Clue]:
    clues: list[Clue] = []
    m = re.search(r"expected (\d)-?d(?: \(\w+\))?(?: or (\d)-?d)?(?: \([\w ]+\))?"
                  r"(?: (?:input|tensor))?", low)
    if m:
        ranks = tuple(int(g) for g in m.groups() if g)
        arg = re.search(r"(\w+) (?:to be|must be|should be)", text)
        clues.append(Rank(ranks, arg.group(1) if arg else None))
    m = re.search(r"(\d)-?d tensors? expected", low)
    if m:
        clues.append(Rank((int(m.group(1)),)))
    for m in re.finditer(r"(\w+)['\"]? (?:must|should|to) (?:be|have) (?:an? )?(?:(\d)-?d|"
                         r"(\d)-dimensional|(\d) dim(?:ension)?s?|(scalar|vector|matrix))\b",
                         text, flags=re.I):
        rank = next(int(g) for g in m.groups()[1:4] if g) if any(m.groups()[1:4]) else \
            _RANK_WORDS[m.group(5).lower()]
        clues.append(Rank((rank,), m.group(1)))
    for m in re.finditer(r"(\w+)\s*(?:\.|->)\s*(?:dim|ndimension)\s*\(\s*\)\s*==\s*(\d)", text):
        clues.append(Rank((int(m.group(2)),), m.group(1)))
    m = re.search(r"(?:^|\W)dim\(\) == (\d)|ndim == (\d)", low)
    if m and not clues:
        clues.append(Rank((int(m.group(1) or m.group(2)),)))
    return clues
