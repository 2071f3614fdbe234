// roi_align forward and backward on MPS (csrc/metal/roi_align.metal).
// float16 backward accumulates into a float32 buffer (atomic float adds) and
// is cast back, so half gradients are supported rather than refused.
#include <opforge_metal/roi_align.h>

#include "common.h"
#include "metal/roi_align.h"
#include "mps/metal_host.h"

namespace opforge::mps {
namespace {

OPFORGE_KERNEL_LIBRARY(roi_align)

OpfRoiAlignParams make_params(int64_t total, int64_t channels, int64_t height, int64_t width,
                              int64_t pooled_height, int64_t pooled_width, int64_t sampling_ratio,
                              double spatial_scale, bool aligned) {
  OpfRoiAlignParams p{};
  p.total = total;
  p.channels = channels;
  p.height = height;
  p.width = width;
  p.pooled_height = pooled_height;
  p.pooled_width = pooled_width;
  p.sampling_ratio = sampling_ratio;
  p.spatial_scale = static_cast<float>(spatial_scale);
  p.aligned = aligned ? 1 : 0;
  return p;
}

Tensor roi_align_forward_mps(const Tensor& input, const Tensor& rois, double spatial_scale,
                             int64_t pooled_height, int64_t pooled_width, int64_t sampling_ratio,
                             bool aligned) {
  check_roi_inputs("roi_align", input, rois, pooled_height, pooled_width);
  check_sampling_ratio("roi_align", sampling_ratio, pooled_height, pooled_width);
  check_mps("roi_align", "input", input);
  const char* type = metal_type(input, "roi_align");
  const int64_t num_rois = rois.size(0);
  const int64_t channels = input.size(1);
  const int64_t height = input.size(2);
  const int64_t width = input.size(3);
  const int64_t total = metal::roi_work_items(num_rois, channels, pooled_height, pooled_width);
  Tensor output = alloc_empty(input, {num_rois, channels, pooled_height, pooled_width});
  if (total == 0)
    return output;
  if (metal::route_to_cpu(metal::kRoiAlignCrossover, total)) {
    return call_cpu<1>(input, "opforge::roi_align", input, rois, spatial_scale, pooled_height,
                       pooled_width, sampling_ratio, aligned)[0];
  }
  check_rois_on_device("roi_align", rois, input.size(0));

  const Tensor input_ = as_contiguous(input);
  const Tensor rois_ = as_contiguous(rois);
  const OpfRoiAlignParams p = make_params(total, channels, height, width, pooled_height,
                                          pooled_width, sampling_ratio, spatial_scale, aligned);
  Pipeline pso = roi_align_library().pipeline(std::string("roi_align_forward_") + type);
  const Dispatch d = metal::dispatch_1d(static_cast<uint64_t>(total), max_threads(pso));
  encode(pso, [&](Encoder enc) {
    set_pipeline(enc, pso);
    bind(enc, input_, OPF_ROI_ALIGN_FWD_BUF_INPUT);
    bind(enc, rois_, OPF_ROI_ALIGN_FWD_BUF_ROIS);
    bind(enc, output, OPF_ROI_ALIGN_FWD_BUF_OUTPUT);
    bind_params(enc, p, OPF_ROI_ALIGN_FWD_BUF_PARAMS);
    dispatch(enc, d);
  });
  return output;
}

Tensor roi_align_backward_mps(const Tensor& grad, const Tensor& rois, double spatial_scale,
                              int64_t pooled_height, int64_t pooled_width, int64_t batch_size,
                              int64_t channels, int64_t height, int64_t width,
                              int64_t sampling_ratio, bool aligned) {
  check_roi_backward_inputs("_roi_align_backward", grad, rois, pooled_height, pooled_width,
                            batch_size, channels, height, width);
  check_sampling_ratio("_roi_align_backward", sampling_ratio, pooled_height, pooled_width);
  check_mps("_roi_align_backward", "grad", grad);
  const char* type = metal_type(grad, "_roi_align_backward");
  const int64_t total = grad.numel();
  Tensor grad_input = alloc_zeros(grad, {batch_size, channels, height, width}, ScalarType::Float);
  if (total == 0)
    return to_dtype(grad_input, grad.scalar_type());
  if (metal::route_to_cpu(metal::kRoiAlignCrossover, total)) {
    return call_cpu<1>(grad, "opforge::_roi_align_backward", grad, rois, spatial_scale,
                       pooled_height, pooled_width, batch_size, channels, height, width,
                       sampling_ratio, aligned)[0];
  }

  const Tensor rois_ = as_contiguous(rois);
  OpfRoiAlignParams p = make_params(total, channels, height, width, pooled_height, pooled_width,
                                    sampling_ratio, spatial_scale, aligned);
  // grad is read through its strides (autograd often hands an expanded one).
  p.grad_stride_n = grad.stride(0);
  p.grad_stride_c = grad.stride(1);
  p.grad_stride_h = grad.stride(2);
  p.grad_stride_w = grad.stride(3);
  Pipeline pso = roi_align_library().pipeline(std::string("roi_align_backward_") + type);
  const Dispatch d = metal::dispatch_1d(static_cast<uint64_t>(total), max_threads(pso));
  encode(pso, [&](Encoder enc) {
    set_pipeline(enc, pso);
    bind(enc, grad, OPF_ROI_ALIGN_BWD_BUF_GRAD);
    bind(enc, rois_, OPF_ROI_ALIGN_BWD_BUF_ROIS);
    bind(enc, grad_input, OPF_ROI_ALIGN_BWD_BUF_GRAD_INPUT);
    bind_params(enc, p, OPF_ROI_ALIGN_BWD_BUF_PARAMS);
    dispatch(enc, d);
  });
  return grad.scalar_type() == ScalarType::Float ? grad_input
                                                 : to_dtype(grad_input, grad.scalar_type());
}

}  // namespace

// opforge::<op> on the MPS key; see metal_host.h
OPFORGE_MPS_LIBRARY_IMPL(m) {
  m.impl("roi_align", OPFORGE_KERNEL(roi_align_forward_mps));
  m.impl("_roi_align_backward", OPFORGE_KERNEL(roi_align_backward_mps));
}

}  // namespace opforge::mps
