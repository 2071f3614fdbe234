// The emulation runtime the OPFORGE_MPS_EMULATED build of csrc/mps/*_kernel.cpp links
// against (see metal_host.h): kernel lookup by name over the tables of the
// emulated .metal files, and launch.  harness.build_host_library() writes a
// translation unit that defines OPF_EMU_TABLES and includes this file.
#include "metal_shim.h"

// OPF_EMU_TABLES(X) expands X(stem) once per emulated .metal file.
#define OPF_EMU_DECLARE(stem) \
  extern "C" const ::metal_emu::KernelEntry* opforge_emu_kernels_##stem(unsigned long* n);
OPF_EMU_TABLES(OPF_EMU_DECLARE)

extern "C" const void* opforge_emu_find_kernel(const char* name) {
  const ::metal_emu::KernelEntry* found = nullptr;
#define OPF_EMU_SEARCH(stem)                                                        \
  {                                                                                 \
    unsigned long n = 0;                                                            \
    const ::metal_emu::KernelEntry* table = opforge_emu_kernels_##stem(&n);         \
    for (unsigned long i = 0; i < n; ++i)                                           \
      if (std::strcmp(table[i].name, name) == 0) found = &table[i];                 \
  }
  OPF_EMU_TABLES(OPF_EMU_SEARCH)
  return found;
}

extern "C" int opforge_emu_launch(const void* pipeline, void** buffers, const unsigned* groups,
                                  const unsigned* threads, char* error, unsigned long error_size) {
  const auto* entry = static_cast<const ::metal_emu::KernelEntry*>(pipeline);
  for (int index : entry->buffers) {
    if (buffers[index] == nullptr) {
      std::snprintf(error, error_size, "%s reads [[buffer(%d)]] but nothing is bound there",
                    entry->name, index);
      return 1;
    }
  }
  const std::string failure = ::metal_emu::run_grid(
      uint3(groups[0], groups[1], groups[2]), uint3(threads[0], threads[1], threads[2]),
      entry->synchronised,
      [&](const ::metal_emu::ThreadContext& c) { entry->body(buffers, c); });
  if (!failure.empty()) {
    std::snprintf(error, error_size, "%s: %s", entry->name, failure.c_str());
    return 1;
  }
  return 0;
}
