#include "segment_cpu.h"

torch::Tensor segment_sum_cpu(torch::Tensor src, torch::Tensor ptr) {
  TORCH_CHECK(ptr.dim() == 1, "ptr must be 1-D");
  TORCH_CHECK(ptr.scalar_type() == at::kLong, "ptr must be int64");
  auto sizes = src.sizes().vec();
  sizes[0] = std::max<int64_t>(ptr.numel() - 1, 0);
  auto out = torch::zeros(sizes, src.options());
  auto p = ptr.accessor<int64_t, 1>();
  for (int64_t i = 0; i + 1 < ptr.numel(); i++) {
    if (p[i + 1] > p[i]) out[i] = src.slice(0, p[i], p[i + 1]).sum(0);
  }
  return out;
}
