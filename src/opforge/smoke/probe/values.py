"""Values an op returned, moved between devices and compared with the CPU's: shared by the
smoke checks, the compiled modules' checks and bench."""

from __future__ import annotations


def to_device(t, value, device, dtype=None):
    """A tensor argument on ``device`` (floating ones in ``dtype`` when given); others as is."""
    if isinstance(value, t.Tensor):
        value = value.to(device)
        if dtype is not None and value.is_floating_point():
            value = value.to(dtype)
    return value


def outputs_of(out) -> list:
    """An op's result as a list of outputs (none, one, or a tuple's)."""
    if out is None:
        return []
    return list(out) if isinstance(out, (tuple, list)) else [out]


def compare(t, want, got, atol=1e-4, rtol=1e-3) -> str | None:
    """What differs between two lists of results (shapes, dtypes, values), or None."""
    if len(want) != len(got):
        return f"{len(got)} outputs, the CPU gave {len(want)}"
    for i, (w, g) in enumerate(zip(want, got)):
        if not isinstance(w, t.Tensor) or not isinstance(g, t.Tensor):
            if w != g:
                return f"output {i} is {g!r}, the CPU gave {w!r}"
            continue
        g = g.detach().cpu()
        w = w.detach().cpu()
        if w.shape != g.shape:
            return f"output {i} shape {tuple(g.shape)} != CPU {tuple(w.shape)}"
        if w.dtype != g.dtype:
            return f"output {i} dtype {g.dtype} != CPU {w.dtype}"
        if w.is_floating_point():
            if not t.allclose(w, g.to(w.dtype), atol=atol, rtol=rtol, equal_nan=True):
                return f"output {i} differs from CPU by {float((w - g).abs().max()):.3g}"
        elif not t.equal(w, g):
            return f"output {i} {g.tolist()} != CPU {w.tolist()}"
    return None
