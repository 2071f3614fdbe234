// What every csrc/cuda/<op>_kernel.cpp (an op's host code: checks, allocation, dispatch over
// dtypes and its TORCH_LIBRARY_IMPL) includes first: the ABI's CUDA part (stream, device
// guard, launch checks), the shared input checks and the launch interface to the op's
// <op>_device.cu. Host C++ only: the compiler parses it once, not once per arch.
#pragma once

// the ABI's CUDA part (stream, device guard, launch checks)
#include "../abi_cuda.h"
#include "../common.h"
#include "launch.h"

#include <algorithm>
#include <cstdint>

namespace opforge::cuda {

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

// The grid of an element-wise kernel over `n` items on `stream`: capped_blocks(n) blocks of
// kThreadsPerBlock threads.
inline Grid elementwise_grid(int64_t n, cudaStream_t stream) {
  return Grid{capped_blocks(n), kThreadsPerBlock, 0, stream};
}

// Checks that `t` (the op's first tensor) is a CUDA tensor; the shared checks in
// common.h then compare the other tensors' devices and dtypes with it.
inline void check_cuda(const char* op, const char* name, const Tensor& t) {
  OPFORGE_CHECK(device_type(t) == DeviceType::CUDA, op, ": expected ", name,
                " to be a CUDA tensor, got a tensor on ", device_name(t));
}

}  // namespace opforge::cuda
