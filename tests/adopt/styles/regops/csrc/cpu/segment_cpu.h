#pragma once
#include <torch/extension.h>

torch::Tensor segment_sum_cpu(torch::Tensor src, torch::Tensor ptr);
