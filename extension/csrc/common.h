// Shared input checks for every backend's kernels: each backend calls these so
// that bad input gets the same error, naming the argument, on CPU, CUDA and MPS.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <c10/util/safe_numerics.h>

#include <cmath>
#include <cstdint>
#include <limits>

namespace opforge {

inline bool is_supported_float(const at::Tensor& t) {
  const auto s = t.scalar_type();
  return s == at::kFloat || s == at::kDouble || s == at::kHalf || s == at::kBFloat16;
}

// A tensor's sizes and strides must fit in its storage: a view whose storage was shrunk
// afterwards (storage().resize_) would otherwise be read past its end. Tensors without
// data (meta, fake) have nothing to read and are not checked.
inline void check_storage_holds(const char* op, const char* name, const at::Tensor& t) {
  if (!t.defined() || !t.has_storage() || t.numel() == 0 || t.is_meta()) {
    return;
  }
  uint64_t last = static_cast<uint64_t>(t.storage_offset());
  bool overflow = false;
  for (int64_t d = 0; d < t.dim(); ++d) {
    uint64_t reach = 0;
    overflow |= c10::mul_overflows(static_cast<uint64_t>(t.size(d) - 1),
                                   static_cast<uint64_t>(t.stride(d)), &reach);
    overflow |= c10::add_overflows(last, reach, &last);
  }
  uint64_t needed = 0;
  overflow |= c10::mul_overflows(last + 1, static_cast<uint64_t>(t.itemsize()), &needed);
  const uint64_t held = t.storage().nbytes();
  TORCH_CHECK(!overflow && needed <= held, op, ": ", name, " with sizes ", t.sizes(), ", strides ",
              t.strides(), " and storage offset ", t.storage_offset(), " needs ", needed,
              " bytes of storage, but its storage holds ", held);
}

inline void check_same_device_and_dtype(const char* op, const char* name_a, const at::Tensor& a,
                                        const char* name_b, const at::Tensor& b) {
  TORCH_CHECK(a.device() == b.device(), op, ": ", name_a, " and ", name_b,
              " must be on the same device, got ", name_a, " on ", a.device(), " and ", name_b,
              " on ", b.device());
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), op, ": ", name_a, " and ", name_b,
              " must have the same dtype, got ", name_a, " ", a.scalar_type(), " and ", name_b, " ",
              b.scalar_type());
}

// The shape rules of nms, shared by the float kernels of every backend and the QuantizedCPU one.
inline void check_nms_shapes(const at::Tensor& dets, const at::Tensor& scores) {
  check_storage_holds("nms", "boxes (dets)", dets);
  check_storage_holds("nms", "scores", scores);
  TORCH_CHECK(dets.dim() == 2 && dets.size(1) == 4,
              "nms: boxes (dets) must have shape [N, 4], got ", dets.sizes());
  TORCH_CHECK(scores.dim() == 1, "nms: scores must be a 1-D tensor [N], got shape ",
              scores.sizes());
  TORCH_CHECK(dets.size(0) == scores.size(0),
              "nms: boxes (dets) and scores must have the same length, got ", dets.size(0),
              " boxes and ", scores.size(0), " scores");
}

inline void check_nms_inputs(const at::Tensor& dets, const at::Tensor& scores) {
  check_nms_shapes(dets, scores);
  check_same_device_and_dtype("nms", "boxes (dets)", dets, "scores", scores);
  TORCH_CHECK(is_supported_float(dets), "nms: boxes (dets) must be a floating point tensor, got ",
              dets.scalar_type());
}

// Sizes the kernels index with int32 (argmax, channel_mapping, tap tables) or hand to
// torchvision-style int parameters stay below 2^31.
inline constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();

// The plane size must fit the int32 offsets (argmax, tap tables) the kernels use.
inline void check_plane_fits_int32(const char* op, int64_t height, int64_t width) {
  TORCH_CHECK(height <= 0 || width <= 0 ||
                  (height <= kMaxInt32 && width <= kMaxInt32 && height * width <= kMaxInt32),
              op, ": an input plane of height x width = ", height, " x ", width,
              " has 2^31 or more elements, more than the kernels' int32 offsets address");
}

// A fixed sampling_ratio bounds every roi's bilinear samples without reading the rois.
inline constexpr int64_t kMaxSamplesPerRoi = int64_t(1) << 24;

