// What the MPS host code (csrc/mps/metal_host.h and the <op>_kernel.cpp files) needs besides
// abi.h and abi_device.h: moving a tensor to another tensor's device, and the boxed call of a
// registered opforge operator (the CPU crossover). One block per ABI.
//
//   to_device_of(t, like)             t on like's device (no copy when it is there already)
//   call_op<N>(name, args...)         the first N tensor outputs of the operator `name`
#pragma once

#include <array>
#include <optional>

#include "abi.h"
#include "abi_device.h"

#ifndef OPFORGE_STABLE_ABI
#include <ATen/core/dispatch/Dispatcher.h>
#endif

namespace opforge {

#ifdef OPFORGE_STABLE_ABI

inline Tensor to_device_of(const Tensor& t, const Tensor& like) {
  return detail::shim_call(
      [&] { return same_device(t, like) ? t : torch::stable::to(t, like.device()); });
}

// Arguments are boxed as Tensor, double, int64_t or bool.
template <size_t N, typename... Args>
std::array<Tensor, N> call_op(const char* name, const Args&... args) {
  namespace sd = torch::stable::detail;
  std::array<Tensor, N> out;
  constexpr size_t size = sizeof...(Args) > N ? sizeof...(Args) : N;
  StableIValue stack[size] = {sd::from(args)...};
  detail::shim_call([&] {
    STABLE_TORCH_ERROR_CODE_CHECK(torch_call_dispatcher(name, "", stack, TORCH_ABI_VERSION));
    return 0;
  });
  for (size_t i = 0; i < N; ++i) {
    out[i] = sd::to<Tensor>(stack[i]);
  }
  return out;
}

#else  // the legacy ABI: ATen and the dispatcher

inline Tensor to_device_of(const Tensor& t, const Tensor& like) {
  return t.to(like.device());
}

template <size_t N, typename... Args>
std::array<Tensor, N> call_op(const char* name, const Args&... args) {
  std::array<Tensor, N> out;
  const auto op = c10::Dispatcher::singleton().findSchemaOrThrow(name, "");
  torch::jit::Stack stack{c10::IValue(args)...};
  op.callBoxed(&stack);
  for (size_t i = 0; i < N; ++i) {
    out[i] = stack[i].toTensor();
  }
  return out;
}

#endif  // OPFORGE_STABLE_ABI

}  // namespace opforge
