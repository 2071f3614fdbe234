"""Backward ops are differentiable once: asking for their gradient is a clear error."""

import torch


def forbid_double_backward(backward_op: str, forward_name: str) -> None:
    def backward(ctx, *grads):
        raise RuntimeError(
            f"opforge: {forward_name} supports first-order gradients only; double backward "
            f"(differentiating {backward_op}) is not implemented"
        )

    torch.library.register_autograd(backward_op, backward)
