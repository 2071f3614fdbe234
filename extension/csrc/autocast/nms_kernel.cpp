#include <torch/library.h>

#include "../ops/nms.h"
#include "autocast.h"

namespace opforge::autocast {
namespace {

template <c10::DispatchKey key, c10::DeviceType device>
at::Tensor nms_autocast(const at::Tensor& dets, const at::Tensor& scores, double iou_threshold) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(key);
  return ops::nms(to_float<device>(dets), to_float<device>(scores), iou_threshold);
}

} // namespace

TORCH_LIBRARY_IMPL(opforge, AutocastCPU, m) {
  m.impl("nms", TORCH_FN((nms_autocast<c10::DispatchKey::AutocastCPU, c10::DeviceType::CPU>)));
}

#ifdef WITH_CUDA
TORCH_LIBRARY_IMPL(opforge, AutocastCUDA, m) {
  m.impl("nms", TORCH_FN((nms_autocast<c10::DispatchKey::AutocastCUDA, c10::DeviceType::CUDA>)));
}
#endif

#ifdef WITH_MPS
TORCH_LIBRARY_IMPL(opforge, AutocastMPS, m) {
  m.impl("nms", TORCH_FN((nms_autocast<c10::DispatchKey::AutocastMPS, c10::DeviceType::MPS>)));
}
#endif

} // namespace opforge::autocast
