"""Dispatch-key kernels registered from Python where the compiled library has none.

A legacy build registers Autocast (csrc/autocast), the Autograd kernels (csrc/autograd) and the
QuantizedCPU kernels of nms and roi_align (csrc/quantized) in C++. The LibTorch stable ABI has
no C++ API for the first two and no quantized tensors, so a stable-ABI build leaves them to
this module, which follows the same rules: each function registers only what the library did
not, so the two builds end up with the same dispatch table.
"""

import warnings

import torch

_LIB = torch.library.Library("opforge", "IMPL")  # registrations live as long as this object
_AUTOCAST_KEYS = {"cpu": ("CPU", "AutocastCPU"), "cuda": ("CUDA", "AutocastCUDA"),
                  "mps": ("MPS", "AutocastMPS")}


def has_kernel(name: str, key: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(f"opforge::{name}", key)


def _to_float(value, device_type: str):
    # at::autocast::cached_cast's rule: floating tensors on the autocast device, except float64
    if (isinstance(value, torch.Tensor) and value.is_floating_point()
            and value.dtype != torch.float64 and value.device.type == device_type):
        return value.float()
    return value


def register_autocast(name: str) -> None:
    """Autocast for every backend the library has: the op runs in float32 with the autocast key
    excluded, and its floating outputs return in the first argument's dtype (index outputs
    such as nms's keep, roi_pool's argmax and channel_mapping are left alone)."""
    op = getattr(torch.ops.opforge, name).default
    for device_type, (backend, key) in _AUTOCAST_KEYS.items():
        if not has_kernel(name, backend) or has_kernel(name, key):
            continue
        excluded = torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, key))

        def autocast(*args, _device=device_type, _excluded=excluded):
            with torch._C._ExcludeDispatchKeyGuard(_excluded):
                result = op(*(_to_float(a, _device) for a in args))
            dtype = args[0].dtype

            def back(t):
                return t.to(dtype) if t.is_floating_point() else t

            return tuple(map(back, result)) if isinstance(result, tuple) else back(result)

        _LIB.impl(name, autocast, key)


# op name -> (backward, setup_context): every op's Python gradient formula, registered or not
# (the tests run a stable build's formulas on a legacy library too).
AUTOGRAD_FORMULAS: dict = {}


def register_autograd(name: str, backward, setup_context) -> None:
    """The op's gradient formula (torch.library.register_autograd) where the library has no
    Autograd kernel: a stable-ABI build, or a legacy one whose csrc/autograd kernel for the op
    was left out. A C++ kernel does the same without Python in every call."""
    AUTOGRAD_FORMULAS[name] = (backward, setup_context)
    if has_kernel(name, "Autograd"):
        return
    torch.library.register_autograd(f"opforge::{name}", backward, setup_context=setup_context)
    PYTHON_AUTOGRAD.add(name)


# Ops whose Autograd kernel is Python (register_autograd above): every call crosses into Python
# and back, even one that records nothing (~15 us on a small roi_align).
PYTHON_AUTOGRAD: set[str] = set()


def below_python_autograd(name: str, *tensors) -> bool:
    """True where a wrapper may call op `name` below autograd: its Autograd kernel is Python,
    the call is eager (no tracing, compiling or functorch transform) and none of `tensors`
    needs a graph. That is what the Python kernel does itself in that case (torch.library's
    no-grad path), without the round trip."""
    if name not in PYTHON_AUTOGRAD:
        return False
    if torch.jit.is_tracing() or torch.compiler.is_compiling() \
            or torch._C._are_functorch_transforms_active():
        return False
    if torch.is_grad_enabled():
        for t in tensors:
            if t.requires_grad:
                return False
    return True


def forbid_double_backward(backward_op: str, forward_name: str) -> None:
    """Backward ops are differentiable once: asking for their gradient is a clear error (the
    words of csrc/autograd/first_order.h, which registers it in C++ where the library can)."""
    if has_kernel(backward_op, "Autograd"):
        return

    def backward(ctx, *grads):
        raise RuntimeError(
            f"opforge: {forward_name} supports first-order gradients only; double backward "
            f"(differentiating opforge::{backward_op}) is not implemented"
        )

    torch.library.register_autograd(f"opforge::{backward_op}", backward)


def register_not_differentiable(name: str) -> None:
    """An Autograd kernel for an op whose outputs carry no gradient (nms's int64 indices): a
    fallthrough to the backend, as csrc/autograd's kernel does, with no Python in the call."""
    if has_kernel(name, "Autograd") or has_kernel(name, "AutogradCPU"):
        return
    _LIB.impl(name, torch.library.fallthrough_kernel, "Autograd")


def register_quantized_cpu(name: str, kernel) -> None:
    """A QuantizedCPU kernel written in Python (on the integer representations or the
    dequantized values, through the library's float kernels) where the library has none."""
    if has_kernel(name, "QuantizedCPU") or not has_kernel(name, "CPU"):
        return
    _LIB.impl(name, kernel, "QuantizedCPU")


def alert_not_deterministic(caller: str) -> None:
    """torch.use_deterministic_algorithms for kernels whose library cannot ask ATen (the stable
    ABI has no at::globalContext().alertNotDeterministic): an error, or a warning with
    warn_only=True, worded as ATen words it."""
    if not torch.are_deterministic_algorithms_enabled():
        return
    message = (f"{caller} does not have a deterministic implementation, but you set "
               "'torch.use_deterministic_algorithms(True)'. You can turn off determinism just for "
               "this operation, or you can use the 'warn_only=True' option, if that's acceptable "
               "for your application. You can also file an issue at "
               "https://github.com/pytorch/pytorch/issues to help us prioritize adding "
               "deterministic support for this operation.")
    if torch.is_deterministic_algorithms_warn_only_enabled():
        warnings.warn(message, UserWarning, stacklevel=3)
    else:
        raise RuntimeError(message)


_STABLE: list[bool] = []  # whether the loaded library is the stable-ABI one (read once)


def stable_library() -> bool:
    if not _STABLE:
        from .._loader import library_abi

        _STABLE.append(library_abi() == "stable")
    return _STABLE[0]


def alert_cuda_atomics(caller: str, grad: torch.Tensor, launches: bool) -> None:
    """Called by the Python autograd backward before a CUDA backward kernel that adds with
    atomics: a legacy library's kernel alerts itself (csrc/cuda, alert_not_deterministic in
    abi.h); a stable one cannot, so the alert is raised here, for CUDA tensors only and only
    when the kernel would launch (`launches`: the kernel's own condition)."""
    if launches and grad.device.type == "cuda" and stable_library():
        alert_not_deterministic(caller)
