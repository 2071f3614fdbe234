// roi_pool forward (output, int32 argmax) and backward on MPS
// (csrc/metal/roi_pool.metal).  float16 backward accumulates in float32.
#include <opforge_metal/roi_pool.h>

#include "common.h"
#include "metal/roi_align.h"  // roi_work_items
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

std::tuple<Tensor, Tensor> roi_pool_forward_mps(const Tensor& input, const Tensor& rois,
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
  Tensor output = alloc_empty(input, {num_rois, channels, pooled_height, pooled_width});
  Tensor argmax =
      alloc_empty(input, {num_rois, channels, pooled_height, pooled_width}, ScalarType::Int);
  if (total == 0)
    return {output, argmax};
  if (metal::route_to_cpu(metal::kRoiPoolCrossover, total)) {
    const auto out = call_cpu<2>(input, "opforge::roi_pool", input, rois, spatial_scale,
                                 pooled_height, pooled_width);
    return {out[0], out[1]};
  }
  check_rois_on_device("roi_pool", rois, input.size(0));

  const Tensor input_ = as_contiguous(input);
  const Tensor rois_ = as_contiguous(rois);
  const OpfRoiPoolParams p =
      make_params(total, channels, height, width, pooled_height, pooled_width, spatial_scale);
  Pipeline pso = roi_pool_library().pipeline(std::string("roi_pool_forward_") + type);
  const Dispatch d = metal::dispatch_1d(static_cast<uint64_t>(total), max_threads(pso));
  encode(pso, [&](Encoder enc) {
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

Tensor roi_pool_backward_mps(const Tensor& grad, const Tensor& rois, const Tensor& argmax,
                             double spatial_scale, int64_t pooled_height, int64_t pooled_width,
                             int64_t batch_size, int64_t channels, int64_t height, int64_t width) {
  check_roi_backward_inputs("_roi_pool_backward", grad, rois, pooled_height, pooled_width,
                            batch_size, channels, height, width);
  check_mps("_roi_pool_backward", "grad", grad);
  check_int32_like_grad("_roi_pool_backward", "argmax", argmax, grad);
  const char* type = metal_type(grad, "_roi_pool_backward");
  const int64_t total = grad.numel();
  Tensor grad_input = alloc_zeros(grad, {batch_size, channels, height, width}, ScalarType::Float);
  if (total == 0)
    return to_dtype(grad_input, grad.scalar_type());
  if (metal::route_to_cpu(metal::kRoiPoolCrossover, total)) {
    return call_cpu<1>(grad, "opforge::_roi_pool_backward", grad, rois, argmax, spatial_scale,
                       pooled_height, pooled_width, batch_size, channels, height, width)[0];
  }

  const Tensor rois_ = as_contiguous(rois);
  const Tensor argmax_ = as_contiguous(argmax);
  OpfRoiPoolParams p =
      make_params(total, channels, height, width, pooled_height, pooled_width, spatial_scale);
  p.grad_stride_n = grad.stride(0);
  p.grad_stride_c = grad.stride(1);
  p.grad_stride_h = grad.stride(2);
  p.grad_stride_w = grad.stride(3);
  Pipeline pso = roi_pool_library().pipeline(std::string("roi_pool_backward_") + type);
  const Dispatch d = metal::dispatch_1d(static_cast<uint64_t>(total), max_threads(pso));
  encode(pso, [&](Encoder enc) {
    set_pipeline(enc, pso);
    bind(enc, grad, OPF_ROI_POOL_BWD_BUF_GRAD);
    bind(enc, rois_, OPF_ROI_POOL_BWD_BUF_ROIS);
    bind(enc, argmax_, OPF_ROI_POOL_BWD_BUF_ARGMAX);
    bind(enc, grad_input, OPF_ROI_POOL_BWD_BUF_GRAD_INPUT);
    bind_params(enc, p, OPF_ROI_POOL_BWD_BUF_PARAMS);
    dispatch(enc, d);
  });
  return grad.scalar_type() == ScalarType::Float ? grad_input
                                                 : to_dtype(grad_input, grad.scalar_type());
}

}  // namespace

// opforge::<op> on the MPS key; see metal_host.h
OPFORGE_MPS_LIBRARY_IMPL(m) {
  m.impl("roi_pool", OPFORGE_KERNEL(roi_pool_forward_mps));
  m.impl("_roi_pool_backward", OPFORGE_KERNEL(roi_pool_backward_mps));
}

}  // namespace opforge::mps
