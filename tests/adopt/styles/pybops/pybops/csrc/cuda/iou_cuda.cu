#include <torch/extension.h>

__global__ void iou_kernel(const float* a, const float* b, float* out, int64_t n, int64_t m) {
  int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (k >= n * m) return;
  const float* p = a + (k / m) * 4;
  const float* q = b + (k % m) * 4;
  float w = fmaxf(fminf(p[2], q[2]) - fmaxf(p[0], q[0]), 0.f);
  float h = fmaxf(fminf(p[3], q[3]) - fmaxf(p[1], q[1]), 0.f);
  float inter = w * h;
  float uni = (p[2] - p[0]) * (p[3] - p[1]) + (q[2] - q[0]) * (q[3] - q[1]) - inter;
  out[k] = inter / fmaxf(uni, 1e-9f);
}

at::Tensor pairwise_iou_cuda(const at::Tensor& boxes1, const at::Tensor& boxes2) {
  TORCH_CHECK(boxes1.is_cuda() && boxes2.is_cuda(), "pairwise_iou_cuda: CUDA tensors");
  TORCH_CHECK(boxes1.dim() == 2 && boxes1.size(1) == 4, "boxes1 must be [N, 4]");
  auto a = boxes1.contiguous().to(at::kFloat), b = boxes2.contiguous().to(at::kFloat);
  auto out = at::empty({a.size(0), b.size(0)}, a.options());
  int64_t total = a.size(0) * b.size(0);
  if (total > 0)
    iou_kernel<<<(total + 255) / 256, 256>>>(a.data_ptr<float>(), b.data_ptr<float>(),
                                             out.data_ptr<float>(), a.size(0), b.size(0));
  return out.to(boxes1.scalar_type());
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("pairwise_iou", &pairwise_iou_cuda, "IoU of every pair of boxes (CUDA)");
}
