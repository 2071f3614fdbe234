#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/SymInt.h>

#include <tuple>

namespace opforge::ops {

// Returns (output, channel_mapping): output[k, c, ph, pw] averages bilinear samples of
// input channel channel_mapping[k, c, ph, pw] = (c * PH + ph) * PW + pw inside bin (ph, pw).
std::tuple<at::Tensor, at::Tensor> ps_roi_align(const at::Tensor& input, const at::Tensor& rois,
                                                double spatial_scale, c10::SymInt pooled_height,
                                                c10::SymInt pooled_width, int64_t sampling_ratio);

at::Tensor _ps_roi_align_backward(const at::Tensor& grad, const at::Tensor& rois,
                                  const at::Tensor& channel_mapping, double spatial_scale,
                                  c10::SymInt pooled_height, c10::SymInt pooled_width,
                                  int64_t sampling_ratio, c10::SymInt batch_size,
                                  c10::SymInt channels, c10::SymInt height, c10::SymInt width);

}  // namespace opforge::ops
