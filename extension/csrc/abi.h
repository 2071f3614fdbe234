// The one header that knows which LibTorch ABI a file is compiled against. Kernels are
// written once against the names below; a legacy build (the default) maps them onto ATen
// and torch/library.h, a stable-ABI build (OPFORGE_STABLE_ABI, set by setup.py together
// with TORCH_TARGET_VERSION) onto torch/csrc/stable and the C shim, so the same kernel body
// runs in both wheels.
//
// This is the core, all a CPU kernel or an op's schema file needs. A device backend's host code
// adds its own header beside it: abi_device.h (what every device backend shares),
// abi_cuda.h (csrc/cuda's host code, through cuda/cuda_utils.h), abi_mps.h (csrc/mps/metal_host.h).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#ifdef OPFORGE_STABLE_ABI
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/BFloat16.h>
#include <torch/headeronly/util/Half.h>

#include <dlfcn.h>

#include <atomic>
#include <exception>
#include <mutex>
#include <stdexcept>
#else
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <torch/library.h>
#endif

#include "scalar_types.h"

namespace opforge {

#ifdef OPFORGE_STABLE_ABI
using Tensor = torch::stable::Tensor;
using ScalarType = torch::headeronly::ScalarType;
using DeviceType = torch::headeronly::DeviceType;
#else
using Tensor = at::Tensor;
using ScalarType = at::ScalarType;
using DeviceType = c10::DeviceType;
#endif

#ifdef OPFORGE_STABLE_ABI
namespace detail {
// Below a 2.13 floor a failed shim call only says which call failed: torch 2.13 added
// torch_exception_get_what_without_backtrace. It is looked up at run time, so the wheel still
// loads on its floor and says why (e.g. "not enough memory") wherever the running torch can.
inline const char* shim_error_message() {
#if TORCH_FEATURE_VERSION < TORCH_VERSION_2_13_0
  using Fn = const char* (*)();
  static const Fn fn = [] {
    void* lib = dlopen("libtorch_cpu.so", RTLD_LAZY | RTLD_NOLOAD);
    return lib ? reinterpret_cast<Fn>(dlsym(lib, "torch_exception_get_what_without_backtrace"))
               : nullptr;
  }();
  return fn ? fn() : nullptr;
#else
  return nullptr;  // STABLE_TORCH_ERROR_CODE_CHECK carries the message already
#endif
}

// Runs a call into the shim, replacing its error with torch's message when there is one.
template <typename F>
auto shim_call(const F& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::runtime_error&) {
    const char* why = shim_error_message();
    if (why == nullptr || *why == '\0') {
      throw;
    }
    throw std::runtime_error(why);
  }
}
}  // namespace detail
#endif

// Concatenates what an error message is made of, the way TORCH_CHECK does.
template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

// A tensor's sizes as TORCH_CHECK prints them: [2, 3].
inline std::string shape(const Tensor& t) {
  std::string text = "[";
  for (int64_t d = 0; d < t.dim(); ++d) {
    text += (d ? ", " : "") + std::to_string(t.size(d));
  }
  return text + "]";
}

inline std::string strides(const Tensor& t) {
  std::string text = "[";
  for (int64_t d = 0; d < t.dim(); ++d) {
    text += (d ? ", " : "") + std::to_string(t.stride(d));
  }
  return text + "]";
}

// A device type's name as c10::Device prints it (cpu, cuda), or, with upper_case, as
// c10::DeviceTypeName gives it (CPU, CUDA).
inline const char* device_type_name(DeviceType type, bool upper_case = false) {
  // if, not switch: the CUDA emulation (tests/cuda_emu) defines CUDA as CPU
  if (type == DeviceType::CPU) {
    return upper_case ? "CPU" : "cpu";
  }
  if (type == DeviceType::CUDA) {
    return upper_case ? "CUDA" : "cuda";
  }
  if (type == DeviceType::MPS) {
    return upper_case ? "MPS" : "mps";
  }
  if (type == DeviceType::Meta) {
    return upper_case ? "META" : "meta";
  }
  return upper_case ? "UNKNOWN" : "unknown";
}

// A tensor's device as c10::Device prints it: cpu, cuda:0.
inline std::string device_name(const Tensor& t) {
  const auto device = t.device();
  std::string text = device_type_name(device.type());
  return device.index() >= 0 ? text + ":" + std::to_string(device.index()) : text;
}

inline DeviceType device_type(const Tensor& t) {
  return t.device().type();
}

