#include "nms.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

namespace opforge::ops {

at::Tensor nms(const at::Tensor& dets, const at::Tensor& scores, double iou_threshold) {
  static auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("opforge::nms", "").typed<decltype(nms)>();
  return op.call(dets, scores, iou_threshold);
}

TORCH_LIBRARY_FRAGMENT(opforge, m) {
  m.def("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor");
}

}  // namespace opforge::ops
