// Host-side helpers shared by csrc/mps/<op>_kernel.cpp: one Metal library per
// op, cached kernel functions, tensor and parameter binding, encoding on
// torch's current MPS stream, and the CPU route for small problems (dispatch.h).
//
// The <op>_kernel.cpp files are plain C++ written once against abi.h and the
// Pipeline/Encoder handles below; what launches them is chosen here:
//   * OPFORGE_STABLE_ABI (the stable-ABI MPS wheel): torch's C shim only --
//     aoti_torch_mps_create_shader_library (the source; the shim takes no
//     metallib), aoti_torch_mps_get_kernel_function, aoti_torch_mps_run_command_block
//     + aoti_torch_mps_start_encoding (torch's MPS stream), aoti_torch_mps_set_arg_tensor,
//     torch_mps_set_arg_bytes (torch 2.14: the parameter struct, which is why the
//     stable MPS floor is 2.14) and aoti_torch_mps_dispatch_array_with_group_size.
//     No Objective-C.
//   * Objective-C++ (the legacy mps wheel: FORCE_MPS=1 compiles everything with
//     -ObjC++): Metal and ATen's MPSStream directly, embedded metallibs, the
//     pipelines' own thread limits.
//   * OPFORGE_MPS_EMULATED (tests/metal_emu, Linux): every dispatch runs in the
//     CPU emulation of the .metal kernels.  With OPFORGE_STABLE_ABI as well, the
//     shim branch above runs against tests/metal_emu/shim_emu.h, an emulated shim.
//
// Works with and without -fobjc-arc: objects created here are cached for the
// life of the process and never released.
#pragma once

#include <cmath>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "abi_mps.h"
#include "common.h"
#include "metal/dispatch.h"

#if defined(OPFORGE_STABLE_ABI)
#include <torch/csrc/inductor/aoti_torch/c/shim_mps.h>
#include <torch/csrc/stable/c/shim.h>
#ifdef OPFORGE_MPS_EMULATED
#define OPFORGE_MPS_LIBRARY_IMPL(m) STABLE_TORCH_LIBRARY_IMPL(opforge_shim_emu, CPU, m)
#else
#define OPFORGE_MPS_LIBRARY_IMPL(m) STABLE_TORCH_LIBRARY_IMPL(opforge, MPS, m)
#endif
#elif defined(__OBJC__)
#import <Foundation/Foundation.h>
#import <Metal/Metal.h>

#include <ATen/mps/MPSDevice.h>
#include <ATen/mps/MPSStream.h>
#define OPFORGE_MPS_LIBRARY_IMPL(m) TORCH_LIBRARY_IMPL(opforge, MPS, m)
#elif defined(OPFORGE_MPS_EMULATED)
#include <list>
#define OPFORGE_MPS_LIBRARY_IMPL(m) TORCH_LIBRARY_IMPL(opforge_emu, CPU, m)
// Provided by the emulation runtime tests/metal_emu builds next to this code.
extern "C" const void* opforge_emu_find_kernel(const char* name);
extern "C" int opforge_emu_launch(const void* kernel, void** buffers, const unsigned* groups,
                                  const unsigned* threads, char* error, unsigned long error_size);
#else
#error "csrc/mps/*.cpp: a legacy MPS build is Objective-C++ (FORCE_MPS=1 on macOS adds -ObjC++)"
#endif

