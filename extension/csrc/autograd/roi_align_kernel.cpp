// roi_align's Autograd kernel: the gradient flows to the input only (rois are coordinates).
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "../ops/roi_align.h"
#include "first_order.h"

namespace opforge::autograd {
namespace {

class RoIAlignBackwardFunction : public torch::autograd::Function<RoIAlignBackwardFunction> {
 public:
  static at::Tensor forward(AutogradContext* /*ctx*/, const at::Tensor& grad,
                            const at::Tensor& rois, double spatial_scale, c10::SymInt pooled_height,
                            c10::SymInt pooled_width, c10::SymInt batch_size, c10::SymInt channels,
                            c10::SymInt height, c10::SymInt width, int64_t sampling_ratio,
                            bool aligned) {
    at::AutoDispatchBelowADInplaceOrView below;
    return ops::_roi_align_backward(grad, rois, spatial_scale, std::move(pooled_height),
                                    std::move(pooled_width), std::move(batch_size),
                                    std::move(channels), std::move(height), std::move(width),
                                    sampling_ratio, aligned);
  }

  static variable_list backward(AutogradContext* /*ctx*/, const variable_list& /*grads*/) {
    forbid_double_backward("opforge::_roi_align_backward", "roi_align");
  }
};

class RoIAlignFunction : public torch::autograd::Function<RoIAlignFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& rois,
                            double spatial_scale, c10::SymInt pooled_height,
                            c10::SymInt pooled_width, int64_t sampling_ratio, bool aligned) {
    ctx->save_for_backward({rois});
    ctx->saved_data["spatial_scale"] = spatial_scale;
    ctx->saved_data["pooled_height"] = pooled_height;
    ctx->saved_data["pooled_width"] = pooled_width;
    ctx->saved_data["sampling_ratio"] = sampling_ratio;
    ctx->saved_data["aligned"] = aligned;
    ctx->saved_data["input_shape"] = input.sym_sizes();
    at::AutoDispatchBelowADInplaceOrView below;
    return ops::roi_align(input, rois, spatial_scale, std::move(pooled_height),
                          std::move(pooled_width), sampling_ratio, aligned);
  }

  static variable_list backward(AutogradContext* ctx, const variable_list& grads) {
    const auto rois = ctx->get_saved_variables()[0];
    const auto shape = ctx->saved_data["input_shape"].toSymIntVector();
    auto grad_input = RoIAlignBackwardFunction::apply(
        grads[0], rois, ctx->saved_data["spatial_scale"].toDouble(),
        saved_symint(ctx, "pooled_height"), saved_symint(ctx, "pooled_width"), shape[0], shape[1],
        shape[2], shape[3], ctx->saved_data["sampling_ratio"].toInt(),
        ctx->saved_data["aligned"].toBool());
    return {grad_input,   at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor roi_align_autograd(const at::Tensor& input, const at::Tensor& rois, double spatial_scale,
                              c10::SymInt pooled_height, c10::SymInt pooled_width,
                              int64_t sampling_ratio, bool aligned) {
  return RoIAlignFunction::apply(input, rois, spatial_scale, std::move(pooled_height),
                                 std::move(pooled_width), sampling_ratio, aligned);
}

at::Tensor roi_align_backward_autograd(const at::Tensor& grad, const at::Tensor& rois,
                                       double spatial_scale, c10::SymInt pooled_height,
                                       c10::SymInt pooled_width, c10::SymInt batch_size,
                                       c10::SymInt channels, c10::SymInt height, c10::SymInt width,
                                       int64_t sampling_ratio, bool aligned) {
  return RoIAlignBackwardFunction::apply(grad, rois, spatial_scale, std::move(pooled_height),
                                         std::move(pooled_width), std::move(batch_size),
                                         std::move(channels), std::move(height), std::move(width),
                                         sampling_ratio, aligned);
}

}  // namespace

TORCH_LIBRARY_IMPL(opforge, Autograd, m) {
  m.impl("roi_align", TORCH_FN(roi_align_autograd));
  m.impl("_roi_align_backward", TORCH_FN(roi_align_backward_autograd));
}

}  // namespace opforge::autograd
