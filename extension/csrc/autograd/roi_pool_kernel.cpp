// roi_pool's Autograd kernel: the gradient flows to the input only; argmax is an index output
// (not differentiable) that the backward reads.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "../ops/roi_pool.h"
#include "first_order.h"

namespace opforge::autograd {
namespace {

class RoIPoolBackwardFunction : public torch::autograd::Function<RoIPoolBackwardFunction> {
 public:
  static at::Tensor forward(AutogradContext* /*ctx*/, const at::Tensor& grad,
                            const at::Tensor& rois, const at::Tensor& argmax, double spatial_scale,
                            c10::SymInt pooled_height, c10::SymInt pooled_width,
                            c10::SymInt batch_size, c10::SymInt channels, c10::SymInt height,
                            c10::SymInt width) {
    at::AutoDispatchBelowADInplaceOrView below;
    return ops::_roi_pool_backward(grad, rois, argmax, spatial_scale, std::move(pooled_height),
                                   std::move(pooled_width), std::move(batch_size),
                                   std::move(channels), std::move(height), std::move(width));
  }

  static variable_list backward(AutogradContext* /*ctx*/, const variable_list& /*grads*/) {
    forbid_double_backward("opforge::_roi_pool_backward", "roi_pool");
  }
};

class RoIPoolFunction : public torch::autograd::Function<RoIPoolFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& input,
                               const at::Tensor& rois, double spatial_scale,
                               c10::SymInt pooled_height, c10::SymInt pooled_width) {
    ctx->saved_data["spatial_scale"] = spatial_scale;
    ctx->saved_data["pooled_height"] = pooled_height;
    ctx->saved_data["pooled_width"] = pooled_width;
    ctx->saved_data["input_shape"] = input.sym_sizes();
    at::AutoDispatchBelowADInplaceOrView below;
    auto [output, argmax] = ops::roi_pool(input, rois, spatial_scale, std::move(pooled_height),
                                          std::move(pooled_width));
    ctx->save_for_backward({rois, argmax});
    ctx->mark_non_differentiable({argmax});
    // no zero-filled gradient for argmax (an output-sized fill per backward)
    ctx->set_materialize_grads(false);
    return {output, argmax};
  }

  static variable_list backward(AutogradContext* ctx, const variable_list& grads) {
    if (!grads[0].defined()) {  // not materialized: nothing reached the output
      return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    }
    const auto saved = ctx->get_saved_variables();
    const auto shape = ctx->saved_data["input_shape"].toSymIntVector();
    auto grad_input = RoIPoolBackwardFunction::apply(
        grads[0], saved[0], saved[1], ctx->saved_data["spatial_scale"].toDouble(),
        saved_symint(ctx, "pooled_height"), saved_symint(ctx, "pooled_width"), shape[0], shape[1],
        shape[2], shape[3]);
    return {grad_input, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

std::tuple<at::Tensor, at::Tensor> roi_pool_autograd(const at::Tensor& input,
                                                     const at::Tensor& rois, double spatial_scale,
                                                     c10::SymInt pooled_height,
                                                     c10::SymInt pooled_width) {
  auto result = RoIPoolFunction::apply(input, rois, spatial_scale, std::move(pooled_height),
                                       std::move(pooled_width));
  return {result[0], result[1]};
}

at::Tensor roi_pool_backward_autograd(const at::Tensor& grad, const at::Tensor& rois,
                                      const at::Tensor& argmax, double spatial_scale,
                                      c10::SymInt pooled_height, c10::SymInt pooled_width,
                                      c10::SymInt batch_size, c10::SymInt channels,
                                      c10::SymInt height, c10::SymInt width) {
  return RoIPoolBackwardFunction::apply(grad, rois, argmax, spatial_scale, std::move(pooled_height),
                                        std::move(pooled_width), std::move(batch_size),
                                        std::move(channels), std::move(height), std::move(width));
}

}  // namespace

TORCH_LIBRARY_IMPL(opforge, Autograd, m) {
  m.impl("roi_pool", TORCH_FN(roi_pool_autograd));
  m.impl("_roi_pool_backward", TORCH_FN(roi_pool_backward_autograd));
}

}  // namespace opforge::autograd
