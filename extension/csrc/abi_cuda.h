// What the CUDA host code (csrc/cuda/<op>_kernel.cpp) needs besides abi.h and abi_device.h, in
// both ABIs. Included by cuda/cuda_utils.h, which every <op>_kernel.cpp includes first; no other
// file sees it, and no device file (cuda/<op>_device.cu, see cuda/launch.h) includes it.
// One block per ABI: the stable one on the CUDA runtime and the C shim, the legacy one on
// ATen's CUDA context.
//
//   CudaDeviceGuard guard(t);         the current device is t's until the scope ends
//   current_cuda_stream(t)            torch's current stream on t's device
//   cuda_sm_count(), cuda_shared_memory_optin()   of the current device
//   OPFORGE_CUDA_CHECK(call)          a failed CUDA runtime call throws "CUDA error: <why>"
//   alert_not_deterministic(caller)   torch.use_deterministic_algorithms for atomic kernels
#pragma once

#include "abi.h"
#include "abi_device.h"

#ifdef OPFORGE_STABLE_ABI

#include <cuda_runtime_api.h>
#include <torch/csrc/stable/accelerator.h>

#define OPFORGE_CUDA_CHECK(call)                                            \
  do {                                                                      \
    const cudaError_t opforge_cuda_error_ = (call);                         \
    OPFORGE_CHECK(opforge_cuda_error_ == cudaSuccess,                       \
                  "CUDA error: ", cudaGetErrorString(opforge_cuda_error_)); \
  } while (0)

namespace opforge {

class CudaDeviceGuard {
 public:
  explicit CudaDeviceGuard(const Tensor& t)
      : guard_(t.device().index() < 0 ? 0 : t.device().index()) {}

 private:
  torch::stable::accelerator::DeviceGuard guard_;
};

inline cudaStream_t current_cuda_stream(const Tensor& t) {
  void* stream = nullptr;
  detail::shim_call([&] {
    STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_get_current_cuda_stream(
        t.device().index() < 0 ? 0 : t.device().index(), &stream));
    return 0;
  });
  return static_cast<cudaStream_t>(stream);
}

// Of the current device (the guard's): its SM count and the shared memory a block may opt in to.
inline int64_t cuda_sm_count() {
  int device = 0;
  int value = 0;
  OPFORGE_CUDA_CHECK(cudaGetDevice(&device));
  OPFORGE_CUDA_CHECK(cudaDeviceGetAttribute(&value, cudaDevAttrMultiProcessorCount, device));
  return value;
}

inline int64_t cuda_shared_memory_optin() {
  int device = 0;
  int value = 0;
  OPFORGE_CUDA_CHECK(cudaGetDevice(&device));
  OPFORGE_CUDA_CHECK(
      cudaDeviceGetAttribute(&value, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  return value;
}

// The stable ABI has no at::globalContext(): a stable build leaves the check to the Python
// autograd backward (opforge_ops/ops/_dispatch.py, alert_not_deterministic), which raises or
// warns with ATen's words for CUDA tensors before it calls the op.
inline void alert_not_deterministic(const char* caller) {
  (void)caller;
}

}  // namespace opforge

#else  // the legacy ABI: ATen's CUDA context

#include <ATen/Context.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#define OPFORGE_CUDA_CHECK(call) C10_CUDA_CHECK(call)

namespace opforge {

class CudaDeviceGuard {
 public:
  explicit CudaDeviceGuard(const Tensor& t) : guard_(t.device()) {}

 private:
  c10::cuda::CUDAGuard guard_;
};

inline cudaStream_t current_cuda_stream(const Tensor& t) {
  (void)t;  // the guard made t's device the current one
  return at::cuda::getCurrentCUDAStream();
}

inline int64_t cuda_sm_count() {
  return at::cuda::getCurrentDeviceProperties()->multiProcessorCount;  // cached by torch
}

inline int64_t cuda_shared_memory_optin() {
  return static_cast<int64_t>(at::cuda::getCurrentDeviceProperties()->sharedMemPerBlockOptin);
}

inline void alert_not_deterministic(const char* caller) {
  at::globalContext().alertNotDeterministic(caller);
}

}  // namespace opforge

#endif  // OPFORGE_STABLE_ABI
