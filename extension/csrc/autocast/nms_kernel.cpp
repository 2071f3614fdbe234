#include "../ops/nms.h"
#include "autocast.h"

namespace opforge::autocast {
namespace {

template <c10::DispatchKey key, c10::DeviceType device>
at::Tensor nms_autocast(const at::Tensor& dets, const at::Tensor& scores, double iou_threshold) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(key);
  return ops::nms(to_float<device>(dets), to_float<device>(scores), iou_threshold);
}

}  // namespace

OPFORGE_AUTOCAST_IMPL("nms", nms_autocast)

}  // namespace opforge::autocast
