// The schemas of roi_align (both ABIs) and, in the legacy build, the dispatcher-calling
// wrappers the C++ autocast kernels use.
#include "../abi.h"

#ifndef OPFORGE_STABLE_ABI
#include "roi_align.h"
#include <ATen/core/dispatch/Dispatcher.h>

namespace opforge::ops {

at::Tensor roi_align(const at::Tensor& input, const at::Tensor& rois, double spatial_scale,
                     c10::SymInt pooled_height, c10::SymInt pooled_width, int64_t sampling_ratio,
                     bool aligned) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("opforge::roi_align", "")
                       .typed<decltype(roi_align)>();
  return op.call(input, rois, spatial_scale, std::move(pooled_height), std::move(pooled_width),
                 sampling_ratio, aligned);
}

at::Tensor _roi_align_backward(const at::Tensor& grad, const at::Tensor& rois, double spatial_scale,
                               c10::SymInt pooled_height, c10::SymInt pooled_width,
                               c10::SymInt batch_size, c10::SymInt channels, c10::SymInt height,
                               c10::SymInt width, int64_t sampling_ratio, bool aligned) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("opforge::_roi_align_backward", "")
                       .typed<decltype(_roi_align_backward)>();
  return op.call(grad, rois, spatial_scale, std::move(pooled_height), std::move(pooled_width),
                 std::move(batch_size), std::move(channels), std::move(height), std::move(width),
                 sampling_ratio, aligned);
}

}  // namespace opforge::ops
#endif

namespace opforge::ops {

OPFORGE_LIBRARY_FRAGMENT(m) {
  m.def(
      "roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
      "SymInt pooled_width, int sampling_ratio, bool aligned) -> Tensor");
  m.def(
      "_roi_align_backward(Tensor grad, Tensor rois, float spatial_scale, "
      "SymInt pooled_height, SymInt pooled_width, SymInt batch_size, SymInt channels, "
      "SymInt height, SymInt width, int sampling_ratio, bool aligned) -> Tensor");
}

}  // namespace opforge::ops
