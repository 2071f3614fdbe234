// The Autograd kernels of a pooling op whose second output is an index the backward reads
// (roi_pool's argmax, ps_roi_pool's channel_mapping): both ops have the same schema
// (input, rois, spatial_scale, pooled_height, pooled_width) -> (output, index), and their
// backward ops take (grad, rois, index, spatial_scale, pooled sizes, input sizes). The
// gradient flows to the input only; the index is not differentiable.
//
// `Op` names the pair:
//   struct RoIPool {
//     static constexpr const char* name = "roi_pool";                        // for errors
//     static constexpr const char* backward_name = "opforge::_roi_pool_backward";
//     static constexpr auto forward = &ops::roi_pool;
//     static constexpr auto backward = &ops::_roi_pool_backward;
//   };
// and a file registers IndexPool<Op>::forward_kernel / backward_kernel for Autograd.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <tuple>
#include <utility>

#include "first_order.h"

namespace opforge::autograd {

template <typename Op>
struct IndexPool {
  class BackwardFunction : public torch::autograd::Function<BackwardFunction> {
   public:
    static at::Tensor forward(AutogradContext* /*ctx*/, const at::Tensor& grad,
                              const at::Tensor& rois, const at::Tensor& index, double spatial_scale,
                              c10::SymInt pooled_height, c10::SymInt pooled_width,
                              c10::SymInt batch_size, c10::SymInt channels, c10::SymInt height,
                              c10::SymInt width) {
      at::AutoDispatchBelowADInplaceOrView below;
      return Op::backward(grad, rois, index, spatial_scale, std::move(pooled_height),
                          std::move(pooled_width), std::move(batch_size), std::move(channels),
                          std::move(height), std::move(width));
    }

    static variable_list backward(AutogradContext* /*ctx*/, const variable_list& /*grads*/) {
      forbid_double_backward(Op::backward_name, Op::name);
    }
  };

  class Function : public torch::autograd::Function<Function> {
   public:
    static variable_list forward(AutogradContext* ctx, const at::Tensor& input,
                                 const at::Tensor& rois, double spatial_scale,
                                 c10::SymInt pooled_height, c10::SymInt pooled_width) {
      ctx->saved_data["spatial_scale"] = spatial_scale;
      ctx->saved_data["pooled_height"] = pooled_height;
      ctx->saved_data["pooled_width"] = pooled_width;
      ctx->saved_data["input_shape"] = input.sym_sizes();
      at::AutoDispatchBelowADInplaceOrView below;
      auto [output, index] = Op::forward(input, rois, spatial_scale, std::move(pooled_height),
                                         std::move(pooled_width));
      ctx->save_for_backward({rois, index});
      ctx->mark_non_differentiable({index});
      // no zero-filled gradient for the index (an output-sized fill per backward)
      ctx->set_materialize_grads(false);
      return {output, index};
    }

    static variable_list backward(AutogradContext* ctx, const variable_list& grads) {
      if (!grads[0].defined()) {  // not materialized: nothing reached the output
        return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
      }
      const auto saved = ctx->get_saved_variables();
      const auto shape = ctx->saved_data["input_shape"].toSymIntVector();
      auto grad_input = BackwardFunction::apply(
          grads[0], saved[0], saved[1], ctx->saved_data["spatial_scale"].toDouble(),
          saved_symint(ctx, "pooled_height"), saved_symint(ctx, "pooled_width"), shape[0], shape[1],
          shape[2], shape[3]);
      return {grad_input, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    }
  };

  static std::tuple<at::Tensor, at::Tensor> forward_kernel(const at::Tensor& input,
                                                           const at::Tensor& rois,
                                                           double spatial_scale,
                                                           c10::SymInt pooled_height,
                                                           c10::SymInt pooled_width) {
    auto result = Function::apply(input, rois, spatial_scale, std::move(pooled_height),
                                  std::move(pooled_width));
    return {result[0], result[1]};
  }

  static at::Tensor backward_kernel(const at::Tensor& grad, const at::Tensor& rois,
                                    const at::Tensor& index, double spatial_scale,
                                    c10::SymInt pooled_height, c10::SymInt pooled_width,
                                    c10::SymInt batch_size, c10::SymInt channels,
                                    c10::SymInt height, c10::SymInt width) {
    return BackwardFunction::apply(grad, rois, index, spatial_scale, std::move(pooled_height),
                                   std::move(pooled_width), std::move(batch_size),
                                   std::move(channels), std::move(height), std::move(width));
  }
};

}  // namespace opforge::autograd
