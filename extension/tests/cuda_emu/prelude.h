// Force-included before every csrc/cuda/<op>_device.cu and <op>_kernel.cpp compiled as host C++ for
// the emulation: every header the kernel files include first, then the CUDA
// keywords as no-ops, a launcher that runs each (block, thread) of a grid in
// turn (blocks of real threads for kernels that __syncthreads), and registration under
// OPFORGE_CUDA_EMU_NS (opforge_cuda_emu, or opforge_cuda_emu_stable for the stable build) on the
// CPU key. With OPFORGE_STABLE_ABI (cuda_emu.load(abi="stable")) the
// kernel files compile against the LibTorch stable ABI, as in the cu130_stable wheel: abi.h's
// stable names, the C shim's device guard and stream answered by the emulation.
#pragma once
#ifdef OPFORGE_STABLE_ABI
// The shim's device guard would ask for a real accelerator: these calls are the emulation's
// (emu_main.cpp), renamed before the shim headers declare them.
#define aoti_torch_create_device_guard opforge_emu_create_device_guard
#define aoti_torch_delete_device_guard opforge_emu_delete_device_guard
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/BFloat16.h>
#include <torch/headeronly/util/Half.h>
// declared by the shim only with USE_CUDA: the emulated device has the null stream
inline AOTITorchError aoti_torch_get_current_cuda_stream(int32_t, void** stream) {
  *stream = nullptr;
  return AOTI_TORCH_SUCCESS;
}
#else
#include <torch/extension.h>
#include <ATen/ATen.h>
#include <ATen/AccumulateType.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/Atomic.cuh>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>
#endif
#include <cuda_runtime_api.h>

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
// One thread runs at a time outside a cooperative launch: an atomic add is a plain add.
template <typename T>
inline T atomicAdd(T* p, T v) {
  T old = *p;
  *p = old + v;
  return old;
}

#define CUDA CPU  // the emulated inputs are CPU tensors: the kernels' CUDA checks accept them
// One more level, so that OPFORGE_CUDA_EMU_NS is expanded before torch's macro pastes it.
#define OPFORGE_EMU_IMPL(impl, ns, m) impl(ns, CPU, m, C10_UID)
#ifdef OPFORGE_STABLE_ABI
#undef STABLE_TORCH_LIBRARY_IMPL
#define STABLE_TORCH_LIBRARY_IMPL(ns, k, m) OPFORGE_EMU_IMPL(_STABLE_TORCH_LIBRARY_IMPL, OPFORGE_CUDA_EMU_NS, m)
#else
#undef TORCH_LIBRARY_IMPL
#define TORCH_LIBRARY_IMPL(ns, k, m) OPFORGE_EMU_IMPL(_TORCH_LIBRARY_IMPL, OPFORGE_CUDA_EMU_NS, m)
#endif
