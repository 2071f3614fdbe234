#pragma once
#include <torch/extension.h>

torch::Tensor segment_sum_cuda(torch::Tensor src, torch::Tensor ptr);
