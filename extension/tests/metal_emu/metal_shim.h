// CPU emulation of the Metal Shading Language subset the opforge kernels use.
//
// Compiled with g++ -std=c++20 -Wno-attributes: Metal's [[buffer(n)]] and
// [[thread_position_in_grid]] attributes are unknown to GCC and ignored, and
// the address-space qualifiers become empty macros.  What a macro cannot do
// (threadgroup storage, kernel launchers) is done by prepass.py.
//
// Execution model: every GPU thread of a threadgroup is one real std::thread,
// so atomics race for real and threadgroup_barrier is a real barrier.  The
// barrier also checks that all threads of a threadgroup reach the same
// barrier (an early return before a barrier is undefined on Metal and is
// reported here instead of silently passing).
#ifndef OPFORGE_METAL_SHIM_H
#define OPFORGE_METAL_SHIM_H

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

// ------------------------------------------------------------ scalar types
using uint = unsigned int;
using ulong = unsigned long;
using ushort = unsigned short;
using uchar = unsigned char;
using half = _Float16;
static_assert(sizeof(long) == 8 && sizeof(ulong) == 8, "Metal long is 64-bit");

// ------------------------------------------------------------ vector types
namespace metal_emu {
template <typename T, int N>
struct vec;
template <typename T>
struct vec<T, 2> {
  T x{}, y{};
  vec() = default;
  constexpr vec(T a, T b) : x(a), y(b) {}
  explicit constexpr vec(T a) : x(a), y(a) {}
};
template <typename T>
struct vec<T, 3> {
  T x{}, y{}, z{};
  vec() = default;
  constexpr vec(T a, T b, T c) : x(a), y(b), z(c) {}
  explicit constexpr vec(T a) : x(a), y(a), z(a) {}
};
template <typename T>
struct vec<T, 4> {
  T x{}, y{}, z{}, w{};
  vec() = default;
  constexpr vec(T a, T b, T c, T d) : x(a), y(b), z(c), w(d) {}
  explicit constexpr vec(T a) : x(a), y(a), z(a), w(a) {}
};
}  // namespace metal_emu

using float2 = metal_emu::vec<float, 2>;
using float3 = metal_emu::vec<float, 3>;
using float4 = metal_emu::vec<float, 4>;
using half2 = metal_emu::vec<half, 2>;
using half4 = metal_emu::vec<half, 4>;
using int2 = metal_emu::vec<int, 2>;
using int3 = metal_emu::vec<int, 3>;
using uint2 = metal_emu::vec<uint, 2>;
using uint3 = metal_emu::vec<uint, 3>;

// ------------------------------------------------------------- metal:: math
namespace metal {
#define OPF_EMU_MINMAX(T)                                   \
  inline T min(T a, T b) { return b < a ? b : a; }          \
  inline T max(T a, T b) { return a < b ? b : a; }          \
  inline T clamp(T v, T lo, T hi) { return min(max(v, lo), hi); }
OPF_EMU_MINMAX(float)
OPF_EMU_MINMAX(half)
OPF_EMU_MINMAX(int)
OPF_EMU_MINMAX(uint)
OPF_EMU_MINMAX(long)
OPF_EMU_MINMAX(ulong)
#undef OPF_EMU_MINMAX
// Metal's fmin/fmax return the other operand for a NaN, like C's.
inline float fmin(float a, float b) { return std::fmin(a, b); }
inline float fmax(float a, float b) { return std::fmax(a, b); }
inline float floor(float v) { return std::floor(v); }
inline float ceil(float v) { return std::ceil(v); }
inline float round(float v) { return std::round(v); }
inline float trunc(float v) { return std::trunc(v); }
inline float fabs(float v) { return std::fabs(v); }
inline float abs(float v) { return std::fabs(v); }
inline float sqrt(float v) { return std::sqrt(v); }
inline float exp(float v) { return std::exp(v); }
inline float log(float v) { return std::log(v); }
inline float fma(float a, float b, float c) { return std::fma(a, b, c); }
inline bool isnan(float v) { return std::isnan(v); }
inline bool isinf(float v) { return std::isinf(v); }
template <typename T>
inline T select(T a, T b, bool c) { return c ? b : a; }

// ----------------------------------------------------------------- atomics
enum memory_order { memory_order_relaxed };
struct atomic_float { float value; };
struct atomic_uint { uint value; };
struct atomic_int { int value; };
static_assert(sizeof(atomic_float) == 4 && sizeof(atomic_uint) == 4, "atomic sizes");

template <typename A>
using atomic_value_t = decltype(A::value);

// GCC/Clang __atomic builtins rather than std::atomic_ref, which older libc++
// (Apple clang) lacks.  Float adds are a compare-and-swap loop, as on GPUs
// without native float atomics.
template <typename A>
inline atomic_value_t<A> atomic_fetch_add_explicit(A* a, atomic_value_t<A> v, memory_order) {
  using T = atomic_value_t<A>;
  if constexpr (std::is_floating_point_v<T>) {
    T expected, desired;
    __atomic_load(&a->value, &expected, __ATOMIC_RELAXED);
    do {
      desired = expected + v;
    } while (!__atomic_compare_exchange(&a->value, &expected, &desired, true, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED));
    return expected;
  } else {
    return __atomic_fetch_add(&a->value, v, __ATOMIC_RELAXED);
  }
}
template <typename A>
inline atomic_value_t<A> atomic_fetch_or_explicit(A* a, atomic_value_t<A> v, memory_order) {
  return __atomic_fetch_or(&a->value, v, __ATOMIC_RELAXED);
}
template <typename A>
inline atomic_value_t<A> atomic_load_explicit(A* a, memory_order) {
  atomic_value_t<A> out;
  __atomic_load(&a->value, &out, __ATOMIC_RELAXED);
  return out;
}
template <typename A>
inline void atomic_store_explicit(A* a, atomic_value_t<A> v, memory_order) {
  __atomic_store(&a->value, &v, __ATOMIC_RELAXED);
}
template <typename A>
inline atomic_value_t<A> atomic_exchange_explicit(A* a, atomic_value_t<A> v, memory_order) {
  atomic_value_t<A> out;
  __atomic_exchange(&a->value, &v, &out, __ATOMIC_RELAXED);
  return out;
}

// --------------------------------------------------------------- barriers
enum class mem_flags : unsigned { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };
inline mem_flags operator|(mem_flags a, mem_flags b) {
  return static_cast<mem_flags>(static_cast<unsigned>(a) | static_cast<unsigned>(b));
}
void threadgroup_barrier(mem_flags flags);
}  // namespace metal

