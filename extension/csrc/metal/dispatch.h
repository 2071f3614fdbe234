// Dispatch geometry shared by every opforge Metal kernel: threads per
// threadgroup, how many threadgroups a problem needs, the 64-bit linear work
// index, and the CPU crossover rule. What is particular to one op (its
// [[buffer(n)]] bindings, its parameter struct, its own dispatch and crossover)
// lives in csrc/metal/<op>.h, which includes this file.
//
// Three readers, one truth:
//   * the .metal kernels (embed.py inlines these headers into the shader source;
//     __METAL_VERSION__ is defined there, so only the shared part is seen),
//   * the host code csrc/mps/<op>_kernel.cpp,
//   * the Linux emulation in tests/metal_emu, which runs the kernels with the
//     geometry computed by the functions here and in the op headers.
//
// Every kernel runs exactly one thread per work item and bounds-checks its
// linear index; no kernel loops over a grid stride.  The linear index is
// 64-bit and spread over a 2-D grid of threadgroups so that work sizes past
// 2^32 items still get one thread each.
#ifndef OPFORGE_METAL_DISPATCH_H
#define OPFORGE_METAL_DISPATCH_H

#ifndef __METAL_VERSION__
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#endif

// ---------------------------------------------------------------- constants
// Threads per threadgroup of the one-thread-per-item kernels.  256 is a
// multiple of Apple GPUs' 32-wide SIMD groups and below every pipeline's
// maxTotalThreadsPerThreadgroup seen for these kernels; the host clamps to the
// pipeline limit anyway (opf_dispatch_1d).
#define OPF_THREADS_1D 256
// Metal allows far more, but 65535 threadgroups per grid dimension is the
// portable limit; larger problems spill into the y dimension.
#define OPF_MAX_GROUPS_X 65535

// Each op's parameter struct (metal/<op>.h) puts 8-byte fields first, then
// 4-byte ones, so Metal and C++ agree on the layout without packing pragmas.
// `total` is the number of work items (threads that do work); kernels return
// early for linear indices at or past it.
#ifdef __METAL_VERSION__
// The 64-bit linear work-item index of this thread in a grid laid out by
// opf_dispatch_1d: threadgroups fill x first, then y.
inline ulong opf_linear_index(uint3 tgid, uint3 groups, uint3 threads, uint3 tid) {
  const ulong group = (ulong)tgid.y * (ulong)groups.x + (ulong)tgid.x;
  return group * (ulong)threads.x + (ulong)tid.x;
}
#else
// ------------------------------------------------------------ host geometry
namespace opforge::metal {

struct Dispatch {
  uint32_t groups[3];   // threadgroups per grid (dispatchThreadgroups)
  uint32_t threads[3];  // threads per threadgroup
};

// One thread per work item.  `pipeline_max_threads` is the pipeline state's
// maxTotalThreadsPerThreadgroup (the emulation passes the same number).
inline Dispatch dispatch_1d(uint64_t work_items, uint32_t pipeline_max_threads) {
  uint32_t threads = OPF_THREADS_1D;
  if (pipeline_max_threads > 0 && pipeline_max_threads < threads) {
    // Keep a multiple of the 32-wide SIMD group when clamping.
    threads = std::max<uint32_t>(32, pipeline_max_threads / 32 * 32);
    threads = std::min(threads, pipeline_max_threads);
  }
  const uint64_t total_groups = (work_items + threads - 1) / threads;
  const uint64_t gx = std::min<uint64_t>(std::max<uint64_t>(total_groups, 1), OPF_MAX_GROUPS_X);
  const uint64_t gy = (std::max<uint64_t>(total_groups, 1) + gx - 1) / gx;
  if (gy > OPF_MAX_GROUPS_X) {
    throw std::length_error("opforge MPS: " + std::to_string(work_items) +
                            " work items exceed the grid limit of one dispatch; split the input");
  }
  return Dispatch{{static_cast<uint32_t>(gx), static_cast<uint32_t>(gy), 1u}, {threads, 1u, 1u}};
}

// ------------------------------------------------------- CPU crossover rule
// A Metal dispatch on torch's MPS stream costs about 0.25 ms of launch and
// synchronisation.  Below these sizes the CPU kernel finishes sooner, so the
// MPS kernels copy to the CPU, run the CPU kernel and copy back.  The numbers
// are estimates of where one CPU core spends ~0.25 ms on the op (work items at
// roughly 10-60 ns each), NOT measurements on a Mac: no Mac was available when
// they were set.  Override per op with OPFORGE_MPS_CPU_BELOW_<OP> (an integer,
// in the unit named below) or globally disable routing with
// OPFORGE_MPS_CPU_BELOW=0; tests of the Metal path set it to 0.
// Each op declares its crossover in its own header (metal/<op>.h): the variable
// that overrides it and its default, in the op's unit.
struct Crossover {
  const char* env_name;
  int64_t default_below;
};

// Read on every call (getenv is cheap next to a dispatch), so a test can
// change it between calls.
inline int64_t cpu_below(const Crossover& c) {
  if (const char* v = std::getenv(c.env_name))
    return std::strtoll(v, nullptr, 10);
  if (const char* v = std::getenv("OPFORGE_MPS_CPU_BELOW")) {
    if (std::strtoll(v, nullptr, 10) == 0)
      return 0;
  }
  return c.default_below;
}

inline bool route_to_cpu(const Crossover& c, int64_t size) {
  return size < cpu_below(c);
}

}  // namespace opforge::metal
#endif  // __METAL_VERSION__

#endif  // OPFORGE_METAL_DISPATCH_H
