// deform_conv2d's Autograd kernel: gradients for input, weight, offset, mask and bias from one
// _deform_conv2d_backward call.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "../ops/deform_conv2d.h"
#include "first_order.h"

namespace opforge::autograd {
namespace {

// stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, groups, offset_groups
using Params = std::vector<c10::SymInt>;

variable_list deform_conv2d_backward_call(const at::Tensor& grad, const at::Tensor& input,
                                          const at::Tensor& weight, const at::Tensor& offset,
                                          const at::Tensor& mask, const at::Tensor& bias,
                                          const Params& p, bool use_mask) {
  auto [grad_input, grad_weight, grad_offset, grad_mask, grad_bias] =
      ops::_deform_conv2d_backward(grad, input, weight, offset, mask, bias, p[0], p[1], p[2], p[3],
                                   p[4], p[5], p[6], p[7], use_mask);
  return {grad_input, grad_weight, grad_offset, grad_mask, grad_bias};
}

class DeformConv2dBackwardFunction
    : public torch::autograd::Function<DeformConv2dBackwardFunction> {
 public:
  static variable_list forward(AutogradContext* /*ctx*/, const at::Tensor& grad,
                               const at::Tensor& input, const at::Tensor& weight,
                               const at::Tensor& offset, const at::Tensor& mask,
                               const at::Tensor& bias, const Params& params, bool use_mask) {
    at::AutoDispatchBelowADInplaceOrView below;
    return deform_conv2d_backward_call(grad, input, weight, offset, mask, bias, params, use_mask);
  }

  static variable_list backward(AutogradContext* /*ctx*/, const variable_list& /*grads*/) {
    forbid_double_backward("opforge::_deform_conv2d_backward", "deform_conv2d");
  }
};

class DeformConv2dFunction : public torch::autograd::Function<DeformConv2dFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& weight,
                            const at::Tensor& offset, const at::Tensor& mask,
                            const at::Tensor& bias, const Params& params, bool use_mask) {
    ctx->save_for_backward({input, weight, offset, mask, bias});
    ctx->saved_data["params"] = c10::SymIntArrayRef(params);
    ctx->saved_data["use_mask"] = use_mask;
    at::AutoDispatchBelowADInplaceOrView below;
    const Params& p = params;
    return ops::deform_conv2d(input, weight, offset, mask, bias, p[0], p[1], p[2], p[3], p[4], p[5],
                              p[6], p[7], use_mask);
  }

  static variable_list backward(AutogradContext* ctx, const variable_list& grads) {
    const auto saved = ctx->get_saved_variables();
    auto result = DeformConv2dBackwardFunction::apply(
        grads[0], saved[0], saved[1], saved[2], saved[3], saved[4],
        ctx->saved_data["params"].toSymIntVector(), ctx->saved_data["use_mask"].toBool());
    // one (undefined) gradient per non-tensor argument: params, use_mask
    result.emplace_back();
    result.emplace_back();
    return result;
  }
};

at::Tensor deform_conv2d_autograd(const at::Tensor& input, const at::Tensor& weight,
                                  const at::Tensor& offset, const at::Tensor& mask,
                                  const at::Tensor& bias, c10::SymInt stride_h,
                                  c10::SymInt stride_w, c10::SymInt pad_h, c10::SymInt pad_w,
                                  c10::SymInt dilation_h, c10::SymInt dilation_w,
                                  c10::SymInt groups, c10::SymInt offset_groups, bool use_mask) {
  return DeformConv2dFunction::apply(
      input, weight, offset, mask, bias,
      Params{std::move(stride_h), std::move(stride_w), std::move(pad_h), std::move(pad_w),
             std::move(dilation_h), std::move(dilation_w), std::move(groups),
             std::move(offset_groups)},
      use_mask);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
deform_conv2d_backward_autograd(const at::Tensor& grad, const at::Tensor& input,
                                const at::Tensor& weight, const at::Tensor& offset,
                                const at::Tensor& mask, const at::Tensor& bias,
                                c10::SymInt stride_h, c10::SymInt stride_w, c10::SymInt pad_h,
                                c10::SymInt pad_w, c10::SymInt dilation_h, c10::SymInt dilation_w,
                                c10::SymInt groups, c10::SymInt offset_groups, bool use_mask) {
  auto result = DeformConv2dBackwardFunction::apply(
      grad, input, weight, offset, mask, bias,
      Params{std::move(stride_h), std::move(stride_w), std::move(pad_h), std::move(pad_w),
             std::move(dilation_h), std::move(dilation_w), std::move(groups),
             std::move(offset_groups)},
      use_mask);
  return {result[0], result[1], result[2], result[3], result[4]};
}

}  // namespace

TORCH_LIBRARY_IMPL(opforge, Autograd, m) {
  m.impl("deform_conv2d", TORCH_FN(deform_conv2d_autograd));
  m.impl("_deform_conv2d_backward", TORCH_FN(deform_conv2d_backward_autograd));
}

}  // namespace opforge::autograd
