// roi_pool forward (output, int32 argmax) and backward on MPS
// (csrc/metal/roi_pool.metal).  float16 backward accumulates in float32.
#include <opforge_metal/roi_pool.h>
#include <torch/library.h>

#include "common.h"
#include "metal/roi_pool.h"
#include "mps/metal_host.h"

namespace opforge::mps {
namespace {

OPFORGE_KERNEL_LIBRARY(roi_pool)

OpfRoiPoolParams make_params(int64_t total, int64_t channels, int64_t height, int64_t width,
                             int64_t pooled_height, int64_t pooled_width, double spatial_scale) {
  OpfRoiPoolParams p{};
  p.total = total;
  p.channels = channels;
  p.height = height;
  p.width = width;
  p.pooled_height = pooled_height;
  p.pooled_width = pooled_width;
  p.spatial_scale = static_cast<float>(spatial_scale);
  return p;
}

std::tuple<at::Tensor, at::Tensor> roi_pool_forward_mps(const at::Tensor& input,
                                                        const at::Tensor& rois,
                                                        double spatial_scale, int64_t pooled_height,
                                                        int64_t pooled_width) {
  check_roi_inputs("roi_pool", input, rois, pooled_height, pooled_width);
  check_mps("roi_pool", "input", input);
  const char* type = metal_type(input, "roi_pool");
  const int64_t num_rois = rois.size(0);
  const int64_t channels = input.size(1);
  const int64_t height = input.size(2);
  const int64_t width = input.size(3);
  const int64_t total = metal::roi_work_items(num_rois, channels, pooled_height, pooled_width);
  at::Tensor output = at::empty({num_rois, channels, pooled_height, pooled_width}, input.options());
  at::Tensor argmax =
      at::empty({num_rois, channels, pooled_height, pooled_width}, input.options().dtype(at::kInt));
  if (total == 0)
    return {output, argmax};
  if (metal::route_to_cpu(metal::kRoiPoolCrossover, total)) {
    auto out =
        call_cpu("opforge::roi_pool", {input, rois, spatial_scale, pooled_height, pooled_width});
    return {to_device(out[0], input.device()), to_device(out[1], input.device())};
  }
  check_rois_on_device("roi_pool", rois, input.size(0));

  const at::Tensor input_ = input.contiguous();
  const at::Tensor rois_ = rois.contiguous();
  const OpfRoiPoolParams p =
      make_params(total, channels, height, width, pooled_height, pooled_width, spatial_scale);
  Pipeline pso = roi_pool_library().pipeline(std::string("roi_pool_forward_") + type);
  const Dispatch d = metal::dispatch_1d(static_cast<uint64_t>(total), max_threads(pso));
  encode([&](Encoder enc) {
    set_pipeline(enc, pso);
    bind(enc, input_, OPF_ROI_POOL_FWD_BUF_INPUT);
    bind(enc, rois_, OPF_ROI_POOL_FWD_BUF_ROIS);
    bind(enc, output, OPF_ROI_POOL_FWD_BUF_OUTPUT);
    bind(enc, argmax, OPF_ROI_POOL_FWD_BUF_ARGMAX);
    bind_params(enc, p, OPF_ROI_POOL_FWD_BUF_PARAMS);
    dispatch(enc, d);
  });
  return {output, argmax};
}

at::Tensor roi_pool_backward_mps(const at::Tensor& grad, const at::Tensor& rois,
                                 const at::Tensor& argmax, double spatial_scale,
                                 int64_t pooled_height, int64_t pooled_width, int64_t batch_size,
                                 int64_t channels, int64_t height, int64_t width) {
  check_roi_backward_inputs("_roi_pool_backward", grad, rois, pooled_height, pooled_width,
                            batch_size, channels, height, width);
  check_mps("_roi_pool_backward", "grad", grad);
  check_int32_like_grad("_roi_pool_backward", "argmax", argmax, grad);
  const char* type = metal_type(grad, "_roi_pool_backward");
  const int64_t total = grad.numel();
  at::Tensor grad_input =
      at::zeros({batch_size, channels, height, width}, grad.options().dtype(at::kFloat));
  if (total == 0)
    return grad_input.to(grad.scalar_type());
  if (metal::route_to_cpu(metal::kRoiPoolCrossover, total)) {
    auto out = call_cpu("opforge::_roi_pool_backward",
                        {grad, rois, argmax, spatial_scale, pooled_height, pooled_width, batch_size,
                         channels, height, width});
    return to_device(out[0], grad.device());
  }

  const at::Tensor rois_ = rois.contiguous();
  const at::Tensor argmax_ = argmax.contiguous();
  OpfRoiPoolParams p =
      make_params(total, channels, height, width, pooled_height, pooled_width, spatial_scale);
  p.grad_stride_n = grad.stride(0);
  p.grad_stride_c = grad.stride(1);
  p.grad_stride_h = grad.stride(2);
  p.grad_stride_w = grad.stride(3);
  Pipeline pso = roi_pool_library().pipeline(std::string("roi_pool_backward_") + type);
  const Dispatch d = metal::dispatch_1d(static_cast<uint64_t>(total), max_threads(pso));
  encode([&](Encoder enc) {
    set_pipeline(enc, pso);
    bind(enc, grad, OPF_ROI_POOL_BWD_BUF_GRAD);
    bind(enc, rois_, OPF_ROI_POOL_BWD_BUF_ROIS);
    bind(enc, argmax_, OPF_ROI_POOL_BWD_BUF_ARGMAX);
    bind(enc, grad_input, OPF_ROI_POOL_BWD_BUF_GRAD_INPUT);
    bind_params(enc, p, OPF_ROI_POOL_BWD_BUF_PARAMS);
    dispatch(enc, d);
  });
  return grad.scalar_type() == at::kFloat ? grad_input : grad_input.to(grad.scalar_type());
}

}  // namespace

// TORCH_LIBRARY_IMPL(opforge, MPS, m); see metal_host.h
OPFORGE_MPS_LIBRARY_IMPL(m) {
  m.impl("roi_pool", TORCH_FN(roi_pool_forward_mps));
  m.impl("_roi_pool_backward", TORCH_FN(roi_pool_backward_mps));
}

}  // namespace opforge::mps
