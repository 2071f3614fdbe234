// A CPU kernel's big input made contiguous on the extension's own threads.
//
// A view whose (N, C, H, W) planes are each dense but not packed together (a channel slice
// x[:, a:b], a batch slice, a non-contiguous stack) is copied plane by plane under
// parallel_for_work, so a call stays on the calling thread when the copy is small and, on a
// busy machine, never waits on a thread that has not run. ATen's contiguous() would run the
// same copy on torch's OpenMP team, whose every parallel region waits for all of its threads:
// with the cores taken by other processes that is a scheduler time slice (milliseconds) for
// a copy of a fraction of one. Any other layout is left to ATen.
#pragma once

#include <cstdint>
#include <cstring>

#include "../abi.h"
#include "parallel_policy.h"

namespace opforge::cpu {

inline Tensor contiguous_planes(const Tensor& t) {
  if (t.is_contiguous()) {
    return t;
  }
  if (t.dim() != 4 || t.stride(3) != 1 || t.stride(2) != t.size(3)) {
    return as_contiguous(t);
  }
  Tensor out = alloc_empty(t, sizes_of(t));
  const int64_t channels = t.size(1);
  const int64_t plane = t.size(2) * t.size(3);
  const auto item = static_cast<int64_t>(t.element_size());
  const int64_t batch_stride = t.stride(0) * item;
  const int64_t channel_stride = t.stride(1) * item;
  const auto* src = static_cast<const char*>(t.data_ptr());
  auto* dst = static_cast<char*>(out.data_ptr());
  const int64_t plane_bytes = plane * item;
  // work units: one per element copied (the policy's unit is about one multiply-add)
  parallel_for_work(t.size(0) * channels, plane, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t n = i / channels;
      const int64_t c = i % channels;
      std::memcpy(dst + i * plane_bytes, src + n * batch_stride + c * channel_stride,
                  static_cast<size_t>(plane_bytes));
    }
  });
  return out;
}

}  // namespace opforge::cpu
