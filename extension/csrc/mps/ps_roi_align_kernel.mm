// ps_roi_align forward (output, int32 channel_mapping) and backward on MPS
// (csrc/metal/ps_roi_align.metal, contract in csrc/metal/ps_roi_align.h).
// float16 backward accumulates in float32 and is cast back.
#include <opforge_metal/ps_roi_align.h>
#include <torch/library.h>

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

std::tuple<at::Tensor, at::Tensor> ps_roi_align_forward_mps(
    const at::Tensor& input, const at::Tensor& rois, double spatial_scale, int64_t pooled_height,
    int64_t pooled_width, int64_t sampling_ratio) {
  constexpr const char* op = "ps_roi_align";
  check_ps_roi_inputs(op, input, rois, pooled_height, pooled_width);
  check_sampling_ratio(op, sampling_ratio, pooled_height, pooled_width);
  check_mps(op, "input", input);
  const char* type = metal_type(input, op);
  const int64_t channels_out = input.size(1) / (pooled_height * pooled_width);
  at::Tensor output =
      at::empty({rois.size(0), channels_out, pooled_height, pooled_width}, input.options());
  at::Tensor mapping = at::empty(output.sizes(), input.options().dtype(at::kInt));
  const int64_t total = output.numel();
  if (total == 0)
    return {output, mapping};
  if (metal::route_to_cpu(metal::kPsRoiAlignCrossover, total)) {
    auto out = call_cpu("opforge::ps_roi_align",
                        {input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio});
    return {to_device(out[0], input.device()), to_device(out[1], input.device())};
  }
  check_rois_on_device(op, rois, input.size(0));

  const at::Tensor input_ = input.contiguous();
  const at::Tensor rois_ = rois.contiguous();
  const OpfPsRoiAlignParams p =
      make_params(total, input.size(1), channels_out, input.size(2), input.size(3), pooled_height,
                  pooled_width, sampling_ratio, spatial_scale);
  Pipeline pso = ps_roi_align_library().pipeline(std::string("ps_roi_align_forward_") + type);
  const Dispatch d = metal::dispatch_1d(static_cast<uint64_t>(total), max_threads(pso));
  encode([&](Encoder enc) {
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

at::Tensor ps_roi_align_backward_mps(const at::Tensor& grad, const at::Tensor& rois,
                                     const at::Tensor& channel_mapping, double spatial_scale,
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
  at::Tensor grad_input =
      at::zeros({batch_size, channels, height, width}, grad.options().dtype(at::kFloat));
  if (total == 0 || grad_input.numel() == 0)
    return grad_input.to(grad.scalar_type());
  if (metal::route_to_cpu(metal::kPsRoiAlignCrossover, total)) {
    auto out = call_cpu("opforge::_ps_roi_align_backward",
                        {grad, rois, channel_mapping, spatial_scale, pooled_height, pooled_width,
                         sampling_ratio, batch_size, channels, height, width});
    return to_device(out[0], grad.device());
  }
  check_rois_on_device(op, rois, batch_size);

  const at::Tensor grad_ = grad.contiguous();
  const at::Tensor rois_ = rois.contiguous();
  const at::Tensor mapping_ = channel_mapping.contiguous();
  const OpfPsRoiAlignParams p =
      make_params(total, channels, grad.size(1), height, width, pooled_height, pooled_width,
                  sampling_ratio, spatial_scale);
  Pipeline pso = ps_roi_align_library().pipeline(std::string("ps_roi_align_backward_") + type);
  const Dispatch d = metal::dispatch_1d(static_cast<uint64_t>(total), max_threads(pso));
  encode([&](Encoder enc) {
    set_pipeline(enc, pso);
    bind(enc, grad_, OPF_PS_ROI_ALIGN_BWD_BUF_GRAD);
    bind(enc, rois_, OPF_PS_ROI_ALIGN_BWD_BUF_ROIS);
    bind(enc, mapping_, OPF_PS_ROI_ALIGN_BWD_BUF_MAPPING);
    bind(enc, grad_input, OPF_PS_ROI_ALIGN_BWD_BUF_GRAD_INPUT);
    bind_params(enc, p, OPF_PS_ROI_ALIGN_BWD_BUF_PARAMS);
    dispatch(enc, d);
  });
  return grad.scalar_type() == at::kFloat ? grad_input : grad_input.to(grad.scalar_type());
}

}  // namespace

// TORCH_LIBRARY_IMPL(opforge, MPS, m); see metal_host.h
OPFORGE_MPS_LIBRARY_IMPL(m) {
  m.impl("ps_roi_align", TORCH_FN(ps_roi_align_forward_mps));
  m.impl("_ps_roi_align_backward", TORCH_FN(ps_roi_align_backward_mps));
}

}  // namespace opforge::mps
