#include <ATen/cuda/CUDAContext.h>

#include "segment_cuda.h"

__global__ void segment_sum_kernel(const float* src, const int64_t* ptr, float* out,
                                   int64_t segments, int64_t width) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i >= segments * width) return;
  int64_t s = i / width, c = i % width;
  float acc = 0;
  for (int64_t r = ptr[s]; r < ptr[s + 1]; r++) acc += src[r * width + c];
  out[i] = acc;
}

torch::Tensor segment_sum_cuda(torch::Tensor src, torch::Tensor ptr) {
  TORCH_CHECK(src.scalar_type() == at::kFloat, "segment_sum_cuda: float32 only");
  auto flat = src.contiguous().view({src.size(0), -1});
  auto segments = std::max<int64_t>(ptr.numel() - 1, 0);
  auto out = torch::zeros({segments, flat.size(1)}, src.options());
  int64_t n = segments * flat.size(1);
  if (n > 0) {
    segment_sum_kernel<<<(n + 255) / 256, 256, 0, at::cuda::getCurrentCUDAStream()>>>(
        flat.data_ptr<float>(), ptr.contiguous().data_ptr<int64_t>(), out.data_ptr<float>(),
        segments, flat.size(1));
  }
  auto sizes = src.sizes().vec();
  sizes[0] = segments;
  return out.view(sizes);
}