namespace opforge::mps {

using opforge::metal::Dispatch;

// ------------------------------------------------- torch's C shim (stable ABI)
#if defined(OPFORGE_STABLE_ABI)
namespace detail {
inline void shim_check(AOTITorchError rc, const char* call, const char* what) {
  if (rc != AOTI_TORCH_SUCCESS) {
    // the shim turned torch's exception into an error code; its message is kept (torch 2.13+)
#if TORCH_FEATURE_VERSION >= TORCH_VERSION_2_13_0
    const char* why = torch_exception_get_what_without_backtrace();
#else
    const char* why = ::opforge::detail::shim_error_message();
#endif
    throw std::runtime_error(::opforge::cat("opforge MPS: ", call, " failed for ", what,
                                            why && *why ? ": " : "", why ? why : ""));
  }
}
}  // namespace detail

using Pipeline = AOTIMetalKernelFunctionHandle;

// What one encode() block binds to: the kernel function set last (start_encoding puts its
// pipeline on the stream's compute encoder; bindings stay on that encoder, as in Metal), and
// the first error, kept rather than thrown through the shim's command block.
struct ShimEncoder {
  Pipeline function = nullptr;
  std::exception_ptr error;
};
using Encoder = ShimEncoder*;

class KernelLibrary {
 public:
  // The shim compiles Metal source only (no metallib); the embedded source is used.
  KernelLibrary(const char* op, const char* source, const unsigned char*, unsigned long)
      : op_(op), source_(source) {}

  Pipeline pipeline(const std::string& kernel) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = functions_.find(kernel);
    if (it != functions_.end()) {
      return it->second;
    }
    if (library_ == nullptr) {
      detail::shim_check(aoti_torch_mps_create_shader_library(source_, &library_),
                         "aoti_torch_mps_create_shader_library",
                         ::opforge::cat("the Metal library of ", op_, " (csrc/metal/", op_,
                                        ".metal; needs macOS 13+ / Metal 3)")
                             .c_str());
    }
    Pipeline function = nullptr;
    detail::shim_check(
        aoti_torch_mps_get_kernel_function(library_, kernel.c_str(), &function),
        "aoti_torch_mps_get_kernel_function",
        ::opforge::cat("kernel ", kernel, " of the ", op_, " Metal library").c_str());
    functions_.emplace(kernel, function);
    return function;
  }

 private:
  const char* op_;
  const char* source_;
  std::mutex mu_;
  AOTIMetalShaderLibraryHandle library_ = nullptr;  // kept for the life of the process
  std::unordered_map<std::string, Pipeline> functions_;
};

// The shim does not expose a pipeline's maxTotalThreadsPerThreadgroup: 0 means "not known",
// and dispatch.h then uses its defaults (256 threads), which torch checks against the
// pipeline's limit on every dispatch ("Threadgroup size exceeds N limit" otherwise).
inline uint32_t max_threads(Pipeline) {
  return 0;
}

template <typename F>
inline void shim_step(Encoder enc, const F& step) {
  if (enc->error) {
    return;  // an earlier step failed: encode nothing more
  }
  try {
    step();
  } catch (...) {
    enc->error = std::current_exception();
  }
}

inline void set_pipeline(Encoder enc, Pipeline function) {
  shim_step(enc, [&] {
    enc->function = function;
    detail::shim_check(aoti_torch_mps_start_encoding(function), "aoti_torch_mps_start_encoding",
                       "a kernel");
  });
}

inline void bind(Encoder enc, const Tensor& t, int index) {
  // the shim binds the tensor's MTLBuffer at its storage offset
  shim_step(enc, [&] {
    detail::shim_check(aoti_torch_mps_set_arg_tensor(enc->function, index, t.get()),
                       "aoti_torch_mps_set_arg_tensor", "a tensor argument");
  });
}

// The parameter struct as bytes (setBytes: no buffer, no copy to the GPU beforehand).
template <typename Params>
inline void bind_params(Encoder enc, const Params& p, int index) {
  static_assert(sizeof(Params) <= 4096, "setBytes takes at most 4 KB");
  shim_step(enc, [&] {
    detail::shim_check(torch_mps_set_arg_bytes(enc->function, index, &p, sizeof(Params)),
                       "torch_mps_set_arg_bytes", "the parameter struct");
  });
}

