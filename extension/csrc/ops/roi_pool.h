#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/SymInt.h>

#include <tuple>

namespace opforge::ops {

// Returns (output, argmax); argmax is int32, -1 where a bin is empty.
std::tuple<at::Tensor, at::Tensor> roi_pool(const at::Tensor& input, const at::Tensor& rois,
                                            double spatial_scale, c10::SymInt pooled_height,
                                            c10::SymInt pooled_width);

at::Tensor _roi_pool_backward(const at::Tensor& grad, const at::Tensor& rois,
                              const at::Tensor& argmax, double spatial_scale,
                              c10::SymInt pooled_height, c10::SymInt pooled_width,
                              c10::SymInt batch_size, c10::SymInt channels, c10::SymInt height,
                              c10::SymInt width);

}  // namespace opforge::ops