// Metal's INFINITY/FLT_MAX come from <cmath>/<cfloat>; HUGE etc. not needed.

// ---------------------------------------------------------------- runtime
namespace metal_emu {

struct Divergence : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A reusable barrier that knows which barrier each thread arrived at.  kind 0
// is the end-of-threadgroup rendezvous of the launcher, kind 1 a
// threadgroup_barrier in kernel code.  A mix within one phase means some
// threads skipped a barrier the others wait at.
class CheckedBarrier {
 public:
  explicit CheckedBarrier(int parties) : parties_(parties) {}
  void arrive_and_wait(int kind) {
    std::unique_lock<std::mutex> lock(mu_);
    if (failed_) throw Divergence(message_);
    if (arrived_ == 0) kind_ = kind;
    if (kind != kind_) fail("threads of one threadgroup reached different barriers "
                            "(an early return before threadgroup_barrier?)");
    const unsigned long gen = generation_;
    if (++arrived_ == parties_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    if (!cv_.wait_for(lock, std::chrono::seconds(60),
                      [&] { return generation_ != gen || failed_; })) {
      fail("barrier timed out after 60 s: not every thread of the threadgroup arrived");
    }
    if (failed_) throw Divergence(message_);
  }
  void abort(const std::string& why) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failed_) {
      failed_ = true;
      message_ = why;
    }
    cv_.notify_all();
  }

 private:
  void fail(const std::string& why) {
    failed_ = true;
    message_ = why;
    cv_.notify_all();
    throw Divergence(why);
  }
  std::mutex mu_;
  std::condition_variable cv_;
  int parties_;
  int arrived_ = 0;
  int kind_ = 0;
  unsigned long generation_ = 0;
  bool failed_ = false;
  std::string message_;
};

// Storage of one threadgroup: one slot per `threadgroup` declaration, filled
// with 0xA5 so code that reads it before writing shows up as wrong results.
class ThreadgroupMemory {
 public:
  void* slot(int id, size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& s = slots_[id];
    if (!s) {
      s.reset(new unsigned char[bytes]);
      std::memset(s.get(), 0xA5, bytes);
    }
    return s.get();
  }
  void reset() {
    std::lock_guard<std::mutex> lock(mu_);
    slots_.clear();
  }

 private:
  std::mutex mu_;
  std::map<int, std::unique_ptr<unsigned char[]>> slots_;
};

struct ThreadContext {
  uint3 thread_position_in_grid;
  uint3 thread_position_in_threadgroup;
  uint3 threadgroup_position_in_grid;
  uint3 threads_per_threadgroup;
  uint3 threadgroups_per_grid;
  uint3 threads_per_grid;
  uint thread_index_in_threadgroup;
  CheckedBarrier* barrier;
  ThreadgroupMemory* tg_memory;
};