inline bool same_device(const Tensor& a, const Tensor& b) {
  return a.device().type() == b.device().type() && a.device().index() == b.device().index();
}

inline const char* dtype_name(ScalarType type) {
#ifdef OPFORGE_STABLE_ABI
  return torch::headeronly::toString(type);
#else
  return c10::toString(type);
#endif
}

inline std::string dtype_name(const Tensor& t) {
  return dtype_name(t.scalar_type());
}

// Bytes held by the tensor's storage, or -1 when it has none to read (meta, undefined).
inline int64_t storage_nbytes(const Tensor& t) {
#ifdef OPFORGE_STABLE_ABI
  int64_t bytes = -1;
  if (!t.defined() || device_type(t) == DeviceType::Meta ||
      aoti_torch_get_storage_size(t.get(), &bytes) != AOTI_TORCH_SUCCESS) {
    return -1;
  }
  return bytes;
#else
  if (!t.defined() || !t.has_storage() || t.is_meta()) {
    return -1;
  }
  return static_cast<int64_t>(t.storage().nbytes());
#endif
}

inline ScalarType opmath_dtype(ScalarType type) {
  return type == ScalarType::Half || type == ScalarType::BFloat16 ? ScalarType::Float : type;
}

inline std::vector<int64_t> sizes_of(const Tensor& t) {
  std::vector<int64_t> sizes(t.dim());
  for (int64_t d = 0; d < t.dim(); ++d) {
    sizes[d] = t.size(d);
  }
  return sizes;
}

inline Tensor alloc_empty(const Tensor& like, const std::vector<int64_t>& sizes, ScalarType dtype) {
#ifdef OPFORGE_STABLE_ABI
  // aoti_torch_empty_strided is one C call; aten::new_empty through torch_call_dispatcher
  // would box every argument (several microseconds a tensor, visible on small calls).
  std::vector<int64_t> strides(sizes.size());
  int64_t stride = 1;
  for (size_t d = sizes.size(); d-- > 0;) {
    strides[d] = stride;
    stride *= std::max<int64_t>(sizes[d], 1);
  }
  namespace sd = torch::stable::detail;
  const auto device = like.device();
  AtenTensorHandle handle = nullptr;
  detail::shim_call([&] {
    STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_empty_strided(
        static_cast<int64_t>(sizes.size()), sizes.data(), strides.data(),
        sd::to<int32_t>(sd::from(dtype)), sd::to<int32_t>(sd::from(device.type())),
        device.index() < 0 ? 0 : device.index(), &handle));
    return 0;
  });
  return Tensor(handle);
#else
  return at::empty(sizes, like.options().dtype(dtype));
#endif
}

inline Tensor alloc_empty(const Tensor& like, const std::vector<int64_t>& sizes) {
  return alloc_empty(like, sizes, like.scalar_type());
}

inline Tensor alloc_zeros(const Tensor& like, const std::vector<int64_t>& sizes, ScalarType dtype) {
  // On the CPU the zeros are written here, on the calling thread: ATen's fill goes to its
  // OpenMP team above 32k elements, and on a busy machine a kernel's backward would wait a
  // scheduler time slice for that team's second thread before its own work began (issue 28).
  if (device_type(like) == DeviceType::CPU) {
    Tensor t = alloc_empty(like, sizes, dtype);
    const int64_t n = t.numel();
    if (n > 0) {
      std::memset(t.data_ptr(), 0, static_cast<size_t>(n) * t.element_size());
    }
    return t;
  }
#ifdef OPFORGE_STABLE_ABI
  Tensor t = alloc_empty(like, sizes, dtype);
  detail::shim_call([&] {
    STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_zero_(t.get()));
    return 0;
  });
  return t;
#else
  return at::zeros(sizes, like.options().dtype(dtype));
#endif
}

inline Tensor alloc_zeros(const Tensor& like, const std::vector<int64_t>& sizes) {
  return alloc_zeros(like, sizes, like.scalar_type());
}

// as_contiguous() and to(dtype) that cost nothing when there is nothing to do.
inline Tensor as_contiguous(const Tensor& t) {
#ifdef OPFORGE_STABLE_ABI
  return detail::shim_call([&] { return t.is_contiguous() ? t : torch::stable::contiguous(t); });
#else
  return t.contiguous();
#endif
}

inline Tensor to_dtype(const Tensor& t, ScalarType dtype) {
#ifdef OPFORGE_STABLE_ABI
  return detail::shim_call(
      [&] { return t.scalar_type() == dtype ? t : torch::stable::to(t, dtype); });
#else
  return t.to(dtype);
#endif
}

