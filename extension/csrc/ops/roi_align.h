#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/SymInt.h>

namespace opforge::ops {

at::Tensor roi_align(const at::Tensor& input, const at::Tensor& rois, double spatial_scale,
                     c10::SymInt pooled_height, c10::SymInt pooled_width, int64_t sampling_ratio,
                     bool aligned);

at::Tensor _roi_align_backward(const at::Tensor& grad, const at::Tensor& rois, double spatial_scale,
                               c10::SymInt pooled_height, c10::SymInt pooled_width,
                               c10::SymInt batch_size, c10::SymInt channels, c10::SymInt height,
                               c10::SymInt width, int64_t sampling_ratio, bool aligned);

}  // namespace opforge::ops
