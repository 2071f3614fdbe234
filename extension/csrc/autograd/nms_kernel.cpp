// nms is not differentiable (its output is int64 indices). This Autograd
// kernel lets it run on inputs that require grad without autograd warnings.
#include <ATen/core/Tensor.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include "../ops/nms.h"

namespace opforge::autograd {
namespace {

at::Tensor nms_autograd(const at::Tensor& dets, const at::Tensor& scores, double iou_threshold) {
  c10::impl::ExcludeDispatchKeyGuard no_autograd(c10::autograd_dispatch_keyset);
  return ops::nms(dets, scores, iou_threshold);
}

}  // namespace

TORCH_LIBRARY_IMPL(opforge, Autograd, m) {
  m.impl("nms", TORCH_FN(nms_autograd));
}

}  // namespace opforge::autograd
