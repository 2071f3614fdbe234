import torch

from ._native import lib

torch.library.define("ctops::saxpy", "(Tensor x, Tensor y, float a) -> Tensor")
torch.library.define("ctops::clamp_", "(Tensor(a!) x, float lo, float hi) -> ()")


@torch.library.register_fake("ctops::saxpy")
def _(x, y, a):
    torch._check(x.shape == y.shape, lambda: "saxpy: x and y differ in shape")
    return torch.empty_like(x)


@torch.library.register_kernel("ctops::saxpy", "cpu")
def _(x, y, a):
    torch._check(x.dtype == torch.float32 and y.dtype == torch.float32,
                 lambda: "saxpy: float32 tensors only")
    x, y = x.contiguous(), y.contiguous()
    out = torch.empty_like(x)
    lib.cfloat_saxpy(x.data_ptr(), y.data_ptr(), out.data_ptr(), a, x.numel())
    return out


@torch.library.register_kernel("ctops::saxpy", ("cuda", "mps"))
def _(x, y, a):  # no native GPU kernel: the same formula in torch
    return a * x + y


@torch.library.register_fake("ctops::clamp_")
def _(x, lo, hi):
    return None


@torch.library.register_kernel("ctops::clamp_", "cpu")
def _(x, lo, hi):
    torch._check(x.dtype == torch.float32 and x.is_contiguous(),
                 lambda: "clamp_: a contiguous float32 tensor")
    lib.cfloat_clamp_(x.data_ptr(), lo, hi, x.numel())


def _saxpy_backward(ctx, grad):
    return grad * ctx.a, grad, None


def _saxpy_setup(ctx, inputs, output):
    ctx.a = inputs[2]


torch.library.register_autograd("ctops::saxpy", _saxpy_backward, setup_context=_saxpy_setup)


def saxpy(x: torch.Tensor, y: torch.Tensor, a: float) -> torch.Tensor:
    return torch.ops.ctops.saxpy(x, y, a)


def clamp_(x: torch.Tensor, lo: float, hi: float) -> None:
    torch.ops.ctops.clamp_(x, lo, hi)