// The shim dispatches threads (dispatchThreads), not threadgroups: the grid is given in
// threads, a whole number of groups per dimension, so every threadgroup is full and the
// kernels see the threadgroups_per_grid that dispatch.h computed.
inline void dispatch(Encoder enc, const Dispatch& d) {
  shim_step(enc, [&] {
    const uint64_t threads[3] = {d.threads[0], d.threads[1], d.threads[2]};
    const uint64_t grid[3] = {uint64_t{d.groups[0]} * d.threads[0],
                              uint64_t{d.groups[1]} * d.threads[1],
                              uint64_t{d.groups[2]} * d.threads[2]};
    detail::shim_check(
        aoti_torch_mps_dispatch_array_with_group_size(enc->function, grid, 3, threads, 3),
        "aoti_torch_mps_dispatch_array_with_group_size", "a kernel");
  });
}

// Encodes `body` on torch's current MPS stream through the shim's command block (the
// stream's serial queue, as ATen's own Metal kernels do); `first` is a kernel function of
// the block (the shim's command block is entered through one).  Errors inside the block are
// rethrown after it.
template <typename Body>
inline void encode(Pipeline first, Body body) {
  struct Call {
    Body* body;
    ShimEncoder enc;
  } call{&body, {}};
  auto run = [](AOTIMetalKernelFunctionHandle, void* data) {
    auto* c = static_cast<Call*>(data);
    try {
      (*c->body)(&c->enc);
    } catch (...) {
      if (!c->enc.error) {
        c->enc.error = std::current_exception();
      }
    }
  };
  detail::shim_check(aoti_torch_mps_run_command_block(first, run, &call),
                     "aoti_torch_mps_run_command_block", "a kernel");
  if (call.enc.error) {
    std::rethrow_exception(call.enc.error);
  }
}

// ------------------------------------------------------ Metal (Objective-C)
#elif defined(__OBJC__)
using Pipeline = id<MTLComputePipelineState>;
using Encoder = id<MTLComputeCommandEncoder>;

class KernelLibrary {
 public:
  // `metallib` may be null: the source is then compiled at first use.
  KernelLibrary(const char* op, const char* source, const unsigned char* metallib,
                unsigned long metallib_size)
      : op_(op), source_(source), metallib_(metallib), metallib_size_(metallib_size) {}

  Pipeline pipeline(const std::string& kernel) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pipelines_.find(kernel);
    if (it != pipelines_.end())
      return it->second;
    id<MTLLibrary> lib = library_locked();
    id<MTLFunction> fn = [lib newFunctionWithName:[NSString stringWithUTF8String:kernel.c_str()]];
    TORCH_CHECK(fn != nil, "opforge MPS: kernel ", kernel, " is missing from the ", op_,
                " Metal library (csrc/metal/", op_, ".metal)");
    NSError* error = nil;
    Pipeline pso = [device() newComputePipelineStateWithFunction:fn error:&error];
    TORCH_CHECK(pso != nil, "opforge MPS: creating the pipeline for ", kernel,
                " failed: ", error ? error.localizedDescription.UTF8String : "unknown error");
    pipelines_.emplace(kernel, pso);
    return pso;
  }

 private:
  static id<MTLDevice> device() { return at::mps::MPSDevice::getInstance()->device(); }

  id<MTLLibrary> library_locked() {
    if (library_ != nil)
      return library_;
    if (@available(macOS 13.0, *)) {
    } else {
      TORCH_CHECK(false,
                  "opforge MPS kernels need macOS 13 or newer (Metal 3 atomic float adds); "
                  "move the tensors to the CPU on this macOS");
    }
    NSError* error = nil;
    if (metallib_ != nullptr) {
      dispatch_data_t data = dispatch_data_create(metallib_, metallib_size_, nullptr,
                                                  DISPATCH_DATA_DESTRUCTOR_DEFAULT);
      library_ = [device() newLibraryWithData:data error:&error];
    } else {
      MTLCompileOptions* options = [[MTLCompileOptions alloc] init];
      // Metal 3: atomic_float on device memory (macOS 13+, checked above).
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wunguarded-availability-new"
      options.languageVersion = MTLLanguageVersion3_0;
#pragma clang diagnostic pop
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wdeprecated-declarations"
      // IEEE results, as the CPU kernels the tests compare against.
      options.fastMathEnabled = NO;
#pragma clang diagnostic pop
      library_ = [device() newLibraryWithSource:[NSString stringWithUTF8String:source_]
                                        options:options
                                          error:&error];
    }
    TORCH_CHECK(library_ != nil, "opforge MPS: building the Metal library of ", op_,
                " failed (needs macOS 13+ / Metal 3): ",
                error ? error.localizedDescription.UTF8String : "unknown error");
    return library_;
  }

  const char* op_;
  const char* source_;
  const unsigned char* metallib_;
  unsigned long metallib_size_;
  std::mutex mu_;
  id<MTLLibrary> library_ = nil;
  std::unordered_map<std::string, Pipeline> pipelines_;
};

