"""matrix.yaml: the model (``model``: frozen, typed objects), its parser (``parser``, reading
YAML nodes through ``nodes``) and a variant's wheels on disk (``dist``: its newest wheel,
which variant a wheel is).

Everything after ``load_matrix`` receives objects, never dicts. A malformed file raises
``MatrixError`` (a UsageError: exit 2) whose message is one line:
``matrix.yaml:12: variants[2].cuda: CUDA variant 'cu130' cannot target macos-arm64``.
"""

from opforge.dispatch_keys import BACKEND_KEYS
from opforge.matrix.extension import ABIS, DEFAULT_COMPAT, STABLE_ABI_SINCE
from opforge.matrix.model import (
    CHANNELS,
    COMPAT_WORDS,
    MODULE_BACKENDS,
    MODULE_LOADS,
    Extension,
    Job,
    Matrix,
    MatrixError,
    Module,
    Op,
    Platform,
    Promises,
    TorchChannel,
    Variant,
    build_jobs,
    compat_jobs,
    promises,
)
from opforge.matrix.parser import (
    CHANNEL_ENV,
    DEFAULT_MATRIX,
    KNOWN_PYTHONS,
    MATRIX_ENV,
    NVCC_ARCHS,
    VERSION_ENV,
    find_matrix,
    load_matrix,
    parse_matrix,
    with_torch,
)

__all__ = ["ABIS", "BACKEND_KEYS", "CHANNELS", "CHANNEL_ENV", "COMPAT_WORDS", "DEFAULT_COMPAT",
           "DEFAULT_MATRIX", "KNOWN_PYTHONS", "MATRIX_ENV", "MODULE_BACKENDS", "MODULE_LOADS",
           "NVCC_ARCHS", "STABLE_ABI_SINCE", "VERSION_ENV", "Extension", "Job", "Matrix",
           "MatrixError", "Module", "Op", "Platform", "Promises", "TorchChannel", "Variant",
           "build_jobs", "compat_jobs", "find_matrix", "promises", "load_matrix", "parse_matrix",
           "with_torch"]