inline thread_local ThreadContext* current = nullptr;

inline void* tg_slot(int id, size_t bytes) { return current->tg_memory->slot(id, bytes); }

template <typename T>
inline T position(uint3 v) {
  if constexpr (std::is_same_v<T, uint3>) return v;
  else if constexpr (std::is_same_v<T, uint2>) return uint2(v.x, v.y);
  else return static_cast<T>(v.x);
}

// Runs `body` once per thread of the grid: groups x threads.  With
// `synchronised` (kernels with barriers or threadgroup memory) the threads of
// a pool of threads_per_threadgroup OS threads step through the threadgroups
// together; otherwise each OS thread runs its lane of every threadgroup on
// its own.  Returns an error message, empty on success.
inline std::string run_grid(uint3 groups, uint3 threads, bool synchronised,
                            const std::function<void(const ThreadContext&)>& body) {
  const uint lanes = threads.x * threads.y * threads.z;
  if (lanes == 0 || lanes > 1024) return "threads per threadgroup must be 1..1024";
  CheckedBarrier barrier(static_cast<int>(lanes));
  ThreadgroupMemory memory;
  std::mutex err_mu;
  std::string error;
  auto record = [&](const std::string& e) {
    std::lock_guard<std::mutex> lock(err_mu);
    if (error.empty()) error = e;
  };
  std::vector<std::thread> pool;
  pool.reserve(lanes);
  for (uint lane = 0; lane < lanes; ++lane) {
    pool.emplace_back([&, lane] {
      ThreadContext c{};
      c.threads_per_threadgroup = threads;
      c.threadgroups_per_grid = groups;
      c.threads_per_grid = uint3(groups.x * threads.x, groups.y * threads.y, groups.z * threads.z);
      c.thread_index_in_threadgroup = lane;
      c.thread_position_in_threadgroup =
          uint3(lane % threads.x, (lane / threads.x) % threads.y, lane / (threads.x * threads.y));
      c.barrier = &barrier;
      c.tg_memory = &memory;
      current = &c;
      try {
        for (uint gz = 0; gz < groups.z; ++gz)
          for (uint gy = 0; gy < groups.y; ++gy)
            for (uint gx = 0; gx < groups.x; ++gx) {
              c.threadgroup_position_in_grid = uint3(gx, gy, gz);
              const uint3 t = c.thread_position_in_threadgroup;
              c.thread_position_in_grid =
                  uint3(gx * threads.x + t.x, gy * threads.y + t.y, gz * threads.z + t.z);
              body(c);
              if (synchronised) {
                barrier.arrive_and_wait(0);  // all lanes done with this threadgroup
                if (lane == 0) memory.reset();
                barrier.arrive_and_wait(0);
              }
            }
      } catch (const std::exception& e) {
        record(e.what());
        barrier.abort(e.what());
      }
      current = nullptr;
    });
  }
  for (auto& t : pool) t.join();
  return error;
}

// Kernels and probes of the translation unit, filled by the code prepass.py
// generates and by EMU_PROBE.
struct KernelEntry {
  const char* name;
  bool synchronised;
  std::vector<int> buffers;  // [[buffer(n)]] indices the kernel reads
  void (*body)(void** buffers, const ThreadContext& c);
};
using ProbeFn = void (*)(const long* in, long* out);
inline std::map<std::string, ProbeFn>& probes() {
  static std::map<std::string, ProbeFn> table;
  return table;
}
struct ProbeRegistration {
  ProbeRegistration(const char* name, ProbeFn fn) { probes()[name] = fn; }
};

}  // namespace metal_emu

// A probe evaluates index helpers of a .metal file on values (huge ones
// included) without allocating: in[] and out[] are int64 arrays.
#define EMU_PROBE(name)                                                     \
  static void name(const long* in, long* out);                              \
  static metal_emu::ProbeRegistration name##_registration(#name, &name);    \
  static void name(const long* in, long* out)

inline void metal::threadgroup_barrier(mem_flags) {
  // std::mutex in the barrier orders memory, which covers every mem_flags.
  metal_emu::current->barrier->arrive_and_wait(1);
}

// ------------------------------------------------ Metal keywords as macros
// Defined last: standard headers above use these names as identifiers.
#define kernel
#define device
#define constant
#define thread
#define threadgroup
#define METAL_FUNC inline
#define __METAL_VERSION__ 310

#endif  // OPFORGE_METAL_SHIM_H
