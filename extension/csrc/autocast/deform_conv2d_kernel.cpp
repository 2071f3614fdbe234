#include <torch/library.h>

#include "../ops/deform_conv2d.h"
#include "autocast.h"

namespace opforge::autocast {
namespace {

// Runs in float32 (float64 stays float64) and returns the input's dtype.
template <c10::DispatchKey key, c10::DeviceType device>
at::Tensor deform_conv2d_autocast(
    const at::Tensor& input,
    const at::Tensor& weight,
    const at::Tensor& offset,
    const at::Tensor& mask,
    const at::Tensor& bias,
    c10::SymInt stride_h,
    c10::SymInt stride_w,
    c10::SymInt pad_h,
    c10::SymInt pad_w,
    c10::SymInt dilation_h,
    c10::SymInt dilation_w,
    c10::SymInt groups,
    c10::SymInt offset_groups,
    bool use_mask) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(key);
  return ops::deform_conv2d(
             to_float<device>(input), to_float<device>(weight), to_float<device>(offset),
             to_float<device>(mask), to_float<device>(bias), std::move(stride_h),
             std::move(stride_w), std::move(pad_h), std::move(pad_w), std::move(dilation_h),
             std::move(dilation_w), std::move(groups), std::move(offset_groups), use_mask)
      .to(input.scalar_type());
}

} // namespace

TORCH_LIBRARY_IMPL(opforge, AutocastCPU, m) {
  m.impl(
      "deform_conv2d",
      TORCH_FN((deform_conv2d_autocast<c10::DispatchKey::AutocastCPU, c10::DeviceType::CPU>)));
}

#ifdef WITH_CUDA
TORCH_LIBRARY_IMPL(opforge, AutocastCUDA, m) {
  m.impl(
      "deform_conv2d",
      TORCH_FN((deform_conv2d_autocast<c10::DispatchKey::AutocastCUDA, c10::DeviceType::CUDA>)));
}
#endif

#ifdef WITH_MPS
TORCH_LIBRARY_IMPL(opforge, AutocastMPS, m) {
  m.impl(
      "deform_conv2d",
      TORCH_FN((deform_conv2d_autocast<c10::DispatchKey::AutocastMPS, c10::DeviceType::MPS>)));
}
#endif

} // namespace opforge::autocast
