// ps_roi_align forward (output, int32 channel_mapping) and backward on MPS
// (csrc/metal/ps_roi_align.metal, contract in csrc/metal/ps_roi_align.h).
// float16 backward accumulates in float32 and is cast back.
#include <opforge_metal/ps_roi_align.h>

#include "common.h"
#include "metal/ps_roi_align.h"
#include "mps/metal_host.h"

namespace opforge::mps {
namespace {

OPFORGE_KERNEL_LIBRARY(ps_roi_align)

OpfPsRoiAlignParams make_params(int64_t total, int64_t channels, int64_t channels_out,
                                int64_t height, int64_t width, int64_t pooled_height,
                                int64_t pooled_width, int64_t sampling_ratio,
                                double spatial_scale) {
  OpfPsRoiAlignParams p{};
  p.total = total;
  p.channels = channels;
  p.channels_out = channels_out;
  p.height = height;
  p.width = width;
  p.pooled_height = pooled_height;
  p.pooled_width = pooled_width;
  p.sampling_ratio = sampling_ratio;
  p.spatial_scale = static_cast<float>(spatial_scale);
  return p;
}

std::tuple<Tensor, Tensor> ps_roi_align_forward_mps(const Tensor& input, const Tensor& rois,
                                                    double spatial_scale, int64_t pooled_height,
                                                    int64_t pooled_width, int64_t sampling_ratio) {
  constexpr const char* op = "ps_roi_align";
  check_ps_roi_inputs(op, input, rois, pooled_height, pooled_width);
  check_sampling_ratio(op, sampling_ratio, pooled_height, pooled_width);
  check_mps(op, "input", input);
  const char* type = metal_type(input, op);
  const int64_t channels_out = input.size(1) / (pooled_height * pooled_width);
  Tensor output = alloc_empty(input, {rois.size(0), channels_out, pooled_height, pooled_width});
  Tensor mapping = alloc_empty(input, sizes_of(output), ScalarType::Int);
  const int64_t total = output.numel();
  if (total == 0)
    return {output, mapping};
  if (metal::route_to_cpu(metal::kPsRoiAlignCrossover, total)) {
    const auto out = call_cpu<2>(input, "opforge::ps_roi_align", input, rois, spatial_scale,
                                 pooled_height, pooled_width, sampling_ratio);
    return {out[0], out[1]};
  }
  check_rois_on_device(op, rois, input.size(0));

  const Tensor input_ = as_contiguous(input);
  const Tensor rois_ = as_contiguous(rois);
  const OpfPsRoiAlignParams p =
      make_params(total, input.size(1), channels_out, input.size(2), input.size(3), pooled_height,
                  pooled_width, sampling_ratio, spatial_scale);
  Pipeline pso = ps_roi_align_library().pipeline(std::string("ps_roi_align_forward_") + type);
  const Dispatch d = metal::dispatch_1d(static_cast<uint64_t>(total), max_threads(pso));
  encode(pso, [&](Encoder enc) {
    set_pipeline(enc, pso);
    bind(enc, input_, OPF_PS_ROI_ALIGN_FWD_BUF_INPUT);
    bind(enc, rois_, OPF_PS_ROI_ALIGN_FWD_BUF_ROIS);
    bind(enc, output, OPF_PS_ROI_ALIGN_FWD_BUF_OUTPUT);
    bind(enc, mapping, OPF_PS_ROI_ALIGN_FWD_BUF_MAPPING);
    bind_params(enc, p, OPF_PS_ROI_ALIGN_FWD_BUF_PARAMS);
    dispatch(enc, d);
  });
  return {output, mapping};
}

Tensor ps_roi_align_backward_mps(const Tensor& grad, const Tensor& rois,
                                 const Tensor& channel_mapping, double spatial_scale,
                                 int64_t pooled_height, int64_t pooled_width,
                                 int64_t sampling_ratio, int64_t batch_size, int64_t channels,
                                 int64_t height, int64_t width) {
  constexpr const char* op = "_ps_roi_align_backward";
  check_ps_roi_backward_inputs(op, grad, rois, channel_mapping, pooled_height, pooled_width,
                               batch_size, channels, height, width);
  check_sampling_ratio(op, sampling_ratio, pooled_height, pooled_width);
  check_mps(op, "grad", grad);
  const char* type = metal_type(grad, op);
  const int64_t total = grad.numel();
  Tensor grad_input = alloc_zeros(grad, {batch_size, channels, height, width}, ScalarType::Float);
  if (total == 0 || grad_input.numel() == 0)
    return to_dtype(grad_input, grad.scalar_type());
  if (metal::route_to_cpu(metal::kPsRoiAlignCrossover, total)) {
    return call_cpu<1>(grad, "opforge::_ps_roi_align_backward", grad, rois, channel_mapping,
                       spatial_scale, pooled_height, pooled_width, sampling_ratio, batch_size,
                       channels, height, width)[0];
  }
  check_rois_on_device(op, rois, batch_size);

  const Tensor grad_ = as_contiguous(grad);
  const Tensor rois_ = as_contiguous(rois);
  const Tensor mapping_ = as_contiguous(channel_mapping);
  const OpfPsRoiAlignParams p =
      make_params(total, channels, grad.size(1), height, width, pooled_height, pooled_width,
                  sampling_ratio, spatial_scale);
  Pipeline pso = ps_roi_align_library().pipeline(std::string("ps_roi_align_backward_") + type);
  const Dispatch d = metal::dispatch_1d(static_cast<uint64_t>(total), max_threads(pso));
  encode(pso, [&](Encoder enc) {
    set_pipeline(enc, pso);
    bind(enc, grad_, OPF_PS_ROI_ALIGN_BWD_BUF_GRAD);
    bind(enc, rois_, OPF_PS_ROI_ALIGN_BWD_BUF_ROIS);
    bind(enc, mapping_, OPF_PS_ROI_ALIGN_BWD_BUF_MAPPING);
    bind(enc, grad_input, OPF_PS_ROI_ALIGN_BWD_BUF_GRAD_INPUT);
    bind_params(enc, p, OPF_PS_ROI_ALIGN_BWD_BUF_PARAMS);
    dispatch(enc, d);
  });
  return grad.scalar_type() == ScalarType::Float ? grad_input
                                                 : to_dtype(grad_input, grad.scalar_type());
}

}  // namespace

// opforge::<op> on the MPS key; see metal_host.h
OPFORGE_MPS_LIBRARY_IMPL(m) {
  m.impl("ps_roi_align", OPFORGE_KERNEL(ps_roi_align_forward_mps));
  m.impl("_ps_roi_align_backward", OPFORGE_KERNEL(ps_roi_align_backward_mps));
}

}  // namespace opforge::mps
