"""Is an op's error a registration fault, or the op refusing the arguments a stub made up?

A stub recipe (``"stub": True``, written by ``opforge init`` from a schema) guesses its
inputs; an op whose own argument checks refuse them (``TORCH_CHECK(index.dim() == 1)``,
``expected scalar type Long but found Float``, an index assert in its kernel) is healthy and
only needs a real recipe. Everything else that can go wrong when calling an op is a fault of
the package: the dispatcher has no kernel for the key, the operator does not exist, a module
or attribute is missing, a library does not load, a device faults. ``classify`` tells them
apart from structural evidence first (the exception's type, the dispatcher's own message
forms, where an internal assert sits), the op's words last:

  REGISTRATION  the dispatcher or the loader failed: a fault, reported as a failure
  NO_KERNEL     the op says it has no kernel for this device (``No CPU version supported``,
                ``CPU kernel not implemented``): a failure unless matrix.yaml declares it
                (``no_kernel: [cpu]``); ``Not compiled with CUDA support`` is a build fault
  DEVICE_FAULT  the device failed while running the kernel (a CUDA error, out of memory)
  REJECTED      the op's argument checks raised (RuntimeError, IndexError, ValueError,
                TypeError, a Python kernel's AssertionError that is none of the above, or
                AT_DISPATCH refusing a dtype): for a stub a warning, for a recipe the
                author wrote (or one ``opforge recipes --derive`` found running) a failure
  UNKNOWN       any other exception type (a KeyError in a Python kernel): a failure

Standard library only: the probe runs this in the environment under test.
"""

from __future__ import annotations

import re

REGISTRATION = "registration"
NO_KERNEL = "no-kernel"
DEVICE_FAULT = "device-fault"
REJECTED = "rejected"
UNKNOWN = "unknown"

# the dispatcher's and torch.library's own message forms: a missing kernel or operator
_DISPATCHER = re.compile(
    r"Could not run '[^']*' with arguments from the '[^']*' backend"
    r"|operator [\w.:]+ does not exist"
    r"|No such operator [\w.:]+"
    r"|Didn't find kernel to dispatch to"
    r"|attempted to run this operator with Meta tensors, but there was no (?:fake impl|abstract)"
    r"|There were no tensor arguments to this function"
    r"|Tried to access or call an operator with a wrong namespace"
    r"|Cannot access data pointer of Tensor"
    r"|undefined symbol"
    r"|cannot open shared object file")
# a TORCH_INTERNAL_ASSERT names its file; in torch's own core it is torch's, not the op's
_ASSERT_AT = re.compile(r'INTERNAL ASSERT FAILED at "([^"]+)"')
_TORCH_CORE = re.compile(r"(?:^|/)(?:c10|torch/csrc|aten/src/ATen/core|torch/headeronly)/")
# the device failed under the kernel: never the stub's inputs
_DEVICE_FAULT = re.compile(r"CUDA error|CUBLAS_STATUS|cuDNN error|CUDNN_STATUS|illegal memory "
                           r"access|out of memory|HIP error|MPS backend out of memory|"
                           r"device-side assert", re.IGNORECASE)
_DEVICE = r"(cpu|cuda|gpu|mps|xpu)"
# the op's own words for "no kernel for this device" (its design or its build)
_NO_KERNEL = (
    re.compile(rf"\bno {_DEVICE} (?:version|implementation|kernel|support)", re.IGNORECASE),
    re.compile(rf"\b{_DEVICE} (?:version|implementation|kernel)s? (?:is |are )?(?:not |un)"
               r"(?:available|supported|implemented)", re.IGNORECASE),
    re.compile(rf"\bnot (?:implemented|supported|available) (?:for|on) (?:the )?{_DEVICE}\b"
               r"(?! ?')", re.IGNORECASE),
    re.compile(rf"\bonly (?:supports?|implemented for|available for|runs? on) {_DEVICE}"
               r"(?: tensors?| devices?| inputs?)?\b", re.IGNORECASE),
)
# the package was built without the device's kernels: a build fault, never by design
_NOT_BUILT = re.compile(rf"\b(?:not (?:compiled|built) with|(?:compiled|built) without) "
                        rf"(?:the )?{_DEVICE}\b", re.IGNORECASE)
