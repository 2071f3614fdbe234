// Force-included before every csrc/cuda/<op>_kernel.cu compiled as host C++ for
// the emulation: every header the kernel files include first, then the CUDA
// keywords as no-ops, a launcher that runs each (block, thread) of a grid in
// turn, and registration under opforge_cuda_emu on the CPU key.
#pragma once
#include <torch/extension.h>
#include <ATen/ATen.h>
#include <ATen/AccumulateType.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/Atomic.cuh>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
using std::isfinite;
using std::isnan;
using std::max;
using std::min;

struct EmuDim {
  unsigned int x = 1, y = 1, z = 1;
};
inline EmuDim blockIdx, threadIdx, blockDim, gridDim;

namespace opforge_emu {
inline int64_t launches = 0;
// `kernel<<<grid, block, ...>>>(args)` is rewritten to launch(grid, block, [&] { kernel(args); }).
template <typename F>
void launch(unsigned int grid, int block, F&& body) {
  ++launches;
  gridDim = {grid, 1, 1};
  blockDim = {static_cast<unsigned int>(block), 1, 1};
  for (unsigned int b = 0; b < grid; ++b) {
    for (int t = 0; t < block; ++t) {
      blockIdx = {b, 0, 0};
      threadIdx = {static_cast<unsigned int>(t), 0, 0};
      body();
    }
  }
}
}  // namespace opforge_emu

#define is_cuda() defined()  // the emulated inputs are CPU tensors
#define CUDA CPU             // kCUDA checks (deform_conv2d) accept them too
#undef TORCH_LIBRARY_IMPL
#define TORCH_LIBRARY_IMPL(ns, k, m) _TORCH_LIBRARY_IMPL(opforge_cuda_emu, CPU, m, C10_UID)