#ifdef OPFORGE_STABLE_ABI
namespace detail {
template <typename F>
[[gnu::noinline]] void run_chunk(const F& f, int64_t begin, int64_t end) {
  f(begin, end);
}
}  // namespace detail
#endif

template <typename F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
#ifdef OPFORGE_STABLE_ABI
  if (begin >= end) {
    return;
  }
  // Work that one thread does anyway runs here, as at::parallel_for runs it, and not through
  // the shim's callback (on one thread up to 9% slower); run_chunk keeps the body a function
  // of its own, as in a legacy build (inlined into the kernel, roi_pool's forward spilled
  // registers in its bin loop: 17% slower).
  if (end - begin <= grain || end - begin == 1 || torch::stable::get_num_threads() == 1) {
    detail::run_chunk(f, begin, end);
    return;
  }
  // An exception must not cross the C shim: torch_parallel_for would turn it into a bare error
  // code and its message would be lost. The first one is kept and rethrown here.
  std::exception_ptr error;
  std::atomic<bool> failed{false};
  std::mutex lock;
  torch::stable::parallel_for(begin, end, grain, [&](int64_t chunk_begin, int64_t chunk_end) {
    if (failed.load(std::memory_order_relaxed)) {
      return;
    }
    try {
      f(chunk_begin, chunk_end);
    } catch (...) {
      const std::lock_guard<std::mutex> guard(lock);
      if (!error) {
        error = std::current_exception();
      }
      failed = true;
    }
  });
  if (error) {
    std::rethrow_exception(error);
  }
#else
  at::parallel_for(begin, end, grain, f);
#endif
}

inline int64_t num_threads() {
#ifdef OPFORGE_STABLE_ABI
  return static_cast<int64_t>(torch::stable::get_num_threads());
#else
  return at::get_num_threads();
#endif
}

#ifdef OPFORGE_STABLE_ABI
namespace detail {
// Calls an ATen operator through the shim's dispatcher entry point; returns its first output.
template <typename... Args>
Tensor call_aten(const char* name, const char* overload, const Args&... args) {
  StableIValue stack[sizeof...(Args)] = {torch::stable::detail::from(args)...};
  STABLE_TORCH_ERROR_CODE_CHECK(torch_call_dispatcher(name, overload, stack, TORCH_ABI_VERSION));
  return torch::stable::detail::to<Tensor>(stack[0]);
}
}  // namespace detail
#endif

// The few ATen views and BLAS calls the deform_conv2d kernels build on.
inline Tensor viewed(const Tensor& t, const std::vector<int64_t>& sizes) {
#ifdef OPFORGE_STABLE_ABI
  return detail::shim_call([&] { return torch::stable::view(t, sizes); });
#else
  return t.view(sizes);
#endif
}

inline Tensor reshaped(const Tensor& t, const std::vector<int64_t>& sizes) {
#ifdef OPFORGE_STABLE_ABI
  return detail::shim_call([&] { return torch::stable::reshape(t, sizes); });
#else
  return t.reshape(sizes);
#endif
}

inline Tensor narrowed(const Tensor& t, int64_t dim, int64_t start, int64_t length) {
#ifdef OPFORGE_STABLE_ABI
  Tensor self = t;
  return detail::shim_call([&] { return torch::stable::narrow(self, dim, start, length); });
#else
  return t.narrow(dim, start, length);
#endif
}

inline Tensor transposed(const Tensor& t, int64_t dim0, int64_t dim1) {
#ifdef OPFORGE_STABLE_ABI
  return detail::shim_call([&] { return torch::stable::transpose(t, dim0, dim1); });
#else
  return t.transpose(dim0, dim1);
#endif
}

inline void copy_into(const Tensor& dst, const Tensor& src) {
#ifdef OPFORGE_STABLE_ABI
  Tensor self = dst;
  detail::shim_call([&] { return torch::stable::copy_(self, src); });
#else
  const_cast<Tensor&>(dst).copy_(src);
#endif
}

// Batched matrix product, into a new tensor or into `out`.
inline Tensor batched_matmul(const Tensor& a, const Tensor& b) {
#ifdef OPFORGE_STABLE_ABI
  return detail::shim_call([&] { return detail::call_aten("aten::bmm", "", a, b); });
#else
  return at::bmm(a, b);
#endif
}

