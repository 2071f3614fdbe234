// ps_roi_align's Autograd kernel: the gradient flows to the input only; channel_mapping is an index
// output (not differentiable) that the backward reads.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "../ops/ps_roi_align.h"
#include "first_order.h"

namespace opforge::autograd {
namespace {

class PSRoIAlignBackwardFunction : public torch::autograd::Function<PSRoIAlignBackwardFunction> {
 public:
  static at::Tensor forward(AutogradContext* /*ctx*/, const at::Tensor& grad,
                            const at::Tensor& rois, const at::Tensor& channel_mapping,
                            double spatial_scale, c10::SymInt pooled_height,
                            c10::SymInt pooled_width, int64_t sampling_ratio,
                            c10::SymInt batch_size, c10::SymInt channels, c10::SymInt height,
                            c10::SymInt width) {
    at::AutoDispatchBelowADInplaceOrView below;
    return ops::_ps_roi_align_backward(grad, rois, channel_mapping, spatial_scale,
                                       std::move(pooled_height), std::move(pooled_width),
                                       sampling_ratio, std::move(batch_size), std::move(channels),
                                       std::move(height), std::move(width));
  }

  static variable_list backward(AutogradContext* /*ctx*/, const variable_list& /*grads*/) {
    forbid_double_backward("opforge::_ps_roi_align_backward", "ps_roi_align");
  }
};

class PSRoIAlignFunction : public torch::autograd::Function<PSRoIAlignFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& input,
                               const at::Tensor& rois, double spatial_scale,
                               c10::SymInt pooled_height, c10::SymInt pooled_width,
                               int64_t sampling_ratio) {
    ctx->saved_data["spatial_scale"] = spatial_scale;
    ctx->saved_data["pooled_height"] = pooled_height;
    ctx->saved_data["pooled_width"] = pooled_width;
    ctx->saved_data["sampling_ratio"] = sampling_ratio;
    ctx->saved_data["input_shape"] = input.sym_sizes();
    at::AutoDispatchBelowADInplaceOrView below;
    auto [output, channel_mapping] =
        ops::ps_roi_align(input, rois, spatial_scale, std::move(pooled_height),
                          std::move(pooled_width), sampling_ratio);
    ctx->save_for_backward({rois, channel_mapping});
    ctx->mark_non_differentiable({channel_mapping});
    // no zero-filled gradient for channel_mapping (an output-sized fill per backward)
    ctx->set_materialize_grads(false);
    return {output, channel_mapping};
  }

  static variable_list backward(AutogradContext* ctx, const variable_list& grads) {
    if (!grads[0].defined()) {  // not materialized: nothing reached the output
      return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    }
    const auto saved = ctx->get_saved_variables();
    const auto shape = ctx->saved_data["input_shape"].toSymIntVector();
    auto grad_input = PSRoIAlignBackwardFunction::apply(
        grads[0], saved[0], saved[1], ctx->saved_data["spatial_scale"].toDouble(),
        saved_symint(ctx, "pooled_height"), saved_symint(ctx, "pooled_width"),
        ctx->saved_data["sampling_ratio"].toInt(), shape[0], shape[1], shape[2], shape[3]);
    return {grad_input, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

std::tuple<at::Tensor, at::Tensor> ps_roi_align_autograd(
    const at::Tensor& input, const at::Tensor& rois, double spatial_scale,
    c10::SymInt pooled_height, c10::SymInt pooled_width, int64_t sampling_ratio) {
  auto result = PSRoIAlignFunction::apply(input, rois, spatial_scale, std::move(pooled_height),
                                          std::move(pooled_width), sampling_ratio);
  return {result[0], result[1]};
}

at::Tensor ps_roi_align_backward_autograd(const at::Tensor& grad, const at::Tensor& rois,
                                          const at::Tensor& channel_mapping, double spatial_scale,
                                          c10::SymInt pooled_height, c10::SymInt pooled_width,
                                          int64_t sampling_ratio, c10::SymInt batch_size,
                                          c10::SymInt channels, c10::SymInt height,
                                          c10::SymInt width) {
  return PSRoIAlignBackwardFunction::apply(
      grad, rois, channel_mapping, spatial_scale, std::move(pooled_height), std::move(pooled_width),
      sampling_ratio, std::move(batch_size), std::move(channels), std::move(height),
      std::move(width));
}

}  // namespace

TORCH_LIBRARY_IMPL(opforge, Autograd, m) {
  m.impl("ps_roi_align", TORCH_FN(ps_roi_align_autograd));
  m.impl("_ps_roi_align_backward", TORCH_FN(ps_roi_align_backward_autograd));
}

}  // namespace opforge::autograd