# AT_DISPATCH's refusal of a dtype (``"histogram_cpu" not implemented for 'Long'``): the op
# has kernels, only not for the dtype the stub chose
_DTYPE_REFUSED = re.compile(r"\bnot implemented for '\w+'")
# the exception types TORCH_CHECK and its kin raise (c10::Error, IndexError, ValueError,
# TypeError), and a Python kernel's argument checks
_CHECK_TYPES = ("RuntimeError", "IndexError", "ValueError", "TypeError",
                "AssertionError")  # a Python kernel's ``assert x.dim() == 1``
# types that say "this is not there", never "your arguments are wrong"
_MISSING_TYPES = ("NotImplementedError", "AttributeError", "ImportError", "ModuleNotFoundError",
                  "OSError", "FileNotFoundError", "SystemError", "RecursionError", "MemoryError",
                  # FakeTensorMode and torch.compile: the op cannot be traced (no fake kernel,
                  # a graph break, a data-dependent output): a gap of the package, not inputs
                  "DataDependentOutputException", "DynamicOutputShapeException",
                  "UnsupportedOperatorException", "Unsupported", "BackendCompilerFailed",
                  "InternalTorchDynamoError", "GuardOnDataDependentSymNode")
# wrappers whose cause is the op's own error (torch.compile ran the op on fake tensors)
_WRAPPERS = ("TorchRuntimeError",)


def beyond_inputs(exc: BaseException) -> bool:
    """Whether no other arguments can make the call run: the dispatcher has no kernel for the
    CPU or no such operator, the library does not load, or the op says it has no kernel for
    the device (``opforge recipes --derive`` stops searching on these)."""
    kind, _ = classify(exc)
    return kind == NO_KERNEL or (kind == REGISTRATION and (
        _DISPATCHER.search(str(exc)) is not None or _NOT_BUILT.search(str(exc)) is not None))


def _type_names(exc: BaseException) -> list[str]:
    return [cls.__name__ for cls in type(exc).__mro__]


def no_kernel_device(text: str) -> str | None:
    """The device an op's own words say it has no kernel for (``No CPU version supported``:
    'cpu'; a GPU is 'cuda'), or None, also for a build fault (``Not compiled with CUDA
    support``). ``opforge init`` reads the error messages of a package's kernels with it
    (opforge.scan.no_kernel), so the scan and the probe share one vocabulary."""
    if _NOT_BUILT.search(text):
        return None
    for pattern in _NO_KERNEL:
        m = pattern.search(text)
        if m:
            device = m.group(1).lower()
            return "cuda" if device == "gpu" else device
    return None


def classify(exc: BaseException) -> tuple[str, str | None]:
    """(kind, detail): one of the kinds above, with the device a NO_KERNEL message names or
    the file of torch's own assert."""
    while type(exc).__name__ in _WRAPPERS and exc.__cause__ is not None:
        exc = exc.__cause__
    text = str(exc)
    names = _type_names(exc)
    if _DISPATCHER.search(text):
        return REGISTRATION, None
    if _NOT_BUILT.search(text):
        return REGISTRATION, None
    if _DTYPE_REFUSED.search(text) and any(n in _CHECK_TYPES + ("NotImplementedError",)
                                           for n in names):
        return REJECTED, None
    if any(name in _MISSING_TYPES for name in names[:-2]):  # not ``Exception``/``object``
        return REGISTRATION, None
    if _DEVICE_FAULT.search(text):
        return DEVICE_FAULT, None
    device = no_kernel_device(text)
    if device is not None:
        return NO_KERNEL, device
    asserted = _ASSERT_AT.search(text)
    if asserted and _TORCH_CORE.search(asserted.group(1).replace("\\", "/")):
        return REGISTRATION, asserted.group(1)
    if any(name in _CHECK_TYPES for name in names):
        return REJECTED, None
    return UNKNOWN, None


def op_message(exc: BaseException, limit: int = 240) -> str:
    """The op's own words: the first line, without torch's trailing boilerplate."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = lines[0] if lines else type(exc).__name__
    text = re.sub(r"\s*(?:Exception raised from .*|please report a bug to PyTorch\.?.*)$", "",
                  text).rstrip(" ,.")
    return text if len(text) <= limit else text[:limit - 3] + "..."
