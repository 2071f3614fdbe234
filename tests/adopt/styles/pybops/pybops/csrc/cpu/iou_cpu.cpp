#include "../iou.h"

at::Tensor pairwise_iou_cpu(const at::Tensor& boxes1, const at::Tensor& boxes2) {
  TORCH_CHECK(boxes1.dim() == 2 && boxes1.size(1) == 4, "boxes1 must be [N, 4]");
  TORCH_CHECK(boxes2.dim() == 2 && boxes2.size(1) == 4, "boxes2 must be [M, 4]");
  auto a = boxes1.unsqueeze(1), b = boxes2.unsqueeze(0);
  auto lt = at::max(a.narrow(2, 0, 2), b.narrow(2, 0, 2));
  auto rb = at::min(a.narrow(2, 2, 2), b.narrow(2, 2, 2));
  auto wh = (rb - lt).clamp_min(0);
  auto inter = wh.select(2, 0) * wh.select(2, 1);
  auto area = [](const at::Tensor& x) {
    return (x.select(-1, 2) - x.select(-1, 0)) * (x.select(-1, 3) - x.select(-1, 1));
  };
  return inter / (area(a) + area(b) - inter).clamp_min(1e-9);
}

int64_t count_above_cpu(const at::Tensor& scores, double threshold) {
  return (scores > threshold).sum().item<int64_t>();
}
