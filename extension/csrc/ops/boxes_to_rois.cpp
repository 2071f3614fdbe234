// opforge::_boxes_to_rois(Tensor[] boxes) -> Tensor: the list form of roi boxes (one
// Tensor[L_i, 4] per image) as the Tensor[K, 5] the roi ops take, its first column the image
// index i. The Python wrappers (opforge_ops/ops/_utils.py) call it in eager mode for plain 2-D
// boxes; it replaces one ATen call per image plus a cat, whose Python-side cost was as large as
// a small roi_align itself.
//
// Plain CPU boxes of one floating dtype are copied into the result directly; anything else
// (mixed dtypes: torch.cat's promotion, integer boxes) is composed of one constant pad per image
// and a cat. Legacy build: a CompositeImplicitAutograd kernel, so the direct copy also checks
// that no graph is needed and that the boxes are plain tensors (not fake, meta, functional or
// under a dispatch mode), and everything else composes ATen ops that autograd, fake tensors and
// every backend handle. Stable build (no autograd or tensor-subclass queries in its API): a CPU
// kernel, plus a fake kernel in Python; the wrappers call it only for CPU boxes needing no grad.
#include "../abi.h"

#ifndef OPFORGE_STABLE_ABI
#include <ATen/Dispatch.h>
#include <ATen/TensorSubclassLikeUtils.h>
#include <c10/core/GradMode.h>
#endif

namespace opforge::ops {
namespace {

#ifdef OPFORGE_STABLE_ABI
using Boxes = std::vector<Tensor>;
#else
using Boxes = at::TensorList;
#endif

bool floating(ScalarType type) {
  return type == ScalarType::Float || type == ScalarType::Double || type == ScalarType::Half ||
         type == ScalarType::BFloat16;
}

// One floating dtype, CPU, 2-D with 4 columns: rows that can be copied as they are.
bool copyable_rows(const Boxes& boxes) {
  const auto dtype = boxes[0].scalar_type();
  if (!floating(dtype)) {
    return false;
  }
  for (const auto& b : boxes) {
    if (b.scalar_type() != dtype || device_type(b) != DeviceType::CPU || b.dim() != 2 ||
        b.size(1) != 4) {
      return false;
    }
  }
  return true;
}

template <typename scalar_t>
void copy_rows(const Boxes& boxes, scalar_t* out) {
  for (size_t i = 0; i < boxes.size(); ++i) {
    const auto& b = boxes[i];
    const int64_t rows = b.size(0);
    const int64_t row_stride = b.stride(0);
    const int64_t col_stride = b.stride(1);
    const scalar_t* in = b.const_data_ptr<scalar_t>();
    const auto index = static_cast<scalar_t>(static_cast<double>(i));
    for (int64_t r = 0; r < rows; ++r, out += 5) {
      const scalar_t* row = in + r * row_stride;
      out[0] = index;
      for (int64_t c = 0; c < 4; ++c) {
        out[1 + c] = row[c * col_stride];
      }
    }
  }
}

Tensor copied(const Boxes& boxes) {
  int64_t total = 0;
  for (const auto& b : boxes) {
    total += b.size(0);
  }
  Tensor rois = alloc_empty(boxes[0], {total, 5});
  OPFORGE_DISPATCH_FLOATING_TYPES(rois.scalar_type(), "_boxes_to_rois",
                                  [&] { copy_rows(boxes, rois.mutable_data_ptr<scalar_t>()); });
  return rois;
}

// Each image's boxes padded on the left with its index, then one cat (dtype promotion, any
// rank or device: what the Python conversion does).
Tensor composed(const Boxes& boxes) {
  std::vector<Tensor> parts;
  parts.reserve(boxes.size());
  for (size_t i = 0; i < boxes.size(); ++i) {
#ifdef OPFORGE_STABLE_ABI
    parts.push_back(detail::shim_call(
        [&] { return torch::stable::pad(boxes[i], {1, 0}, "constant", static_cast<double>(i)); }));
#else
    parts.push_back(at::constant_pad_nd(boxes[i], {1, 0}, static_cast<double>(i)));
#endif
  }
#ifdef OPFORGE_STABLE_ABI
  return detail::shim_call([&] { return detail::call_aten("aten::cat", "", parts, int64_t{0}); });
#else
  return at::cat(parts, 0);
#endif
}

Tensor boxes_to_rois(const Boxes& boxes) {
  OPFORGE_CHECK(!boxes.empty(),
                "_boxes_to_rois: boxes is an empty list: pass one Tensor[L, 4] per image");
#ifndef OPFORGE_STABLE_ABI
  if (c10::impl::dispatch_mode_enabled()) {
    return composed(boxes);
  }
  const bool grad = c10::GradMode::is_enabled();
  for (const auto& b : boxes) {
    if (!b.defined() || b.layout() != at::kStrided || b.is_quantized() || b.is_neg() ||
        at::isTensorSubclassLike(b) || (grad && b.requires_grad())) {
      return composed(boxes);
    }
  }
#endif
  return copyable_rows(boxes) ? copied(boxes) : composed(boxes);
}

#ifdef OPFORGE_STABLE_ABI
Tensor boxes_to_rois_kernel(std::vector<Tensor> boxes) {
  return boxes_to_rois(boxes);
}
#else
at::Tensor boxes_to_rois_kernel(at::TensorList boxes) {
  return boxes_to_rois(boxes);
}
#endif

}  // namespace

OPFORGE_LIBRARY_FRAGMENT(m) {
  m.def("_boxes_to_rois(Tensor[] boxes) -> Tensor");
}

#ifdef OPFORGE_STABLE_ABI
OPFORGE_LIBRARY_IMPL(CPU, m) {
  m.impl("_boxes_to_rois", OPFORGE_KERNEL(boxes_to_rois_kernel));
}
#else
OPFORGE_LIBRARY_IMPL(CompositeImplicitAutograd, m) {
  m.impl("_boxes_to_rois", OPFORGE_KERNEL(boxes_to_rois_kernel));
}
#endif

}  // namespace opforge::ops
