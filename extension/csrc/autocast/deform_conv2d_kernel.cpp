#include "../ops/deform_conv2d.h"
#include "autocast.h"

namespace opforge::autocast {
namespace {

// Runs in float32 (float64 stays float64) and returns the input's dtype.
template <c10::DispatchKey key, c10::DeviceType device>
at::Tensor deform_conv2d_autocast(const at::Tensor& input, const at::Tensor& weight,
                                  const at::Tensor& offset, const at::Tensor& mask,
                                  const at::Tensor& bias, c10::SymInt stride_h,
                                  c10::SymInt stride_w, c10::SymInt pad_h, c10::SymInt pad_w,
                                  c10::SymInt dilation_h, c10::SymInt dilation_w,
                                  c10::SymInt groups, c10::SymInt offset_groups, bool use_mask) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(key);
  return ops::deform_conv2d(
             to_float<device>(input), to_float<device>(weight), to_float<device>(offset),
             to_float<device>(mask), to_float<device>(bias), std::move(stride_h),
             std::move(stride_w), std::move(pad_h), std::move(pad_w), std::move(dilation_h),
             std::move(dilation_w), std::move(groups), std::move(offset_groups), use_mask)
      .to(input.scalar_type());
}

}  // namespace

OPFORGE_AUTOCAST_IMPL("deform_conv2d", deform_conv2d_autocast)

}  // namespace opforge::autocast
