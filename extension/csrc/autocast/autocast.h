// One template per op serves AutocastCPU, AutocastCUDA and AutocastMPS: the
// op runs in float32 with the autocast key excluded, so it reaches the backend.
#pragma once

#include <ATen/autocast_mode.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

namespace opforge::autocast {

template <c10::DeviceType device>
at::Tensor to_float(const at::Tensor& t) {
  return at::autocast::cached_cast(at::kFloat, t, device);
}

}  // namespace opforge::autocast

// Registers `fn<key, device>` (a template over the autocast key and its device) as
// the autocast kernel of `op` for CPU, and for CUDA / MPS when the wheel has them.
#define OPFORGE_AUTOCAST_CPU_(op, fn)                                                \
  TORCH_LIBRARY_IMPL(opforge, AutocastCPU, m) {                                      \
    m.impl(op, TORCH_FN((fn<c10::DispatchKey::AutocastCPU, c10::DeviceType::CPU>))); \
  }
#ifdef WITH_CUDA
#define OPFORGE_AUTOCAST_CUDA_(op, fn)                                                 \
  TORCH_LIBRARY_IMPL(opforge, AutocastCUDA, m) {                                       \
    m.impl(op, TORCH_FN((fn<c10::DispatchKey::AutocastCUDA, c10::DeviceType::CUDA>))); \
  }
#else
#define OPFORGE_AUTOCAST_CUDA_(op, fn)
#endif
#ifdef WITH_MPS
#define OPFORGE_AUTOCAST_MPS_(op, fn)                                                \
  TORCH_LIBRARY_IMPL(opforge, AutocastMPS, m) {                                      \
    m.impl(op, TORCH_FN((fn<c10::DispatchKey::AutocastMPS, c10::DeviceType::MPS>))); \
  }
#else
#define OPFORGE_AUTOCAST_MPS_(op, fn)
#endif
#define OPFORGE_AUTOCAST_IMPL(op, fn) \
  OPFORGE_AUTOCAST_CPU_(op, fn)       \
  OPFORGE_AUTOCAST_CUDA_(op, fn)      \
  OPFORGE_AUTOCAST_MPS_(op, fn)
