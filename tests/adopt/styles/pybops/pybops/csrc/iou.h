#pragma once
#include <torch/extension.h>

at::Tensor pairwise_iou_cpu(const at::Tensor& boxes1, const at::Tensor& boxes2);
int64_t count_above_cpu(const at::Tensor& scores, double threshold);
