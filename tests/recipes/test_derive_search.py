"""The derive search, pure: messages read as clues, names resolved the way the kernel spells
them, and searches against ops emulated with real torch (their checks written the way real
C++ kernels write theirs), bounded and deterministic."""

from __future__ import annotations

import pytest

from opforge.recipes import clues as C
from opforge.recipes.calls import Param, parse_params, render_call
from opforge.recipes.conditions import resolve
from opforge.recipes.derive import search

torch = pytest.importorskip("torch")


# --------------------------------------------------------------------------- clues

@pytest.mark.parametrize(("message", "clue"), [
    ("RuntimeError: Initials must be 1D", C.Rank((1,), "Initials")),
    ("RuntimeError: a must be 3-dimensional", C.Rank((3,), "a")),
    ("RuntimeError: expected scalar type Long but found Float", C.Dtype("int64", "float32")),
    ("RuntimeError: Weights must have the same scalar type as input",
     C.SameDtype("Weights", "input")),
    ("RuntimeError: Argument data types must match", None),
    ("RuntimeError: The size of tensor a (7) must match the size of tensor b (8) at "
     "non-singleton dimension 0", C.Sizes(7, 8)),
    ("IndexError: Dimension out of range (expected to be in range of [-1, 0], but got 1)",
     C.DimRange(-1, 0, 1)),
    ("results differ between two calls: output 0 differs from CPU by inf", C.Random()),
    ("returned non-finite values: 3 nan or inf", C.Random()),
    ("the call crashed the interpreter (killed by SIGFPE)", C.Crash("SIGFPE")),
    ("RuntimeError: Input must be floating point or complex", C.Dtype("float32", None, "Input")),
])
def test_a_message_gives_its_clue(message, clue):
    found = C.read(message)
    if clue is None:
        assert found == [], found
    else:
        assert clue in found, found


def test_a_dtypes_must_match_message_without_names_asks_for_one_dtype():
    assert C.SameDtype() in C.read("RuntimeError: dtypes must match")


def test_a_failed_check_gives_its_condition_and_rank():
    found = C.read("RuntimeError: Expected x.dim() == 1 to be true, but got false.")
    assert C.Condition("x.dim() == 1") in found
    assert C.Rank((1,), "x") in found


# --------------------------------------------------------------------------- names

LPC = [Param("a", "Tensor", cxx="x"), Param("b", "Tensor", cxx="a"),
       Param("c", "Tensor", cxx="zi")]


def test_the_kernels_names_go_before_the_schemas():
    # lpc(Tensor a, Tensor b, Tensor c) is lpc_cpu(x, a, zi): "a must be 3-dimensional" is b
    assert resolve("a", LPC) == 1
    assert resolve("x", LPC) == 0
    assert resolve("c", LPC) == 2      # no kernel name c: the schema's


def test_names_resolve_without_case_prefixes_or_a_plural():
    params = [Param("input", "Tensor"), Param("weights", "Tensor"),
              Param("initials", "Tensor")]
    assert resolve("Initials", params) == 2
    assert resolve("Input", params) == 0
    assert resolve("input_contiguous", params) == 0
    assert resolve("unrelated", params) is None
    assert resolve("__p1", params) == 1 and resolve("__p9", params) is None


# --------------------------------------------------------------------------- searches

def _attempt(kernel, params):
    """Run a call the way the trial process does: the rendered text evaluated with torch,
    twice, the results compared."""
    def attempt(call):
        make = eval(f"lambda dtype: [{', '.join(render_call(call))}]", {"torch": torch})  # noqa: S307
        try:
            outs = [kernel(*make(torch.float32)) for _ in range(2)]
        except (RuntimeError, IndexError, ValueError, TypeError) as exc:
            return f"{type(exc).__name__}: {exc}"
        if not torch.equal(outs[0], outs[1]):
            return "results differ between two calls: output 0 differs from CPU"
        return None
    return attempt


def _check(cond, message):
    if not cond:
        raise RuntimeError(message)


def lpc_cpu(x, a, zi):
    """The checks of a linear-prediction kernel, in its own words and names."""
    _check(x.is_floating_point(), "Input must be floating point or complex")
    _check(a.dtype == x.dtype, "Coefficients must have the same scalar type as input")
    _check(zi.dtype == x.dtype, "Initial conditions must have the same scalar type as input")
    _check(x.dim() == 2, "Input must be 2D")
    _check(zi.dim() == 2, "Initial conditions must be 2D")
    _check(x.size(0) == zi.size(0), "Batch size of input and initial conditions must match")
    _check(a.dim() == 3, "a must be 3-dimensional")
    _check(a.size(0) == x.size(0), "Batch size of out and x must match")
    return torch.cat([zi, x], 1) * a.sum()


def scan_cpu(input, weights, initials):
    _check(input.is_floating_point(), "Input must be floating point or complex")
    _check(initials.dtype == input.dtype, "Initials must have the same scalar type as input")
    _check(weights.dtype == input.dtype, "Weights must have the same scalar type as input")
    _check(input.dim() == 2, "Input must be 2D")
    _check(initials.dim() == 1, "Initials must be 1D")
    _check(weights.shape == input.shape, "Weights must have the same size as input")
    _check(initials.size(0) == input.size(0), "The first dimension of initials must be the "
           "same as the first dimension of input")
    return input * weights + initials[:, None]


_GARBAGE = iter(range(10**6))


