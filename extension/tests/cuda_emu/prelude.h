// Force-included before every csrc/cuda/<op>_kernel.cu compiled as host C++ for
// the emulation: every header the kernel files include first, then the CUDA
// keywords as no-ops, a launcher that runs each (block, thread) of a grid in
// turn (blocks of real threads for kernels that __syncthreads), and registration under opforge_cuda_emu on the CPU key.
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
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <thread>
#include <vector>

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
  EmuDim() = default;
  EmuDim(unsigned int x_, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
};
using dim3 = EmuDim;
// Each emulated thread has its own indices; a block's threads share the grid's sizes.
inline thread_local EmuDim blockIdx, threadIdx;
inline EmuDim blockDim, gridDim;

namespace opforge_emu {
inline int64_t launches = 0;
// `kernel<<<grid, block, ...>>>(args)` is rewritten to launch(grid, block, [&] { kernel(args); }):
// every (block, thread) in turn.
template <typename F>
void launch(EmuDim grid, EmuDim block, F&& body) {
  ++launches;
  gridDim = grid;
  blockDim = block;
  for (unsigned int by = 0; by < grid.y; ++by) {
    for (unsigned int bx = 0; bx < grid.x; ++bx) {
      for (unsigned int t = 0; t < block.x; ++t) {
        blockIdx = {bx, by, 0};
        threadIdx = {t, 0, 0};
        body();
      }
    }
  }
}

// A kernel that calls __syncthreads is rewritten to launch_cooperative: the blocks in turn,
// the threads of a block as real threads meeting at a barrier, __shared__ variables shared
// by them (one block runs at a time) and `extern __shared__` pointing at `shared_bytes`.
inline std::barrier<>* block_barrier = nullptr;
inline std::vector<unsigned char> dynamic_shared_memory;
inline unsigned char* dynamic_shared() { return dynamic_shared_memory.data(); }

inline void sync_threads() {
  if (block_barrier == nullptr) {
    std::fprintf(stderr, "cuda_emu: __syncthreads outside a cooperative launch\n");
    std::abort();
  }
  block_barrier->arrive_and_wait();
}

template <typename F>
void launch_cooperative(EmuDim grid, EmuDim block, int64_t shared_bytes, F&& body) {
  ++launches;
  gridDim = grid;
  blockDim = block;
  dynamic_shared_memory.assign(static_cast<std::size_t>(shared_bytes) + 8, 0xA5);
  for (unsigned int by = 0; by < grid.y; ++by) {
    for (unsigned int bx = 0; bx < grid.x; ++bx) {
      std::barrier<> barrier(static_cast<std::ptrdiff_t>(block.x));
      block_barrier = &barrier;
      std::vector<std::thread> threads;
      threads.reserve(block.x);
      for (unsigned int t = 0; t < block.x; ++t) {
        threads.emplace_back([&, bx, by, t] {
          blockIdx = {bx, by, 0};
          threadIdx = {t, 0, 0};
          body();
          barrier.arrive_and_drop();  // a finished thread no longer holds the others back
        });
      }
      for (auto& thread : threads) thread.join();
      block_barrier = nullptr;
    }
  }
}
}  // namespace opforge_emu

#define __shared__ static
#define __syncthreads() ::opforge_emu::sync_threads()
#define __popcll(x) __builtin_popcountll(x)
#define __ffsll(x) __builtin_ffsll(x)
inline float __fmul_rn(float a, float b) { return a * b; }
inline double __dmul_rn(double a, double b) { return a * b; }
enum EmuFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize };
template <typename Kernel>
int cudaFuncSetAttribute(Kernel, EmuFuncAttribute, int) {
  return 0;  // the emulation's dynamic shared memory has no limit to raise
}

#define is_cuda() defined()  // the emulated inputs are CPU tensors
#define CUDA CPU             // kCUDA checks (deform_conv2d) accept them too
#undef TORCH_LIBRARY_IMPL
#define TORCH_LIBRARY_IMPL(ns, k, m) _TORCH_LIBRARY_IMPL(opforge_cuda_emu, CPU, m, C10_UID)
