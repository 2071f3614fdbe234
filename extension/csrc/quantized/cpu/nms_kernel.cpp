// Greedy NMS on quantized boxes and scores (QuantizedCPU: quint8, qint8, qint32).
// It works on the integer representations: IoU does not depend on the scale
// and the zero point cancels in every coordinate difference, and integer
// scores order like the values they quantize. Results equal torchvision's.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "../../common.h"
#include "../../cpu/iou_threshold.h"

namespace opforge::quantized_cpu {
namespace {

template <typename scalar_t>
at::Tensor nms_impl(const at::Tensor& dets, const at::Tensor& scores, double iou_threshold) {
  using int_t = typename scalar_t::underlying;
  const int64_t n = dets.size(0);
  // stable: equal scores keep their input order, as torchvision orders them
  const at::Tensor order_t =
      std::get<1>(scores.int_repr().sort(/*stable=*/true, /*dim=*/0, /*descending=*/true));
  const int64_t* order = order_t.data_ptr<int64_t>();
  const at::Tensor boxes = dets.int_repr().contiguous();
  const int_t* b = boxes.data_ptr<int_t>();

  // Coordinates as floats in score order, areas from integer differences (as exact as the
  // representation): the suppression loop streams four arrays and does not branch.
  std::vector<float> x1(n), y1(n), x2(n), y2(n), area(n);
  for (int64_t k = 0; k < n; ++k) {
    const int_t* box = b + order[k] * 4;
    x1[k] = static_cast<float>(box[0]);
    y1[k] = static_cast<float>(box[1]);
    x2[k] = static_cast<float>(box[2]);
    y2[k] = static_cast<float>(box[3]);
    area[k] = static_cast<float>((static_cast<int64_t>(box[2]) - box[0]) *
                                 (static_cast<int64_t>(box[3]) - box[1]));
  }
  const float threshold = cpu::threshold_at_or_below<float>(iou_threshold);
  std::vector<uint8_t> suppressed(n, 0);
  std::vector<int64_t> keep;
  keep.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    if (suppressed[i]) {
      continue;
    }
    keep.push_back(order[i]);
    const float ix1 = x1[i], iy1 = y1[i], ix2 = x2[i], iy2 = y2[i], iarea = area[i];
    // Suppressing an already suppressed box again changes nothing: no test of suppressed[j].
    for (int64_t j = i + 1; j < n; ++j) {
      const float w = std::max(0.f, std::min(ix2, x2[j]) - std::max(ix1, x1[j]));
      const float h = std::max(0.f, std::min(iy2, y2[j]) - std::max(iy1, y1[j]));
      const float inter = w * h;
      const float iou = inter / (iarea + area[j] - inter);
      suppressed[j] |= static_cast<uint8_t>(iou > threshold);
    }
  }
  at::Tensor result = at::empty({static_cast<int64_t>(keep.size())},
                                at::TensorOptions().dtype(at::kLong).device(dets.device()));
  std::copy(keep.begin(), keep.end(), result.data_ptr<int64_t>());
  return result;
}

at::Tensor nms_kernel(const at::Tensor& dets, const at::Tensor& scores, double iou_threshold) {
  check_nms_shapes(dets, scores);
  TORCH_CHECK(
      dets.is_quantized() && scores.is_quantized() && dets.scalar_type() == scores.scalar_type(),
      "nms: quantized boxes (dets) need scores quantized to the same dtype, got ",
      dets.scalar_type(), " and ", scores.scalar_type());
  TORCH_CHECK(dets.qscheme() == at::kPerTensorAffine && scores.qscheme() == at::kPerTensorAffine,
              "nms: quantized boxes and scores must be quantized per tensor (affine)");
  if (dets.size(0) == 0) {
    return at::empty({0}, at::TensorOptions().dtype(at::kLong).device(dets.device()));
  }
  at::Tensor result;
  AT_DISPATCH_QINT_TYPES(dets.scalar_type(), "opforge_nms_quantized_cpu",
                         [&] { result = nms_impl<scalar_t>(dets, scores, iou_threshold); });
  return result;
}

}  // namespace

TORCH_LIBRARY_IMPL(opforge, QuantizedCPU, m) {
  m.impl("nms", TORCH_FN(nms_kernel));
}

}  // namespace opforge::quantized_cpu
