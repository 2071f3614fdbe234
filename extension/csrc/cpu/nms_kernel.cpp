// Greedy NMS on the CPU. Boxes are gathered into score order as four
// contiguous coordinate arrays so the inner suppression loop streams memory.

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "../common.h"
#include "iou_threshold.h"

namespace opforge::cpu {
namespace {

template <typename scalar_t>
Tensor nms_impl(const Tensor& dets, const Tensor& scores, double iou_threshold) {
  using acc_t = opmath_t<scalar_t>;
  const int64_t n = dets.size(0);
  // Score order, stable so that equal scores keep their input order; NaN scores sort
  // first, as torch.sort(descending=True) puts them.
  const Tensor scores_c = as_contiguous(scores);
  const scalar_t* s = scores_c.const_data_ptr<scalar_t>();
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), int64_t(0));
  std::stable_sort(order.begin(), order.end(), [s](int64_t a, int64_t b) {
    const acc_t sa = static_cast<acc_t>(s[a]), sb = static_cast<acc_t>(s[b]);
    return (std::isnan(sa) && !std::isnan(sb)) || sa > sb;
  });
  const int64_t* order_p = order.data();
  const Tensor boxes = as_contiguous(dets);
  const scalar_t* b = boxes.mutable_data_ptr<scalar_t>();

  std::vector<acc_t> x1(n), y1(n), x2(n), y2(n), area(n);
  for (int64_t i = 0; i < n; ++i) {
    const scalar_t* box = b + order_p[i] * 4;
    x1[i] = static_cast<acc_t>(box[0]);
    y1[i] = static_cast<acc_t>(box[1]);
    x2[i] = static_cast<acc_t>(box[2]);
    y2[i] = static_cast<acc_t>(box[3]);
    area[i] = (x2[i] - x1[i]) * (y2[i] - y1[i]);
  }

  const acc_t threshold = threshold_at_or_below<acc_t>(iou_threshold);
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
  Tensor result = alloc_empty(dets, {static_cast<int64_t>(keep.size())}, ScalarType::Long);
  std::copy(keep.begin(), keep.end(), result.mutable_data_ptr<int64_t>());
  return result;
}

Tensor nms_kernel(const Tensor& dets, const Tensor& scores, double iou_threshold) {
  check_nms_inputs(dets, scores);
  if (dets.size(0) == 0) {
    return alloc_empty(dets, {0}, ScalarType::Long);
  }
  Tensor result;
  OPFORGE_DISPATCH_FLOATING_TYPES(dets.scalar_type(), "opforge_nms_cpu", [&] {
    result = nms_impl<scalar_t>(dets, scores, iou_threshold);
  });
  return result;
}

}  // namespace

OPFORGE_LIBRARY_IMPL(CPU, m) {
  m.impl("nms", OPFORGE_KERNEL(nms_kernel));
}

}  // namespace opforge::cpu