inline void batched_matmul_out(const Tensor& out, const Tensor& a, const Tensor& b) {
#ifdef OPFORGE_STABLE_ABI
  detail::shim_call([&] { return detail::call_aten("aten::bmm", "out", a, b, out); });
#else
  at::bmm_out(const_cast<Tensor&>(out), a, b);
#endif
}

// Sum over `dims`, keeping the dtype.
inline Tensor sum_over(const Tensor& t, const std::vector<int64_t>& dims) {
#ifdef OPFORGE_STABLE_ABI
  return detail::shim_call(
      [&] { return torch::stable::sum(t, torch::headeronly::IntHeaderOnlyArrayRef(dims)); });
#else
  return t.sum(dims);
#endif
}

// Sets every element to 0, in place.
inline void fill_zero(const Tensor& t) {
#ifdef OPFORGE_STABLE_ABI
  detail::shim_call([&] {
    STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_zero_(t.get()));
    return 0;
  });
#else
  const_cast<Tensor&>(t).zero_();
#endif
}

}  // namespace opforge

// TORCH_CHECK in both ABIs: the message is built by opforge::cat, so it reads the same in
// the legacy and the stable wheel (and in the Python fake kernels that mirror it).
#ifdef OPFORGE_STABLE_ABI
#define OPFORGE_CHECK(cond, ...)                           \
  if (C10_UNLIKELY_OR_CONST(!(cond))) {                    \
    throw std::runtime_error(::opforge::cat(__VA_ARGS__)); \
  }
#else
#define OPFORGE_CHECK(cond, ...) TORCH_CHECK(cond, ::opforge::cat(__VA_ARGS__))
#endif

// AT_DISPATCH_FLOATING_TYPES_AND2(Half, BFloat16, ...) in both ABIs.
#define OPFORGE_DISPATCH_CASE_(enum_name, type, ...) \
  case ::opforge::ScalarType::enum_name: {           \
    using scalar_t = type;                           \
    return __VA_ARGS__();                            \
  }
#define OPFORGE_DISPATCH_FLOATING_TYPES(TYPE, NAME, ...)                 \
  [&] {                                                                  \
    const ::opforge::ScalarType the_type_ = (TYPE);                      \
    switch (the_type_) {                                                 \
      OPFORGE_DISPATCH_CASE_(Double, double, __VA_ARGS__)                \
      OPFORGE_DISPATCH_CASE_(Float, float, __VA_ARGS__)                  \
      OPFORGE_DISPATCH_CASE_(Half, ::opforge::Half, __VA_ARGS__)         \
      OPFORGE_DISPATCH_CASE_(BFloat16, ::opforge::BFloat16, __VA_ARGS__) \
      default:                                                           \
        OPFORGE_CHECK(false, '"', NAME, "\" not implemented for '",      \
                      ::opforge::dtype_name(the_type_), "'");            \
    }                                                                    \
  }()

// AT_DISPATCH_FLOATING_TYPES (float and double only) in both ABIs.
#define OPFORGE_DISPATCH_FLOAT_AND_DOUBLE(TYPE, NAME, ...)          \
  [&] {                                                             \
    const ::opforge::ScalarType the_type_ = (TYPE);                 \
    switch (the_type_) {                                            \
      OPFORGE_DISPATCH_CASE_(Double, double, __VA_ARGS__)           \
      OPFORGE_DISPATCH_CASE_(Float, float, __VA_ARGS__)             \
      default:                                                      \
        OPFORGE_CHECK(false, '"', NAME, "\" not implemented for '", \
                      ::opforge::dtype_name(the_type_), "'");       \
    }                                                               \
  }()

// Operator registration in both ABIs: OPFORGE_LIBRARY_IMPL(CPU, m) { m.impl("nms",
// OPFORGE_KERNEL(nms_kernel)); }. Kernels take `const opforge::Tensor&` and int64_t for
// SymInt arguments.
#ifdef OPFORGE_STABLE_ABI
#define OPFORGE_LIBRARY_FRAGMENT(m) STABLE_TORCH_LIBRARY_FRAGMENT(opforge, m)
#define OPFORGE_LIBRARY_IMPL(key, m) STABLE_TORCH_LIBRARY_IMPL(opforge, key, m)
#define OPFORGE_KERNEL(fn) TORCH_BOX(&fn)
#else
#define OPFORGE_LIBRARY_FRAGMENT(m) TORCH_LIBRARY_FRAGMENT(opforge, m)
#define OPFORGE_LIBRARY_IMPL(key, m) TORCH_LIBRARY_IMPL(opforge, key, m)
#define OPFORGE_KERNEL(fn) TORCH_FN(fn)
#endif
