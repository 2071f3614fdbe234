// What the host code of a device backend (csrc/cuda, csrc/mps) needs from abi.h's world
// besides the core names: a copy on the CPU, reading one value back, a stable descending sort,
// index_select and an in-place add. Written once per ABI: the stable block on the C shim, the
// legacy block on ATen. A CPU kernel never includes this header.
//
//   to_cpu(t)                         t on the CPU (no copy when it is there already)
//   item_int64(t)                     the value of a one-element int64 tensor on any device
//   argsort_descending_stable(t)      indices sorting a 1-D tensor descending, ties in order
//   index_selected(t, dim, index)     t.index_select(dim, index)
//   add_into(dst, src)                dst += src (src broadcast to dst)
#pragma once

#include <optional>
#include <tuple>

#include "abi.h"

namespace opforge {

#ifdef OPFORGE_STABLE_ABI

inline Tensor to_cpu(const Tensor& t) {
  return detail::shim_call([&] {
    return device_type(t) == DeviceType::CPU
               ? t
               : torch::stable::to(t, torch::stable::Device(DeviceType::CPU));
  });
}

inline int64_t item_int64(const Tensor& t) {
  const Tensor host = to_cpu(t);
  return *static_cast<const int64_t*>(host.const_data_ptr());
}

inline Tensor argsort_descending_stable(const Tensor& t) {
  namespace sd = torch::stable::detail;
  return detail::shim_call([&] {
    StableIValue stack[4] = {sd::from(t), sd::from(std::optional<bool>(true)), sd::from(int64_t{0}),
                             sd::from(true)};
    STABLE_TORCH_ERROR_CODE_CHECK(
        torch_call_dispatcher("aten::sort", "stable", stack, TORCH_ABI_VERSION));
    (void)sd::to<Tensor>(stack[0]);  // the sorted values: released
    return sd::to<Tensor>(stack[1]);
  });
}

inline Tensor index_selected(const Tensor& t, int64_t dim, const Tensor& index) {
  return detail::shim_call(
      [&] { return detail::call_aten("aten::index_select", "", t, dim, index); });
}

inline void add_into(const Tensor& dst, const Tensor& src) {
  // subtract(a, b, alpha = -1) is a + b: the shim's one add that takes its Scalar as a double.
  copy_into(dst, detail::shim_call([&] { return torch::stable::subtract(dst, src, -1.0); }));
}

#else  // the legacy ABI: ATen

inline Tensor to_cpu(const Tensor& t) {
  return t.cpu();
}

inline int64_t item_int64(const Tensor& t) {
  return t.item<int64_t>();
}

inline Tensor argsort_descending_stable(const Tensor& t) {
  return std::get<1>(t.sort(/*stable=*/true, /*dim=*/0, /*descending=*/true));
}

inline Tensor index_selected(const Tensor& t, int64_t dim, const Tensor& index) {
  return t.index_select(dim, index);
}

inline void add_into(const Tensor& dst, const Tensor& src) {
  const_cast<Tensor&>(dst).add_(src);
}

#endif  // OPFORGE_STABLE_ABI

}  // namespace opforge
