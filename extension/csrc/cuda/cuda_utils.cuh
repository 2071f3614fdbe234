// Shared launch helpers for the opforge CUDA kernels (one header, included first by each
// csrc/cuda/<op>_kernel.cu; nothing here registers a kernel). The kernels are written against
// abi.h's names, so each file compiles for the legacy and the stable ABI.
#pragma once

// the ABI's CUDA part (stream, device guard, launch checks, atomics)
#include "../abi_cuda.h"
#include "../common.h"

#include <algorithm>
#include <cstdint>

namespace opforge::cuda {

// Threads per block for the element-wise kernels (roi_align, roi_pool, deform_conv2d).
constexpr int kThreadsPerBlock = 256;

// Blocks launched per SM at most: enough to fill the machine; the grid-stride loop
// covers the rest, so the grid never grows with the problem past this cap.
constexpr int64_t kBlocksPerSM = 8;

// Number of blocks for `n` work items, capped (see kBlocksPerSM). Never 0 for n > 0.
inline unsigned int capped_blocks(int64_t n, int threads = kThreadsPerBlock) {
  const int64_t needed = (n + threads - 1) / threads;
  const int64_t sms = cuda_sm_count();
  const int64_t cap = std::max<int64_t>(1, sms * kBlocksPerSM);
  return static_cast<unsigned int>(std::max<int64_t>(1, std::min(needed, cap)));
}

// Grid-stride loop over [0, n) with 64-bit indices: every launched thread starts at its
// global id and strides by the total number of launched threads, so each index is
// visited exactly once whatever the grid size.
#define OPFORGE_CUDA_KERNEL_LOOP(i, n)                                          \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x, \
               _opforge_stride = static_cast<int64_t>(blockDim.x) * gridDim.x;  \
       i < (n); i += _opforge_stride)

// Checks that `t` (the op's first tensor) is a CUDA tensor; the shared checks in
// common.h then compare the other tensors' devices and dtypes with it.
inline void check_cuda(const char* op, const char* name, const Tensor& t) {
  OPFORGE_CHECK(device_type(t) == DeviceType::CUDA, op, ": expected ", name,
                " to be a CUDA tensor, got a tensor on ", device_name(t));
}

// Device-side twin of check_rois_values: true when roi [batch, x1, y1, x2, y2] can be
// sampled safely (batch index in range, finite coordinates).
template <typename scalar_t, typename acc_t>
__device__ __forceinline__ bool roi_is_valid(const scalar_t* roi, int64_t batch_size) {
  const acc_t batch = static_cast<acc_t>(roi[0]);
  return batch >= acc_t(0) && batch < static_cast<acc_t>(batch_size) &&
         isfinite(static_cast<acc_t>(roi[1])) && isfinite(static_cast<acc_t>(roi[2])) &&
         isfinite(static_cast<acc_t>(roi[3])) && isfinite(static_cast<acc_t>(roi[4]));
}

}  // namespace opforge::cuda
