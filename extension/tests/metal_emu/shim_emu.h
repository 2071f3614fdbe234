// An emulated MPS C shim: the aoti_torch_mps_* functions (torch/csrc/inductor/aoti_torch/c/
// shim_mps.h) and torch_mps_set_arg_bytes (torch/csrc/stable/c/shim.h, torch 2.14) that the
// stable-ABI host code csrc/mps/<op>_kernel.cpp calls, implemented on the CPU emulation of the
// .metal kernels (emu_runtime.h).  harness.build_shim_host_library() links it with that host
// code, built exactly as the stable MPS wheel builds it (TORCH_STABLE_ONLY, USE_MPS) except
// for OPFORGE_MPS_EMULATED, which registers the kernels under opforge_shim_emu on the CPU key.
//
// It follows torch's implementation where the host code depends on it and is stricter where
// a real GPU would silently misbehave:
//   * a shader library records its source; a kernel function is looked up by name in the
//     emulated kernels and must belong to that source (a kernel asked of another op's library
//     fails, as newFunctionWithName would);
//   * arguments are bound only between start_encoding and dispatch, inside a command block,
//     and start_encoding forgets earlier bindings, so a buffer the host forgot to bind fails
//     the dispatch instead of reading a stale one;
//   * dispatch is dispatchThreads(grid, group): the group must not exceed 1024 threads (torch
//     checks the pipeline's limit) and, since the kernels index by threadgroup, the grid must be
//     a whole number of groups per dimension (non-uniform threadgroups are not emulated);
//   * set_arg_bytes takes at most 4 KB (setBytes' limit).
// Errors return AOTI_TORCH_FAILURE and print the reason on stderr.
#pragma once

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/inductor/aoti_torch/c/shim_mps.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <list>
#include <string>
#include <vector>

extern "C" const void* opforge_emu_find_kernel(const char* name);
extern "C" int opforge_emu_launch(const void* kernel, void** buffers, const unsigned* groups,
                                  const unsigned* threads, char* error, unsigned long error_size);

struct AOTIMetalShaderLibraryOpaque {
  std::string source;
};

struct AOTIMetalKernelFunctionOpaque {
  std::string name;
  const void* entry = nullptr;
  bool encoding = false;
  void* buffers[32] = {};
  std::list<std::vector<unsigned char>> bytes;  // stable addresses for the values bound
};

namespace opforge_shim_emu {
inline thread_local bool in_command_block = false;

inline AOTITorchError fail(const std::string& why) {
  std::fprintf(stderr, "emulated MPS shim: %s\n", why.c_str());
  return AOTI_TORCH_FAILURE;
}

inline AOTITorchError check_binding(AOTIMetalKernelFunctionHandle func, unsigned idx,
                                    const char* call) {
  if (func == nullptr) {
    return fail(std::string(call) + ": null kernel function");
  }
  if (!in_command_block || !func->encoding) {
    return fail(std::string(call) + " on " + func->name +
                " outside aoti_torch_mps_run_command_block + aoti_torch_mps_start_encoding");
  }
  if (idx >= 32) {
    return fail(std::string(call) + ": buffer index " + std::to_string(idx) + " >= 32");
  }
  return AOTI_TORCH_SUCCESS;
}

inline AOTITorchError bind_bytes(AOTIMetalKernelFunctionHandle func, unsigned idx,
                                 const void* ptr, uint64_t size) {
  const auto* p = static_cast<const unsigned char*>(ptr);
  func->bytes.emplace_back(p, p + size);
  func->buffers[idx] = func->bytes.back().data();
  return AOTI_TORCH_SUCCESS;
}

inline AOTITorchError dispatch(AOTIMetalKernelFunctionHandle func, const uint64_t* length,
                               size_t length_size, const uint64_t* group, size_t group_size) {
  if (AOTITorchError rc = check_binding(func, 0, "dispatch"); rc != AOTI_TORCH_SUCCESS) {
    return rc;
  }
  if (length_size == 0 || length_size > 3 || group_size != length_size) {
    return fail("dispatch of " + func->name + ": size and group size need 1-3 dimensions each");
  }
  unsigned groups[3] = {1, 1, 1};
  unsigned threads[3] = {1, 1, 1};
  uint64_t per_group = 1;
  for (size_t d = 0; d < length_size; ++d) {
    if (group[d] == 0 || length[d] % group[d] != 0) {
      return fail("dispatch of " + func->name + ": grid size " + std::to_string(length[d]) +
                  " is not a whole number of threadgroups of " + std::to_string(group[d]) +
                  " in dimension " + std::to_string(d) +
                  " (non-uniform threadgroups are not emulated)");
    }
    threads[d] = static_cast<unsigned>(group[d]);
    groups[d] = static_cast<unsigned>(length[d] / group[d]);
    per_group *= group[d];
  }
  if (per_group > 1024) {
    return fail("dispatch of " + func->name + ": threadgroup size " + std::to_string(per_group) +
                " exceeds the 1024 limit");
  }
  char error[512] = {};
  if (opforge_emu_launch(func->entry, func->buffers, groups, threads, error, sizeof(error)) != 0) {
    return fail(error);
  }
  return AOTI_TORCH_SUCCESS;
}
}  // namespace opforge_shim_emu

