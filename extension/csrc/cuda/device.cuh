// What every csrc/cuda/<op>_device.cu includes first: the launch interface (launch.h) and the
// helpers of device code. No ATen, no torch/library.h, no abi.h: nvcc parses a device file once
// per arch of the build, so everything included here is paid for six times in cu130.
//
//   OPFORGE_CUDA_KERNEL_LOOP(i, n)     grid-stride loop over [0, n) with 64-bit indices
//   OPFORGE_ATOMIC_ADD(ptr, value)     atomicAdd; the kernels add float or double only
//   OPFORGE_INSTANTIATE_LAUNCH(Args)   launch(grid, Args<T>) for every floating type T
//   roi_is_valid<scalar_t, acc_t>(roi, batch_size)
#pragma once

#include <cstdint>
#include <limits>

#include "launch.h"

// Grid-stride loop over [0, n) with 64-bit indices: every launched thread starts at its
// global id and strides by the total number of launched threads, so each index is
// visited exactly once whatever the grid size.
#define OPFORGE_CUDA_KERNEL_LOOP(i, n)                                          \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x, \
               _opforge_stride = static_cast<int64_t>(blockDim.x) * gridDim.x;  \
       i < (n); i += _opforge_stride)

// Backward kernels accumulate into float or double buffers (opmath_t), never half types, so
// the runtime's atomicAdd covers them on every arch of the arch lists (sm_60 and newer).
#define OPFORGE_ATOMIC_ADD(ptr, value) atomicAdd((ptr), (value))

// Defines launch(const Grid&, const Args<T>&) for the four floating types the host dispatches
// over (OPFORGE_DISPATCH_FLOATING_TYPES), from the template the device file defines.
#define OPFORGE_INSTANTIATE_LAUNCH(Args)                                  \
  template cudaError_t launch(const Grid&, const Args<double>&);          \
  template cudaError_t launch(const Grid&, const Args<float>&);           \
  template cudaError_t launch(const Grid&, const Args<::opforge::Half>&); \
  template cudaError_t launch(const Grid&, const Args<::opforge::BFloat16>&)

namespace opforge::cuda {

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
