// opforge::_boxes_to_rois(Tensor[] boxes) -> Tensor: the list form of roi boxes (one
// Tensor[L_i, 4] per image) as the Tensor[K, 5] the roi ops take, its first column the image
// index i. The Python wrappers (opforge_ops/ops/_utils.py) call it for plain 2-D boxes; it
// replaces one ATen call per image plus a cat, whose Python-side cost was as large as a small
// roi_align itself.
//
// CompositeImplicitAutograd: plain CPU boxes of one floating dtype that need no autograd graph
// are copied into the result directly; everything else (another device, mixed dtypes, a box
// that requires grad, fake/meta/functional tensors under torch.compile or export, a dispatch
// mode) takes the composite path, one constant_pad_nd per image and a cat, which autograd,
// fake tensors and every backend already handle, with the dtype torch.cat's promotion gives.
//
// Legacy build only: the stable ABI build keeps the Python conversion.
#ifndef OPFORGE_STABLE_ABI
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/TensorSubclassLikeUtils.h>
#include <c10/core/GradMode.h>
#include <torch/library.h>

namespace opforge::ops {
namespace {

bool copyable(at::TensorList boxes) {
  if (c10::impl::dispatch_mode_enabled()) {
    return false;
  }
  const auto dtype = boxes[0].scalar_type();
  if (!at::isFloatingType(dtype)) {
    return false;
  }
  const bool grad = c10::GradMode::is_enabled();
  for (const auto& b : boxes) {
    if (!b.defined() || b.scalar_type() != dtype || !b.device().is_cpu() ||
        b.layout() != at::kStrided || b.is_quantized() || b.is_neg() || b.dim() != 2 ||
        b.size(1) != 4 || at::isTensorSubclassLike(b) || (grad && b.requires_grad())) {
      return false;
    }
  }
  return true;
}

template <typename scalar_t>
void copy_rows(at::TensorList boxes, scalar_t* out) {
  for (size_t i = 0; i < boxes.size(); ++i) {
    const auto& b = boxes[i];
    const auto rows = b.size(0);
    const auto row_stride = b.stride(0);
    const auto col_stride = b.stride(1);
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

at::Tensor boxes_to_rois(at::TensorList boxes) {
  TORCH_CHECK(!boxes.empty(),
              "_boxes_to_rois: boxes is an empty list: pass one Tensor[L, 4] per image");
  if (copyable(boxes)) {
    int64_t total = 0;
    for (const auto& b : boxes) {
      total += b.size(0);
    }
    auto rois = at::empty({total, 5}, boxes[0].options());
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, rois.scalar_type(), "_boxes_to_rois",
                                    [&] { copy_rows(boxes, rois.mutable_data_ptr<scalar_t>()); });
    return rois;
  }
  std::vector<at::Tensor> parts;
  parts.reserve(boxes.size());
  for (size_t i = 0; i < boxes.size(); ++i) {
    parts.push_back(at::constant_pad_nd(boxes[i], {1, 0}, static_cast<double>(i)));
  }
  return at::cat(parts, 0);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(opforge, m) {
  m.def("_boxes_to_rois(Tensor[] boxes) -> Tensor");
}

TORCH_LIBRARY_IMPL(opforge, CompositeImplicitAutograd, m) {
  m.impl("_boxes_to_rois", boxes_to_rois);
}

}  // namespace opforge::ops
#endif
