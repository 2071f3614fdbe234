// Emulation stub: there is one (host) device.
#pragma once
#include <c10/core/Device.h>
namespace c10::cuda {
struct CUDAGuard {
  explicit CUDAGuard(c10::Device) {}
};
}  // namespace c10::cuda
