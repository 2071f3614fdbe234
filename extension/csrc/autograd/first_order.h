// Helpers for the legacy build's C++ Autograd kernels (a stable-ABI build registers the same
// formulas from Python, opforge_ops/ops/*.py). Each differentiable op has a forward Function,
// whose backward calls the op's _backward op, and the _backward op has a Function whose own
// backward is an error: gradients are first order only, as in torchvision.
#pragma once

#include <torch/autograd.h>

#include <string>

namespace opforge::autograd {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The error a double backward raises (the words of the Python registration, _dispatch.py).
[[noreturn]] inline void forbid_double_backward(const char* backward_op, const char* forward_name) {
  TORCH_CHECK(false, "opforge: ", forward_name,
              " supports first-order gradients only; double backward (differentiating ",
              backward_op, ") is not implemented");
}

// IValue round trips of a saved SymInt, which an IValue holds as an int or a SymNode.
inline c10::SymInt saved_symint(AutogradContext* ctx, const std::string& key) {
  return ctx->saved_data[key].toSymInt();
}

}  // namespace opforge::autograd
