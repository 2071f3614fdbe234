// Greedy NMS on the CPU. Boxes are gathered into score order as four
// contiguous coordinate arrays so the inner suppression loop streams memory.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <torch/library.h>

#include <vector>

#include "../common.h"

namespace opforge::cpu {
namespace {

template <typename scalar_t>
at::Tensor nms_impl(const at::Tensor& dets, const at::Tensor& scores, double iou_threshold) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t n = dets.size(0);
  // Stable so that equal scores keep their input order, as a reader expects.
  const at::Tensor order =
      std::get<1>(scores.sort(/*stable=*/true, /*dim=*/0, /*descending=*/true));
  const int64_t* order_p = order.data_ptr<int64_t>();
  const at::Tensor boxes = dets.contiguous();
  const scalar_t* b = boxes.data_ptr<scalar_t>();

  std::vector<acc_t> x1(n), y1(n), x2(n), y2(n), area(n);
  for (int64_t i = 0; i < n; ++i) {
    const scalar_t* box = b + order_p[i] * 4;
    x1[i] = static_cast<acc_t>(box[0]);
    y1[i] = static_cast<acc_t>(box[1]);
    x2[i] = static_cast<acc_t>(box[2]);
    y2[i] = static_cast<acc_t>(box[3]);
    area[i] = (x2[i] - x1[i]) * (y2[i] - y1[i]);
  }

  const acc_t threshold = static_cast<acc_t>(iou_threshold);
  std::vector<uint8_t> suppressed(n, 0);
  std::vector<int64_t> keep;
  keep.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    if (suppressed[i]) {
      continue;
    }
    keep.push_back(order_p[i]);
    const acc_t ix1 = x1[i], iy1 = y1[i], ix2 = x2[i], iy2 = y2[i], iarea = area[i];
    for (int64_t j = i + 1; j < n; ++j) {
      const acc_t w = std::max(acc_t(0), std::min(ix2, x2[j]) - std::max(ix1, x1[j]));
      const acc_t h = std::max(acc_t(0), std::min(iy2, y2[j]) - std::max(iy1, y1[j]));
      const acc_t inter = w * h;
      const acc_t iou = inter / (iarea + area[j] - inter);
      // A NaN IoU (two zero-area boxes) compares false: the box is kept.
      suppressed[j] |= static_cast<uint8_t>(iou > threshold);
    }
  }
  at::Tensor result =
      at::empty({static_cast<int64_t>(keep.size())}, dets.options().dtype(at::kLong));
  std::copy(keep.begin(), keep.end(), result.data_ptr<int64_t>());
  return result;
}

at::Tensor nms_kernel(const at::Tensor& dets, const at::Tensor& scores, double iou_threshold) {
  check_nms_inputs(dets, scores);
  if (dets.size(0) == 0) {
    return at::empty({0}, dets.options().dtype(at::kLong));
  }
  at::Tensor result;
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, dets.scalar_type(), "opforge_nms_cpu",
      [&] { result = nms_impl<scalar_t>(dets, scores, iou_threshold); });
  return result;
}

}  // namespace

TORCH_LIBRARY_IMPL(opforge, CPU, m) {
  m.impl("nms", TORCH_FN(nms_kernel));
}

}  // namespace opforge::cpu