inline void check_sampling_ratio(const char* op, int64_t sampling_ratio, int64_t pooled_height,
                                 int64_t pooled_width) {
  TORCH_CHECK(sampling_ratio <= 0 || double(sampling_ratio) * double(sampling_ratio) *
                                             double(pooled_height) * double(pooled_width) <=
                                         double(kMaxSamplesPerRoi),
              op, ": sampling_ratio ", sampling_ratio, " with output_size (", pooled_height, ", ",
              pooled_width, ") needs more than ", kMaxSamplesPerRoi,
              " samples per roi; pass a smaller sampling_ratio (or <= 0 for adaptive sampling)");
}

// The shape rules of a roi op's input and rois, shared with the QuantizedCPU roi_align.
inline void check_roi_shapes(const char* op, const at::Tensor& input, const at::Tensor& rois) {
  check_storage_holds(op, "input", input);
  check_storage_holds(op, "rois", rois);
  TORCH_CHECK(input.dim() == 4, op, ": input must be a 4-D tensor [N, C, H, W], got shape ",
              input.sizes());
  TORCH_CHECK(rois.dim() == 2 && rois.size(1) == 5, op,
              ": rois (boxes) must have shape [K, 5] (batch index, x1, y1, x2, y2), got shape ",
              rois.sizes());
}

// output_size and the input plane of a roi op (input is 4-D).
inline void check_roi_output_size(const char* op, const at::Tensor& input, int64_t pooled_height,
                                  int64_t pooled_width) {
  TORCH_CHECK(pooled_height >= 0 && pooled_width >= 0 && pooled_height <= kMaxInt32 &&
                  pooled_width <= kMaxInt32,
              op,
              ": output_size (pooled_height, pooled_width) must not be negative and must be "
              "below 2^31, got (",
              pooled_height, ", ", pooled_width, ")");
  check_plane_fits_int32(op, input.size(2), input.size(3));
}

// Checks shared by the roi forwards (roi_align, roi_pool, and the ps ops below).
inline void check_roi_inputs(const char* op, const at::Tensor& input, const at::Tensor& rois,
                             int64_t pooled_height, int64_t pooled_width) {
  check_roi_shapes(op, input, rois);
  check_same_device_and_dtype(op, "input", input, "rois", rois);
  TORCH_CHECK(is_supported_float(input), op, ": input must be a floating point tensor, got ",
              input.scalar_type());
  check_roi_output_size(op, input, pooled_height, pooled_width);
  // Every roi names an image of the input: with none, any roi is out of range.
  TORCH_CHECK(input.size(0) > 0 || rois.size(0) == 0, op,
              ": input has no images (batch size 0), but rois hold ", rois.size(0),
              " boxes that each name one");
}

// Checks shared by the roi backward kernels.
inline void check_roi_backward_inputs(const char* op, const at::Tensor& grad,
                                      const at::Tensor& rois, int64_t pooled_height,
                                      int64_t pooled_width, int64_t batch_size, int64_t channels,
                                      int64_t height, int64_t width) {
  check_storage_holds(op, "grad", grad);
  check_storage_holds(op, "rois", rois);
  TORCH_CHECK(rois.dim() == 2 && rois.size(1) == 5, op, ": rois must have shape [K, 5], got shape ",
              rois.sizes());
  TORCH_CHECK(grad.dim() == 4 && grad.size(0) == rois.size(0) && grad.size(1) == channels &&
                  grad.size(2) == pooled_height && grad.size(3) == pooled_width,
              op, ": grad must have shape [K, C, pooled_height, pooled_width] = [", rois.size(0),
              ", ", channels, ", ", pooled_height, ", ", pooled_width, "], got ", grad.sizes());
  check_same_device_and_dtype(op, "grad", grad, "rois", rois);
  TORCH_CHECK(batch_size >= 0 && channels >= 0 && height >= 0 && width >= 0, op,
              ": batch_size, channels, height and width must be non-negative, got ", batch_size,
              ", ", channels, ", ", height, ", ", width);
  TORCH_CHECK(is_supported_float(grad), op, ": grad must be a floating point tensor, got ",
              grad.scalar_type());
  check_plane_fits_int32(op, height, width);
}

