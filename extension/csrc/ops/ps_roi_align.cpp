// The schemas of ps_roi_align (both ABIs) and, in the legacy build, the dispatcher-calling
// wrappers the C++ autocast kernels use.
#include "../abi.h"

#ifndef OPFORGE_STABLE_ABI
#include "ps_roi_align.h"
#include <ATen/core/dispatch/Dispatcher.h>

namespace opforge::ops {

std::tuple<at::Tensor, at::Tensor> ps_roi_align(const at::Tensor& input, const at::Tensor& rois,
                                                double spatial_scale, c10::SymInt pooled_height,
                                                c10::SymInt pooled_width, int64_t sampling_ratio) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("opforge::ps_roi_align", "")
                       .typed<decltype(ps_roi_align)>();
  return op.call(input, rois, spatial_scale, std::move(pooled_height), std::move(pooled_width),
                 sampling_ratio);
}

at::Tensor _ps_roi_align_backward(const at::Tensor& grad, const at::Tensor& rois,
                                  const at::Tensor& channel_mapping, double spatial_scale,
                                  c10::SymInt pooled_height, c10::SymInt pooled_width,
                                  int64_t sampling_ratio, c10::SymInt batch_size,
                                  c10::SymInt channels, c10::SymInt height, c10::SymInt width) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("opforge::_ps_roi_align_backward", "")
                       .typed<decltype(_ps_roi_align_backward)>();
  return op.call(grad, rois, channel_mapping, spatial_scale, std::move(pooled_height),
                 std::move(pooled_width), sampling_ratio, std::move(batch_size),
                 std::move(channels), std::move(height), std::move(width));
}

}  // namespace opforge::ops
#endif

namespace opforge::ops {

OPFORGE_LIBRARY_FRAGMENT(m) {
  m.def(
      "ps_roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
      "SymInt pooled_width, int sampling_ratio) -> (Tensor, Tensor)");
  m.def(
      "_ps_roi_align_backward(Tensor grad, Tensor rois, Tensor channel_mapping, "
      "float spatial_scale, SymInt pooled_height, SymInt pooled_width, int sampling_ratio, "
      "SymInt batch_size, SymInt channels, SymInt height, SymInt width) -> Tensor");
}

}  // namespace opforge::ops