extern "C" {

AOTITorchError aoti_torch_mps_create_shader_library(const char* metal_shader_source,
                                                    AOTIMetalShaderLibraryHandle* library_handle) {
  if (metal_shader_source == nullptr || *metal_shader_source == '\0') {
    return opforge_shim_emu::fail("create_shader_library: empty source");
  }
  *library_handle = new AOTIMetalShaderLibraryOpaque{metal_shader_source};
  return AOTI_TORCH_SUCCESS;
}

AOTITorchError aoti_torch_mps_delete_shader_library(AOTIMetalShaderLibraryHandle library_handle) {
  delete library_handle;
  return AOTI_TORCH_SUCCESS;
}

AOTITorchError aoti_torch_mps_get_kernel_function(AOTIMetalShaderLibraryHandle library_handle,
                                                  const char* kernel_name,
                                                  AOTIMetalKernelFunctionHandle* function_handle) {
  const std::string name = kernel_name;
  // The kernels are instantiated per type by a macro (<family>_##T): the family must be in
  // this library's source.
  std::string family = name;
  for (const char* suffix : {"_float", "_half"}) {
    const size_t n = std::strlen(suffix);
    if (family.size() > n && family.compare(family.size() - n, n, suffix) == 0) {
      family.resize(family.size() - n);
      break;
    }
  }
  const void* entry = opforge_emu_find_kernel(kernel_name);
  if (entry == nullptr || library_handle->source.find(family) == std::string::npos) {
    return opforge_shim_emu::fail("get_kernel_function: the library has no kernel " + name);
  }
  // Owned by the emulation for the life of the process (the host caches one per name).
  static std::list<AOTIMetalKernelFunctionOpaque> functions;
  functions.push_back(AOTIMetalKernelFunctionOpaque{name, entry});
  *function_handle = &functions.back();
  return AOTI_TORCH_SUCCESS;
}

AOTITorchError aoti_torch_mps_start_encoding(AOTIMetalKernelFunctionHandle func) {
  if (!opforge_shim_emu::in_command_block) {
    return opforge_shim_emu::fail("start_encoding outside aoti_torch_mps_run_command_block");
  }
  func->encoding = true;
  std::fill(std::begin(func->buffers), std::end(func->buffers), nullptr);
  func->bytes.clear();
  return AOTI_TORCH_SUCCESS;
}

AOTITorchError aoti_torch_mps_set_arg_tensor(AOTIMetalKernelFunctionHandle func, unsigned idx,
                                             AtenTensorHandle tensor) {
  if (AOTITorchError rc = opforge_shim_emu::check_binding(func, idx, "set_arg_tensor");
      rc != AOTI_TORCH_SUCCESS) {
    return rc;
  }
  int32_t device = -1;
  void* data = nullptr;  // includes the storage offset, as the shim's setBuffer:offset: does
  if (aoti_torch_get_device_type(tensor, &device) != AOTI_TORCH_SUCCESS ||
      device != aoti_torch_device_type_cpu() ||
      aoti_torch_get_data_ptr(tensor, &data) != AOTI_TORCH_SUCCESS) {
    return opforge_shim_emu::fail("set_arg_tensor: the emulation takes CPU tensors");
  }
  func->buffers[idx] = data;
  return AOTI_TORCH_SUCCESS;
}

AOTITorchError aoti_torch_mps_set_arg_int(AOTIMetalKernelFunctionHandle func, unsigned idx,
                                          int64_t val) {
  if (AOTITorchError rc = opforge_shim_emu::check_binding(func, idx, "set_arg_int");
      rc != AOTI_TORCH_SUCCESS) {
    return rc;
  }
  return opforge_shim_emu::bind_bytes(func, idx, &val, sizeof(val));
}

AOTITorchError torch_mps_set_arg_bytes(AOTIMetalKernelFunctionHandle func, unsigned idx,
                                       const void* ptr, uint64_t size) {
  if (AOTITorchError rc = opforge_shim_emu::check_binding(func, idx, "set_arg_bytes");
      rc != AOTI_TORCH_SUCCESS) {
    return rc;
  }
  if (size > 4096) {
    return opforge_shim_emu::fail("set_arg_bytes: " + std::to_string(size) +
                                  " bytes; setBytes takes at most 4096");
  }
  return opforge_shim_emu::bind_bytes(func, idx, ptr, size);
}

AOTITorchError aoti_torch_mps_dispatch_single_with_group_size(AOTIMetalKernelFunctionHandle func,
                                                              uint64_t length,
                                                              uint64_t group_size) {
  return opforge_shim_emu::dispatch(func, &length, 1, &group_size, 1);
}

AOTITorchError aoti_torch_mps_dispatch_array_with_group_size(AOTIMetalKernelFunctionHandle func,
                                                             const uint64_t* length,
                                                             size_t length_size,
                                                             const uint64_t* group_size,
                                                             size_t group_size_size) {
  return opforge_shim_emu::dispatch(func, length, length_size, group_size, group_size_size);
}

AOTITorchError aoti_torch_mps_run_command_block(AOTIMetalKernelFunctionHandle func,
                                                aoti_torch_mps_command_block_callback_t callback,
                                                void* user_data) {
  if (opforge_shim_emu::in_command_block) {
    return opforge_shim_emu::fail("run_command_block inside another command block");
  }
  opforge_shim_emu::in_command_block = true;
  AOTITorchError rc = AOTI_TORCH_SUCCESS;
  try {
    callback(func, user_data);
  } catch (const std::exception& e) {
    rc = opforge_shim_emu::fail(std::string("exception in a command block: ") + e.what());
  } catch (...) {
    rc = opforge_shim_emu::fail("exception in a command block");
  }
  opforge_shim_emu::in_command_block = false;
  return rc;
}

}  // extern "C"