// The int32 index tensor a forward returned beside its output (roi_pool's
// argmax, the ps ops' channel_mapping), handed back to the backward.
inline void check_int32_like_grad(const char* op, const char* name, const at::Tensor& index,
                                  const at::Tensor& grad) {
  check_storage_holds(op, name, index);
  TORCH_CHECK(index.scalar_type() == at::kInt && index.sizes() == grad.sizes() &&
                  index.device() == grad.device(),
              op, ": ", name, " must be an int32 tensor shaped like grad ", grad.sizes(), " on ",
              grad.device(), ", got ", index.scalar_type(), " ", index.sizes(), " on ",
              index.device());
}

// Checks shared by ps_roi_align and ps_roi_pool (forward): each output channel
// pools its own input channel per bin, so C must be a multiple of the bin count.
inline void check_ps_roi_inputs(const char* op, const at::Tensor& input, const at::Tensor& rois,
                                int64_t pooled_height, int64_t pooled_width) {
  check_roi_inputs(op, input, rois, pooled_height, pooled_width);
  TORCH_CHECK(pooled_height > 0 && pooled_width > 0, op,
              ": output_size (pooled_height, pooled_width) must be positive, got (", pooled_height,
              ", ", pooled_width, ")");
  TORCH_CHECK(input.size(1) % (pooled_height * pooled_width) == 0, op, ": input channels (",
              input.size(1), ") must be a multiple of pooled_height * pooled_width (",
              pooled_height * pooled_width, ")");
}

// Checks shared by the ps roi backward kernels: grad and channel_mapping are
// [K, channels / (PH * PW), PH, PW], channel_mapping int32 on grad's device.
inline void check_ps_roi_backward_inputs(const char* op, const at::Tensor& grad,
                                         const at::Tensor& rois, const at::Tensor& channel_mapping,
                                         int64_t pooled_height, int64_t pooled_width,
                                         int64_t batch_size, int64_t channels, int64_t height,
                                         int64_t width) {
  TORCH_CHECK(pooled_height > 0 && pooled_width > 0 && pooled_height <= kMaxInt32 &&
                  pooled_width <= kMaxInt32,
              op, ": pooled_height and pooled_width must be positive and below 2^31, got (",
              pooled_height, ", ", pooled_width, ")");
  TORCH_CHECK(channels >= 0 && channels % (pooled_height * pooled_width) == 0, op, ": channels (",
              channels, ") must be a non-negative multiple of pooled_height * pooled_width (",
              pooled_height * pooled_width, ")");
  TORCH_CHECK(grad.dim() == 4, op,
              ": grad must be a 4-D tensor [K, channels / (PH * PW), PH, PW], got shape ",
              grad.sizes());
  check_roi_backward_inputs(op, grad, rois, pooled_height, pooled_width, batch_size, grad.size(1),
                            height, width);
  TORCH_CHECK(grad.size(1) * pooled_height * pooled_width == channels, op, ": grad has ",
              grad.size(1), " channels, so the input had ",
              grad.size(1) * pooled_height * pooled_width, ", but channels is ", channels);
  check_int32_like_grad(op, "channel_mapping", channel_mapping, grad);
}

// Validates the rois' batch indices and coordinates on the host. A bad batch
// index would read outside the input and a non-finite coordinate makes the
// sampling grid undefined, so both are errors rather than crashes.
template <typename T>
inline void check_rois_values(const char* op, const T* rois, int64_t num_rois, int64_t batch_size) {
  for (int64_t n = 0; n < num_rois; ++n) {
    const T* r = rois + n * 5;
    const double b = static_cast<double>(r[0]);
    TORCH_CHECK(b >= 0 && b < static_cast<double>(batch_size), op, ": rois[", n, ", 0] = ", b,
                " is not a batch index of input (batch size ", batch_size, ")");
    for (int k = 1; k < 5; ++k) {
      TORCH_CHECK(std::isfinite(static_cast<double>(r[k])), op, ": rois[", n, ", ", k,
                  "] = ", static_cast<double>(r[k]), " is not finite");
    }
  }
}

// Host-side check of a contiguous CPU int32 channel_mapping: every entry names
// an input channel, so the backward never writes outside grad_input.
inline void check_channel_mapping_values(const char* op, const at::Tensor& channel_mapping,
                                         int64_t channels) {
  const int32_t* m = channel_mapping.const_data_ptr<int32_t>();
  for (int64_t i = 0; i < channel_mapping.numel(); ++i) {
    TORCH_CHECK(m[i] >= 0 && m[i] < channels, op, ": channel_mapping holds ", m[i],
                " at flat index ", i, ", which is not a channel of the input (", channels,
                " channels)");
  }
}

}  // namespace opforge