def cumsum_left(x, gamma):
    """Lets a size-1 gamma through its checks but reads gamma[i] for every row: memory it
    was not given, a different result on every call."""
    _check(x.dim() == 2, "Input must be 2-dimensional")
    _check(gamma.dim() == 1, "Gamma must be 1-dimensional")
    _check(gamma.size(0) == 1 or gamma.size(0) == x.size(0),
           "Gamma dimensions must be compatible with the input")
    _check(x.dtype == gamma.dtype, "Argument data types must match")
    if gamma.size(0) == 1:
        return x + next(_GARBAGE)
    return x.cumsum(1) * gamma[:, None]


@pytest.mark.parametrize(("kernel", "schema", "cxx"), [
    (lpc_cpu, "lpc(Tensor a, Tensor b, Tensor c) -> Tensor", ("x", "a", "zi")),
    (scan_cpu, "scan(Tensor a, Tensor b, Tensor c) -> Tensor",
     ("input", "weights", "initials")),
])
def test_the_kernels_messages_lead_to_a_call_that_runs(kernel, schema, cxx):
    params = [p.__class__(**{**p.__dict__, "cxx": n})
              for p, n in zip(parse_params(schema), cxx)]
    s = search(params, _attempt(kernel, params))
    assert s.found is not None, [t.error for t in s.tries]
    assert len(s.tries) <= 12, [t.error for t in s.tries]
    assert _attempt(kernel, params)(s.found) is None


def test_without_the_kernels_names_the_search_is_longer_or_fails():
    """What the names buy: the same op with only the schema's a, b, c."""
    named = [p.__class__(**{**p.__dict__, "cxx": n}) for p, n in
             zip(parse_params("lpc(Tensor a, Tensor b, Tensor c) -> Tensor"), ("x", "a", "zi"))]
    bare = parse_params("lpc(Tensor a, Tensor b, Tensor c) -> Tensor")
    with_names = search(named, _attempt(lpc_cpu, named))
    without = search(bare, _attempt(lpc_cpu, bare))
    assert with_names.found is not None
    assert without.found is None or len(without.tries) > len(with_names.tries)


def test_results_that_differ_grow_a_size_1_argument():
    params = parse_params("f(Tensor x, Tensor gamma)")
    s = search(params, _attempt(cumsum_left, params),
               hints={"x": {"rank": 2}, "gamma": {"rank": 1, "sizes": {0: 1}}})
    assert s.found is not None, [t.error for t in s.tries]
    assert s.found[1].shape == (8,)


def test_a_search_is_bounded_and_deterministic():
    params = parse_params("f(Tensor x, int k, Tensor y)")
    calls = []

    def never(call):
        calls.append(call)
        return "RuntimeError: x must be 2D and something the search cannot satisfy"
    first = search(params, never, limit=5)
    assert first.found is None and len(first.tries) == 5 == len(calls)
    calls.clear()
    whole = search(params, never)            # the default limit, or the space runs out
    assert whole.found is None and 5 < len(whole.tries) <= 40
    assert len(set(calls)) == len(calls)     # each call tried once
    again = search(params, never)
    assert [t.call for t in again.tries] == [t.call for t in whole.tries]


def weighting(x, weight, basis, weight_index):
    """Reads weight_index as basis's E x S without checking it: a short one is a segfault
    (reported as the trial process reports it), not a message."""
    if weight.dim() < 3 or x.dim() < 2 or basis.dim() < 2:
        raise IndexError("Dimension out of range (expected to be in range of [-2, 1], but "
                         "got 2)")
    if weight_index.dtype != torch.long:
        raise RuntimeError(f"expected scalar type Long but found {weight_index.dtype}")
    if weight_index.numel() < basis.numel() or int(weight_index.max()) >= weight.size(0):
        return "CRASH"
    return (x.sum() * weight.sum() * basis.sum()).reshape(1)


def test_a_segfault_gives_an_index_tensor_its_peers_shape():
    params = parse_params("w(Tensor x, Tensor weight, Tensor basis, Tensor weight_index)")
    run = _attempt(weighting, params)

    def attempt(call):
        error = run(call)
        return "the call crashed the interpreter (killed by SIGSEGV)" if error and \
            "CRASH" in error else error

    def kernel(*args):
        out = weighting(*args)
        if isinstance(out, str):
            raise RuntimeError("CRASH")
        return out
    run = _attempt(kernel, params)
    s = search(params, attempt, hints={"x": {"min_rank": 2}, "weight": {"min_rank": 3},
                                       "basis": {"min_rank": 2},
                                       "weight_index": {"dtype": "int64"}})
    assert s.found is not None, [t.error for t in s.tries]
    assert s.found[3].shape == s.found[2].shape
    assert "SIGSEGV" in s.tries[0].error


# --------------------------------------------------------------------------- the trial


_LIB = torch.library.Library("opforge_trialtest", "DEF")
_LIB.define("logs(Tensor x) -> Tensor")
_LIB.impl("logs", lambda x: x.log(), "CPU")  # nan for a negative entry, -inf for a zero


@pytest.mark.parametrize(("inputs", "ok"), [
    ("lambda dtype: [torch.linspace(0.1, 1, 8, dtype=dtype)]", True),
    ("lambda dtype: [torch.linspace(-1, 1, 8, dtype=dtype)]", False),
])
def test_a_trial_call_with_non_finite_output_is_not_a_working_call(inputs, ok):
    """The smoke fails a CPU run whose output is nan or inf: derive must not write that call."""
    from opforge.recipes.target.trial import NONFINITE, Trial

    answer = Trial(torch, "opforge_trialtest").call({"call": "logs", "inputs": inputs})
    assert answer["ok"] is ok, answer
    if not ok:
        assert answer["error"].startswith(NONFINITE) and answer["stage"] == "repeat"
        assert C.read(answer["error"]) == [C.Random()]