inline uint32_t max_threads(Pipeline pso) {
  return static_cast<uint32_t>(pso.maxTotalThreadsPerThreadgroup);
}

inline void set_pipeline(Encoder enc, Pipeline pso) {
  [enc setComputePipelineState:pso];
}

inline void bind(Encoder enc, const at::Tensor& t, int index) {
  id<MTLBuffer> buffer = __builtin_bit_cast(id<MTLBuffer>, t.storage().data());
  [enc setBuffer:buffer
          offset:static_cast<NSUInteger>(t.storage_offset() * t.element_size())
         atIndex:index];
}

template <typename Params>
inline void bind_params(Encoder enc, const Params& p, int index) {
  [enc setBytes:&p length:sizeof(Params) atIndex:index];
}

inline void dispatch(Encoder enc, const Dispatch& d) {
  [enc dispatchThreadgroups:MTLSizeMake(d.groups[0], d.groups[1], d.groups[2])
      threadsPerThreadgroup:MTLSizeMake(d.threads[0], d.threads[1], d.threads[2])];
}

// Encodes `body` on torch's current MPS stream, the way ATen's own Metal
// kernels do: the stream's serial queue owns its compute encoder.  `body`
// must not throw (do every check before encoding).
template <typename Body>
inline void encode(Pipeline, Body body) {
  at::mps::MPSStream* stream = at::mps::getCurrentMPSStream();
  dispatch_sync(stream->queue(), ^() {
    @autoreleasepool {
      body(stream->commandEncoder());
    }
  });
}

#else  // OPFORGE_MPS_EMULATED: same signatures, kernels run in the CPU emulation.
using Pipeline = const void*;
struct EmulatedEncoder {
  Pipeline pipeline = nullptr;
  void* buffers[32] = {};
  std::list<std::vector<unsigned char> > params;  // stable addresses
};
using Encoder = EmulatedEncoder*;

class KernelLibrary {
 public:
  KernelLibrary(const char* op, const char*, const unsigned char*, unsigned long) : op_(op) {}
  Pipeline pipeline(const std::string& kernel) {
    Pipeline p = opforge_emu_find_kernel(kernel.c_str());
    TORCH_CHECK(p != nullptr, "opforge MPS (emulated): kernel ", kernel, " is missing from ", op_);
    return p;
  }

 private:
  const char* op_;
};
inline uint32_t max_threads(Pipeline) {
  return 1024;
}  // Apple GPUs' limit, and the emulation's
inline void set_pipeline(Encoder enc, Pipeline pso) {
  enc->pipeline = pso;
}
inline void bind(Encoder enc, const at::Tensor& t, int index) {
  enc->buffers[index] = static_cast<char*>(const_cast<void*>(t.storage().data())) +
                        t.storage_offset() * t.element_size();
}
template <typename Params>
inline void bind_params(Encoder enc, const Params& p, int index) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(&p);
  enc->params.emplace_back(bytes, bytes + sizeof(Params));
  enc->buffers[index] = enc->params.back().data();
}
inline void dispatch(Encoder enc, const Dispatch& d) {
  char error[512] = {};
  const int rc =
      opforge_emu_launch(enc->pipeline, enc->buffers, d.groups, d.threads, error, sizeof(error));
  TORCH_CHECK(rc == 0, "opforge MPS (emulated): ", error);
}
template <typename Body>
inline void encode(Pipeline, Body body) {
  EmulatedEncoder enc;
  body(&enc);
}
#endif

