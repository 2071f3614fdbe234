// The schemas of nms (both ABIs) and, in the legacy build, the dispatcher-calling
// wrappers the C++ autocast kernels use.
#include "../abi.h"

#ifndef OPFORGE_STABLE_ABI
#include "nms.h"
#include <ATen/core/dispatch/Dispatcher.h>

namespace opforge::ops {

at::Tensor nms(const at::Tensor& dets, const at::Tensor& scores, double iou_threshold) {
  static auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("opforge::nms", "").typed<decltype(nms)>();
  return op.call(dets, scores, iou_threshold);
}

}  // namespace opforge::ops
#endif

namespace opforge::ops {

OPFORGE_LIBRARY_FRAGMENT(m) {
  m.def("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor");
}

}  // namespace opforge::ops
