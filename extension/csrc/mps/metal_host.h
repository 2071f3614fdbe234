// Host-side helpers shared by csrc/mps/<op>_kernel.mm: one Metal library per
// op, compiled (or loaded from an embedded metallib) at first use, cached
// pipeline states, tensor -> MTLBuffer binding, encoding on torch's current
// MPS stream, and the CPU route for small problems (dispatch.h).
//
// All Objective-C lives in this header; the <op>_kernel.mm files are plain
// C++ over Pipeline/Encoder handles.  That lets tests/test_metal_emu.py build
// them on Linux with OPFORGE_MPS_EMULATED: the same host code then registers
// under opforge_emu::* on the CPU key and runs the kernels in the CPU
// emulation of tests/metal_emu (a test-only build, never shipped).
//
// Works with and without -fobjc-arc: objects created here are cached for the
// life of the process and never released.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <cmath>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "metal/dispatch.h"

#if defined(__OBJC__)
#import <Foundation/Foundation.h>
#import <Metal/Metal.h>

#include <ATen/mps/MPSDevice.h>
#include <ATen/mps/MPSStream.h>
#define OPFORGE_MPS_LIBRARY_IMPL(m) TORCH_LIBRARY_IMPL(opforge, MPS, m)
#elif defined(OPFORGE_MPS_EMULATED)
#include <torch/library.h>

#include <list>
#define OPFORGE_MPS_LIBRARY_IMPL(m) TORCH_LIBRARY_IMPL(opforge_emu, CPU, m)
// Provided by the emulation runtime tests/metal_emu builds next to this code.
extern "C" const void* opforge_emu_find_kernel(const char* name);
extern "C" int opforge_emu_launch(const void* kernel, void** buffers, const unsigned* groups,
                                  const unsigned* threads, char* error, unsigned long error_size);
#else
#error "csrc/mps/*.mm are Objective-C++ (built with -ObjC++ on macOS by FORCE_MPS=1)"
#endif

namespace opforge::mps {

using opforge::metal::Dispatch;

// ------------------------------------------------------ Metal (Objective-C)
#if defined(__OBJC__)
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
inline void encode(Body body) {
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
inline void encode(Body body) {
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
inline const char* metal_type(const at::Tensor& t, const char* op) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return "float";
    case at::kHalf:
      return "half";
    default:
      TORCH_CHECK(false, op, ": the MPS kernels take float32 or float16 tensors, got ",
                  t.scalar_type(), "; convert with .float() (float64 does not exist on MPS)");
  }
  return "";
}

// The device type the kernels' tensors live on (CPU tensors in the emulated build).
#ifdef OPFORGE_MPS_EMULATED
inline constexpr c10::DeviceType kMpsDeviceType = c10::DeviceType::CPU;
#else
inline constexpr c10::DeviceType kMpsDeviceType = c10::DeviceType::MPS;
#endif

inline void check_mps(const char* op, const char* name, const at::Tensor& t) {
#ifdef OPFORGE_MPS_EMULATED
  (void)op, (void)name, (void)t;  // the emulated build runs on CPU tensors
#else
  TORCH_CHECK(t.is_mps(), op, ": ", name, " must be an MPS tensor, got ", t.device());
#endif
}

// Runs the op's CPU kernel through the dispatcher (boxed, so it does not
// depend on the C++ signature other files declare) and returns its outputs.
inline std::vector<c10::IValue> call_cpu(const char* qualified_name,
                                         std::vector<c10::IValue> args) {
  const auto op = c10::Dispatcher::singleton().findSchemaOrThrow(qualified_name, "");
  for (auto& a : args) {
    if (a.isTensor() && a.toTensor().defined())
      a = a.toTensor().cpu();
  }
  torch::jit::Stack stack(args.begin(), args.end());
  op.callBoxed(&stack);
  return std::vector<c10::IValue>(stack.begin(), stack.end());
}

inline at::Tensor to_device(const c10::IValue& v, const at::Device& device) {
  return v.toTensor().to(device);
}

// Validates rois on the device with one 1-byte read back; only on failure are
// they copied to the host to name the offending row.
inline void check_rois_on_device(const char* op, const at::Tensor& rois, int64_t batch_size) {
  if (rois.size(0) == 0)
    return;
  const at::Tensor b = rois.select(1, 0);
  const bool ok =
      (b.ge(0) & b.lt(batch_size) & at::isfinite(rois.narrow(1, 1, 4)).all(1)).all().item<bool>();
  if (ok)
    return;
  const at::Tensor host = rois.to(at::kCPU, at::kDouble).contiguous();
  const double* r = host.data_ptr<double>();
  for (int64_t n = 0; n < host.size(0); ++n) {
    TORCH_CHECK(r[n * 5] >= 0 && r[n * 5] < static_cast<double>(batch_size), op, ": rois[", n,
                ", 0] = ", r[n * 5], " is not a batch index of input (batch size ", batch_size,
                ")");
    for (int k = 1; k < 5; ++k) {
      TORCH_CHECK(std::isfinite(r[n * 5 + k]), op, ": rois[", n, ", ", k, "] = ", r[n * 5 + k],
                  " is not finite");
    }
  }
}

}  // namespace opforge::mps