// The op's Metal library, from the header embed.py generates for csrc/metal/<op>.metal
// (#include <opforge_metal/<op>.h> first): its metallib when one was built, else its
// source, compiled at first use.
#define OPFORGE_KERNEL_LIBRARY(op)                                                                 \
  KernelLibrary& op##_library() {                                                                  \
    static KernelLibrary lib(#op, opforge::metal::op##_source, opforge::metal::op##_metallib_data, \
                             opforge::metal::op##_metallib_size);                                  \
    return lib;                                                                                    \
  }

// ---------------------------------------------------------- plain C++ part
// "float" / "half": the suffix of the kernel instantiation for a dtype.
inline const char* metal_type(const Tensor& t, const char* op) {
  if (t.scalar_type() == ScalarType::Float) {
    return "float";
  }
  if (t.scalar_type() == ScalarType::Half) {
    return "half";
  }
  OPFORGE_CHECK(false, op, ": the MPS kernels take float32 or float16 tensors, got ", dtype_name(t),
                "; convert with .float() (float64 does not exist on MPS)");
  return "";
}

// The device type the kernels' tensors live on (CPU tensors in the emulated builds).
#ifdef OPFORGE_MPS_EMULATED
inline constexpr DeviceType kMpsDeviceType = DeviceType::CPU;
#else
inline constexpr DeviceType kMpsDeviceType = DeviceType::MPS;
#endif

inline void check_mps(const char* op, const char* name, const Tensor& t) {
  OPFORGE_CHECK(device_type(t) == kMpsDeviceType, op, ": ", name, " must be an ",
                device_type_name(kMpsDeviceType, true), " tensor, got ", device_name(t));
}

// Fails unless the pipeline allows `needed` threads per threadgroup (when its limit is known).
inline void check_threads(const char* op, Pipeline pso, uint32_t needed) {
  const uint32_t limit = max_threads(pso);
  OPFORGE_CHECK(limit == 0 || limit >= needed, op, ": the GPU allows only ", limit,
                " threads per threadgroup; the kernel needs ", needed);
}

namespace detail {
template <typename T>
inline T on_cpu(const T& v) {
  return v;
}
inline Tensor on_cpu(const Tensor& t) {
  return to_cpu(t);
}
}  // namespace detail

// Runs the op's CPU kernel through the dispatcher (boxed, so it does not depend on the C++
// signature other files declare) and returns its first N outputs on `like`'s device.
template <size_t N, typename... Args>
std::array<Tensor, N> call_cpu(const Tensor& like, const char* qualified_name,
                               const Args&... args) {
  std::array<Tensor, N> out = call_op<N>(qualified_name, detail::on_cpu(args)...);
  for (auto& t : out) {
    t = to_device_of(t, like);
  }
  return out;
}

// Validates rois (batch index, finite coordinates) before a kernel reads input through them.
inline void check_rois_on_device(const char* op, const Tensor& rois, int64_t batch_size) {
  if (rois.size(0) == 0) {
    return;
  }
#ifdef OPFORGE_STABLE_ABI
  // One read back either way (the legacy check syncs on its 1-byte result too); the rois are
  // a few KB, and the shim has no isfinite/all to reduce them on the device.
  const Tensor host = as_contiguous(to_dtype(to_cpu(rois), ScalarType::Double));
  check_rois_values(op, static_cast<const double*>(host.const_data_ptr()), host.size(0),
                    batch_size);
#else
  // On the device with one 1-byte read back; only on failure are they copied to the host
  // to name the offending row.
  const at::Tensor b = rois.select(1, 0);
  const bool ok =
      (b.ge(0) & b.lt(batch_size) & at::isfinite(rois.narrow(1, 1, 4)).all(1)).all().item<bool>();
  if (ok) {
    return;
  }
  const at::Tensor host = rois.to(at::kCPU, at::kDouble).contiguous();
  check_rois_values(op, host.data_ptr<double>(), host.size(0), batch_size);
#endif
}

}  // namespace opforge::mps
