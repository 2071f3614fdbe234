// One template per op serves AutocastCPU, AutocastCUDA and AutocastMPS: the
// op runs in float32 with the autocast key excluded, so it reaches the backend.
#pragma once

#include <ATen/autocast_mode.h>
#include <ATen/core/Tensor.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

namespace opforge::autocast {

template <c10::DeviceType device>
at::Tensor to_float(const at::Tensor& t) {
  return at::autocast::cached_cast(at::kFloat, t, device);
}

} // namespace opforge::autocast
