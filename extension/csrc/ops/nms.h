#pragma once

#include <ATen/core/Tensor.h>

namespace opforge::ops {

// Indices of the boxes kept by greedy non-maximum suppression, by decreasing score.
at::Tensor nms(const at::Tensor& dets, const at::Tensor& scores, double iou_threshold);

}  // namespace opforge::ops
