// The schemas of deform_conv2d (both ABIs) and, in the legacy build, the dispatcher-calling
// wrappers the C++ autocast kernels use.
#include "../abi.h"

#ifndef OPFORGE_STABLE_ABI
#include "deform_conv2d.h"
#include <ATen/core/dispatch/Dispatcher.h>

namespace opforge::ops {

at::Tensor deform_conv2d(const at::Tensor& input, const at::Tensor& weight,
                         const at::Tensor& offset, const at::Tensor& mask, const at::Tensor& bias,
                         c10::SymInt stride_h, c10::SymInt stride_w, c10::SymInt pad_h,
                         c10::SymInt pad_w, c10::SymInt dilation_h, c10::SymInt dilation_w,
                         c10::SymInt groups, c10::SymInt offset_groups, bool use_mask) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("opforge::deform_conv2d", "")
                       .typed<decltype(deform_conv2d)>();
  return op.call(input, weight, offset, mask, bias, std::move(stride_h), std::move(stride_w),
                 std::move(pad_h), std::move(pad_w), std::move(dilation_h), std::move(dilation_w),
                 std::move(groups), std::move(offset_groups), use_mask);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> _deform_conv2d_backward(
    const at::Tensor& grad, const at::Tensor& input, const at::Tensor& weight,
    const at::Tensor& offset, const at::Tensor& mask, const at::Tensor& bias, c10::SymInt stride_h,
    c10::SymInt stride_w, c10::SymInt pad_h, c10::SymInt pad_w, c10::SymInt dilation_h,
    c10::SymInt dilation_w, c10::SymInt groups, c10::SymInt offset_groups, bool use_mask) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("opforge::_deform_conv2d_backward", "")
                       .typed<decltype(_deform_conv2d_backward)>();
  return op.call(grad, input, weight, offset, mask, bias, std::move(stride_h), std::move(stride_w),
                 std::move(pad_h), std::move(pad_w), std::move(dilation_h), std::move(dilation_w),
                 std::move(groups), std::move(offset_groups), use_mask);
}

}  // namespace opforge::ops
#endif

namespace opforge::ops {

OPFORGE_LIBRARY_FRAGMENT(m) {
  m.def(
      "deform_conv2d(Tensor input, Tensor weight, Tensor offset, Tensor mask, Tensor bias, "
      "SymInt stride_h, SymInt stride_w, SymInt pad_h, SymInt pad_w, SymInt dilation_h, "
      "SymInt dilation_w, SymInt groups, SymInt offset_groups, bool use_mask) -> Tensor");
  m.def(
      "_deform_conv2d_backward(Tensor grad, Tensor input, Tensor weight, Tensor offset, "
      "Tensor mask, Tensor bias, SymInt stride_h, SymInt stride_w, SymInt pad_h, SymInt pad_w, "
      "SymInt dilation_h, SymInt dilation_w, SymInt groups, SymInt offset_groups, "
      "bool use_mask) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
}

}  // namespace opforge::ops
