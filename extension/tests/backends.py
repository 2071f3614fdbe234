"""Every backend an op's kernels run on, as one test parameter.

    @pytest.mark.parametrize("backend", BACKENDS, ids=str)
    def test_x(backend):
        backend.skip_unless_runs(dtype)
        out = backend.call("roi_align", x, rois, 1.0, 7, 7, 2, True)   # CPU tensors in and out

cpu        the built extension's CPU kernels
cuda       the CUDA kernels on a CUDA device (skipped without one or without a CUDA build)
mps        the MPS kernels on an Apple GPU (skipped elsewhere)
cuda_emu   csrc/cuda compiled as host C++ and run on the CPU (tests/cuda_emu)
cuda_stable_emu  the same files as the stable-ABI CUDA wheel builds them (abi.h's stable names:
           torch's C shim for allocation, device guard, stream and ATen calls), emulated alike
metal_emu  csrc/mps/*_kernel.cpp (legacy ABI) + csrc/metal/*.metal run on the CPU (tests/metal_emu)
metal_shim_emu  the same host code as the stable-ABI MPS wheel builds it (torch's MPS C shim
           only), on an emulated shim (tests/metal_emu/shim_emu.h)

The device and emulated backends route nothing to the CPU kernels (OPFORGE_MPS_CPU_BELOW=0).
"""

from __future__ import annotations

import contextlib
import os
import shutil

import torch

import opforge_ops

ALL_FLOATS = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
METAL_FLOATS = (torch.float32, torch.float16)


def backend_tolerance(dtype):
    """A backend's result in `dtype` against a float64 reference of the same inputs."""
    return {
        torch.float64: dict(rtol=1e-7, atol=1e-7),
        torch.float32: dict(rtol=1e-4, atol=1e-4),
        torch.float16: dict(rtol=2e-2, atol=2e-2),
        torch.bfloat16: dict(rtol=8e-2, atol=8e-2),
    }[dtype]


@contextlib.contextmanager
def _metal_path_only():
    """The MPS host code runs its Metal kernels whatever the problem size."""
    saved = {k: v for k, v in os.environ.items() if k.startswith("OPFORGE_MPS_CPU_BELOW")}
    for key in saved:
        del os.environ[key]
    os.environ["OPFORGE_MPS_CPU_BELOW"] = "0"
    try:
        yield
    finally:
        del os.environ["OPFORGE_MPS_CPU_BELOW"]
        os.environ.update(saved)


def _to_device(tensor: torch.Tensor, device: str) -> torch.Tensor:
    """A copy on `device` with the same strides (Tensor.to makes a strided view contiguous)."""
    if any(stride == 0 and size > 1 for size, stride in zip(tensor.size(), tensor.stride())):
        return tensor.to(device)  # an expanded tensor cannot be copied into its own layout
    out = torch.empty_strided(tensor.size(), tensor.stride(), dtype=tensor.dtype, device=device)
    return out.copy_(tensor)


def _map(value, fn):
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_map(v, fn) for v in value)
    return value


class Backend:
    def __init__(self, name: str, dtypes: tuple, device: str | None = None):
        self.name = name
        self.dtypes = dtypes
        self.device = device

    def __str__(self) -> str:
        return self.name

    def unavailable(self) -> str | None:
        """Why this backend cannot run here, or None."""
        backends = opforge_ops.build_info().get("backends", [])
        if self.name == "cuda":
            if "cuda" not in backends:
                return "opforge_ops was built without CUDA kernels"
            return None if torch.cuda.is_available() else "no CUDA device"
        if self.name == "mps":
            if "mps" not in backends:
                return "opforge_ops was built without MPS kernels"
            return None if torch.backends.mps.is_available() else "no MPS device"
        if self.name in EMULATED_NAMES:
            compiler = os.environ.get("CXX", "g++")
            return None if shutil.which(compiler) else f"no C++ compiler ({compiler}) for the emulation"
        return None

    def skip_unless_runs(self, dtype: torch.dtype | None = None, op: str | None = None) -> None:
        """Skip, saying why, unless this backend runs here (and runs `op`, in `dtype`)."""
        import pytest

        reason = self.unavailable()
        if reason:
            pytest.skip(reason)
        if op is not None and self.name in CUDA_EMULATIONS:
            import cuda_emu

            why = cuda_emu.NOT_EMULATED.get(f"{op.lstrip('_')}_device.cu")
            if why:
                pytest.skip(f"csrc/cuda/{op.lstrip('_')}_device.cu is not emulated: {why}")
        if dtype is not None and dtype not in self.dtypes:
            pytest.skip(f"{self.name} kernels take {', '.join(map(str, self.dtypes))}, not {dtype}")

    def ops(self):
        if self.name in CUDA_EMULATIONS:
            import cuda_emu

            return cuda_emu.load(CUDA_EMULATIONS[self.name])
        if self.name == "metal_emu":
            from metal_emu import harness

            return harness.load_host()
        if self.name == "metal_shim_emu":
            from metal_emu import harness

            return harness.load_shim_host()
        return torch.ops.opforge

    def call(self, op: str, *args):
        """Run `op` on this backend; tensors go in from and come back to the CPU."""
        fn = getattr(self.ops(), op)
        if self.device is not None:
            args = _map(args, lambda t: _to_device(t, self.device))
        context = _metal_path_only() if self.name in METAL_HOSTS else contextlib.nullcontext()
        with context:
            out = fn(*args)
        return _map(out, lambda t: t.cpu())

    def call_function(self, fn, *args):
        """Run a Python function (e.g. opforge_ops.batched_nms) on this device backend."""
        assert self.name in DEVICE_NAMES, f"{self.name} runs torch.ops only"
        if self.device is not None:
            args = _map(args, lambda t: _to_device(t, self.device))
        return _map(fn(*args), lambda t: t.cpu())


DEVICE_NAMES = ("cpu", "cuda", "mps")
CUDA_EMULATIONS = {"cuda_emu": "legacy", "cuda_stable_emu": "stable"}  # backend -> the ABI built
EMULATED_NAMES = (*CUDA_EMULATIONS, "metal_emu", "metal_shim_emu")
METAL_HOSTS = ("mps", "metal_emu", "metal_shim_emu")  # csrc/mps's host code, routing off

BACKENDS = [
    Backend("cpu", ALL_FLOATS),
    Backend("cuda", ALL_FLOATS, device="cuda"),
    Backend("mps", METAL_FLOATS, device="mps"),
    Backend("cuda_emu", ALL_FLOATS),
    Backend("cuda_stable_emu", ALL_FLOATS),
    Backend("metal_emu", METAL_FLOATS),
    Backend("metal_shim_emu", METAL_FLOATS),
]
# The backends a Python function built on torch.ops.opforge runs on (the emulations
# register their own namespaces, which such a function does not call).
DEVICE_BACKENDS = [b for b in BACKENDS if b.name in DEVICE_NAMES]
