// The schemas of roi_pool (both ABIs) and, in the legacy build, the dispatcher-calling
// wrappers the C++ autocast kernels use.
#include "../abi.h"

#ifndef OPFORGE_STABLE_ABI
#include "roi_pool.h"
#include <ATen/core/dispatch/Dispatcher.h>

namespace opforge::ops {

std::tuple<at::Tensor, at::Tensor> roi_pool(const at::Tensor& input, const at::Tensor& rois,
                                            double spatial_scale, c10::SymInt pooled_height,
                                            c10::SymInt pooled_width) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("opforge::roi_pool", "")
                       .typed<decltype(roi_pool)>();
  return op.call(input, rois, spatial_scale, std::move(pooled_height), std::move(pooled_width));
}

at::Tensor _roi_pool_backward(const at::Tensor& grad, const at::Tensor& rois,
                              const at::Tensor& argmax, double spatial_scale,
                              c10::SymInt pooled_height, c10::SymInt pooled_width,
                              c10::SymInt batch_size, c10::SymInt channels, c10::SymInt height,
                              c10::SymInt width) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("opforge::_roi_pool_backward", "")
                       .typed<decltype(_roi_pool_backward)>();
  return op.call(grad, rois, argmax, spatial_scale, std::move(pooled_height),
                 std::move(pooled_width), std::move(batch_size), std::move(channels),
                 std::move(height), std::move(width));
}

}  // namespace opforge::ops
#endif

namespace opforge::ops {

OPFORGE_LIBRARY_FRAGMENT(m) {
  m.def(
      "roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
      "SymInt pooled_width) -> (Tensor, Tensor)");
  m.def(
      "_roi_pool_backward(Tensor grad, Tensor rois, Tensor argmax, float spatial_scale, "
      "SymInt pooled_height, SymInt pooled_width, SymInt batch_size, SymInt channels, "
      "SymInt height, SymInt width) -> Tensor");
}

}  // namespace opforge::ops
