// Shared input checks for every backend's kernels: each backend calls these so
// that bad input gets the same error, naming the argument, on CPU, CUDA and MPS.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>

#include "abi.h"
#include "kernel_limits.h"

namespace opforge {

inline bool is_supported_float(const Tensor& t) {
  const auto s = t.scalar_type();
  return s == ScalarType::Float || s == ScalarType::Double || s == ScalarType::Half ||
         s == ScalarType::BFloat16;
}

// a * b and a + b in uint64, true on overflow (the rule of c10::mul_overflows / add_overflows,
// written out so that no compiler builtin is needed in either ABI or under nvcc).
inline bool mul_overflows(uint64_t a, uint64_t b, uint64_t* out) {
  *out = a * b;
  return a != 0 && *out / a != b;
}

inline bool add_overflows(uint64_t a, uint64_t b, uint64_t* out) {
  *out = a + b;
  return *out < a;
}

// A tensor's sizes and strides must fit in its storage: a view whose storage was shrunk
// afterwards (storage().resize_) would otherwise be read past its end. Tensors without
// data (meta, fake) have nothing to read and are not checked.
inline void check_storage_holds(const char* op, const char* name, const Tensor& t) {
  if (!t.defined() || t.numel() == 0) {
    return;
  }
  const int64_t held_bytes = storage_nbytes(t);
  if (held_bytes < 0) {
    return;
  }
  uint64_t last = static_cast<uint64_t>(t.storage_offset());
  bool overflow = false;
  for (int64_t d = 0; d < t.dim(); ++d) {
    uint64_t reach = 0;
    overflow |= mul_overflows(static_cast<uint64_t>(t.size(d) - 1),
                              static_cast<uint64_t>(t.stride(d)), &reach);
    overflow |= add_overflows(last, reach, &last);
  }
  uint64_t needed = 0;
  overflow |= mul_overflows(last + 1, static_cast<uint64_t>(t.element_size()), &needed);
  const uint64_t held = static_cast<uint64_t>(held_bytes);
  OPFORGE_CHECK(!overflow && needed <= held, op, ": ", name, " with sizes ", shape(t), ", strides ",
                strides(t), " and storage offset ", t.storage_offset(), " needs ", needed,
                " bytes of storage, but its storage holds ", held);
}

inline void check_same_device_and_dtype(const char* op, const char* name_a, const Tensor& a,
                                        const char* name_b, const Tensor& b) {
  OPFORGE_CHECK(same_device(a, b), op, ": ", name_a, " and ", name_b,
                " must be on the same device, got ", name_a, " on ", device_name(a), " and ",
                name_b, " on ", device_name(b));
  OPFORGE_CHECK(a.scalar_type() == b.scalar_type(), op, ": ", name_a, " and ", name_b,
                " must have the same dtype, got ", name_a, " ", a.scalar_type(), " and ", name_b,
                " ", b.scalar_type());
}

// The shape rules of nms, shared by the float kernels of every backend and the QuantizedCPU one.
inline void check_nms_shapes(const Tensor& dets, const Tensor& scores) {
  check_storage_holds("nms", "boxes (dets)", dets);
  check_storage_holds("nms", "scores", scores);
  OPFORGE_CHECK(dets.dim() == 2 && dets.size(1) == 4,
                "nms: boxes (dets) must have shape [N, 4], got ", shape(dets));
  OPFORGE_CHECK(scores.dim() == 1, "nms: scores must be a 1-D tensor [N], got shape ",
                shape(scores));
  OPFORGE_CHECK(dets.size(0) == scores.size(0),
                "nms: boxes (dets) and scores must have the same length, got ", dets.size(0),
                " boxes and ", scores.size(0), " scores");
}

inline void check_nms_inputs(const Tensor& dets, const Tensor& scores) {
  check_nms_shapes(dets, scores);
  check_same_device_and_dtype("nms", "boxes (dets)", dets, "scores", scores);
  OPFORGE_CHECK(is_supported_float(dets), "nms: boxes (dets) must be a floating point tensor, got ",
                dets.scalar_type());
}

// Sizes the kernels index with int32 (argmax, channel_mapping, tap tables) or hand to
// torchvision-style int parameters stay below 2^31.
inline constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();

// The plane size must fit the int32 offsets (argmax, tap tables) the kernels use.
inline void check_plane_fits_int32(const char* op, int64_t height, int64_t width) {
  OPFORGE_CHECK(height <= 0 || width <= 0 ||
                    (height <= kMaxInt32 && width <= kMaxInt32 && height * width <= kMaxInt32),
                op, ": an input plane of height x width = ", height, " x ", width,
                " has 2^31 or more elements, more than the kernels' int32 offsets address");
}

inline void check_sampling_ratio(const char* op, int64_t sampling_ratio, int64_t pooled_height,
                                 int64_t pooled_width) {
  OPFORGE_CHECK(sampling_ratio <= 0 || double(sampling_ratio) * double(sampling_ratio) *
                                               double(pooled_height) * double(pooled_width) <=
                                           double(kMaxSamplesPerRoi),
                op, ": sampling_ratio ", sampling_ratio, " with output_size (", pooled_height, ", ",
                pooled_width, ") needs more than ", kMaxSamplesPerRoi,
                " samples per roi; pass a smaller sampling_ratio (or <= 0 for adaptive sampling)");
}

// The shape rules of a roi op's input and rois, shared with the QuantizedCPU roi_align.
inline void check_roi_shapes(const char* op, const Tensor& input, const Tensor& rois) {
  check_storage_holds(op, "input", input);
  check_storage_holds(op, "rois", rois);
  OPFORGE_CHECK(input.dim() == 4, op, ": input must be a 4-D tensor [N, C, H, W], got shape ",
                shape(input));
  OPFORGE_CHECK(rois.dim() == 2 && rois.size(1) == 5, op,
                ": rois (boxes) must have shape [K, 5] (batch index, x1, y1, x2, y2), got shape ",
                shape(rois));
}

// output_size and the input plane of a roi op (input is 4-D).
inline void check_roi_output_size(const char* op, const Tensor& input, int64_t pooled_height,
                                  int64_t pooled_width) {
  OPFORGE_CHECK(pooled_height >= 0 && pooled_width >= 0 && pooled_height <= kMaxInt32 &&
                    pooled_width <= kMaxInt32,
                op,
                ": output_size (pooled_height, pooled_width) must not be negative and must be "
                "below 2^31, got (",
                pooled_height, ", ", pooled_width, ")");
  check_plane_fits_int32(op, input.size(2), input.size(3));
}

// Checks shared by the roi forwards (roi_align, roi_pool, and the ps ops below).
inline void check_roi_inputs(const char* op, const Tensor& input, const Tensor& rois,
                             int64_t pooled_height, int64_t pooled_width) {
  check_roi_shapes(op, input, rois);
  check_same_device_and_dtype(op, "input", input, "rois", rois);
  OPFORGE_CHECK(is_supported_float(input), op, ": input must be a floating point tensor, got ",
                input.scalar_type());
  check_roi_output_size(op, input, pooled_height, pooled_width);
  // Every roi names an image of the input: with none, any roi is out of range.
  OPFORGE_CHECK(input.size(0) > 0 || rois.size(0) == 0, op,
                ": input has no images (batch size 0), but rois hold ", rois.size(0),
                " boxes that each name one");
}

// Checks shared by the roi backward kernels.
inline void check_roi_backward_inputs(const char* op, const Tensor& grad, const Tensor& rois,
                                      int64_t pooled_height, int64_t pooled_width,
                                      int64_t batch_size, int64_t channels, int64_t height,
                                      int64_t width) {
  check_storage_holds(op, "grad", grad);
  check_storage_holds(op, "rois", rois);
  OPFORGE_CHECK(rois.dim() == 2 && rois.size(1) == 5, op,
                ": rois must have shape [K, 5], got shape ", shape(rois));
  OPFORGE_CHECK(grad.dim() == 4 && grad.size(0) == rois.size(0) && grad.size(1) == channels &&
                    grad.size(2) == pooled_height && grad.size(3) == pooled_width,
                op, ": grad must have shape [K, C, pooled_height, pooled_width] = [", rois.size(0),
                ", ", channels, ", ", pooled_height, ", ", pooled_width, "], got ", shape(grad));
  check_same_device_and_dtype(op, "grad", grad, "rois", rois);
  OPFORGE_CHECK(batch_size >= 0 && channels >= 0 && height >= 0 && width >= 0, op,
                ": batch_size, channels, height and width must be non-negative, got ", batch_size,
                ", ", channels, ", ", height, ", ", width);
  OPFORGE_CHECK(is_supported_float(grad), op, ": grad must be a floating point tensor, got ",
                grad.scalar_type());
  check_plane_fits_int32(op, height, width);
}

// The int32 index tensor a forward returned beside its output (roi_pool's
// argmax, the ps ops' channel_mapping), handed back to the backward.
inline void check_int32_like_grad(const char* op, const char* name, const Tensor& index,
                                  const Tensor& grad) {
  check_storage_holds(op, name, index);
  OPFORGE_CHECK(index.scalar_type() == ScalarType::Int && shape(index) == shape(grad) &&
                    same_device(index, grad),
                op, ": ", name, " must be an int32 tensor shaped like grad ", shape(grad), " on ",
                device_name(grad), ", got ", index.scalar_type(), " ", shape(index), " on ",
                device_name(index));
}

// Checks shared by the position-sensitive RoI ops (forward): each output channel
// pools its own input channel per bin, so C must be a multiple of the bin count.
inline void check_ps_roi_inputs(const char* op, const Tensor& input, const Tensor& rois,
                                int64_t pooled_height, int64_t pooled_width) {
  check_roi_inputs(op, input, rois, pooled_height, pooled_width);
  OPFORGE_CHECK(pooled_height > 0 && pooled_width > 0, op,
                ": output_size (pooled_height, pooled_width) must be positive, got (",
                pooled_height, ", ", pooled_width, ")");
  OPFORGE_CHECK(input.size(1) % (pooled_height * pooled_width) == 0, op, ": input channels (",
                input.size(1), ") must be a multiple of pooled_height * pooled_width (",
                pooled_height * pooled_width, ")");
}

// Checks shared by the ps roi backward kernels: grad and channel_mapping are
// [K, channels / (PH * PW), PH, PW], channel_mapping int32 on grad's device.
inline void check_ps_roi_backward_inputs(const char* op, const Tensor& grad, const Tensor& rois,
                                         const Tensor& channel_mapping, int64_t pooled_height,
                                         int64_t pooled_width, int64_t batch_size, int64_t channels,
                                         int64_t height, int64_t width) {
  OPFORGE_CHECK(pooled_height > 0 && pooled_width > 0 && pooled_height <= kMaxInt32 &&
                    pooled_width <= kMaxInt32,
                op, ": pooled_height and pooled_width must be positive and below 2^31, got (",
                pooled_height, ", ", pooled_width, ")");
  OPFORGE_CHECK(channels >= 0 && channels % (pooled_height * pooled_width) == 0, op, ": channels (",
                channels, ") must be a non-negative multiple of pooled_height * pooled_width (",
                pooled_height * pooled_width, ")");
  OPFORGE_CHECK(grad.dim() == 4, op,
                ": grad must be a 4-D tensor [K, channels / (PH * PW), PH, PW], got shape ",
                shape(grad));
  check_roi_backward_inputs(op, grad, rois, pooled_height, pooled_width, batch_size, grad.size(1),
                            height, width);
  OPFORGE_CHECK(grad.size(1) * pooled_height * pooled_width == channels, op, ": grad has ",
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
    OPFORGE_CHECK(b >= 0 && b < static_cast<double>(batch_size), op, ": rois[", n, ", 0] = ", b,
                  " is not a batch index of input (batch size ", batch_size, ")");
    for (int k = 1; k < 5; ++k) {
      OPFORGE_CHECK(std::isfinite(static_cast<double>(r[k])), op, ": rois[", n, ", ", k,
                    "] = ", static_cast<double>(r[k]), " is not finite");
    }
  }
}

// Host-side check of a contiguous CPU int32 channel_mapping: every entry names
// an input channel, so the backward never writes outside grad_input.
inline void check_channel_mapping_values(const char* op, const Tensor& channel_mapping,
                                         int64_t channels) {
  const int32_t* m = channel_mapping.const_data_ptr<int32_t>();
  for (int64_t i = 0; i < channel_mapping.numel(); ++i) {
    OPFORGE_CHECK(m[i] >= 0 && m[i] < channels, op, ": channel_mapping holds ", m[i],
                  " at flat index ", i, ", which is not a channel of the input (", channels,
                  " channels)");
  }
}

// Sizes of one deform_conv2d call, validated by check_deform_conv2d_args.
struct DeformConv2dGeometry {
  int64_t batch, channels, height, width;
  int64_t out_channels, kernel_h, kernel_w;
  int64_t stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w;
  int64_t groups, offset_groups;
  int64_t out_h, out_w;
  bool use_mask;

  int64_t kernel_size() const { return kernel_h * kernel_w; }
  int64_t out_size() const { return out_h * out_w; }
  int64_t channels_per_offset_group() const { return channels / offset_groups; }
};

// Shared by every backend so bad input reads the same everywhere: each message
// names the offending argument. Parameters are capped at 2^31 - 1 (torchvision
// narrows them to int) so that no size computation below can overflow.
inline constexpr int64_t kMaxDeformParam = std::numeric_limits<int32_t>::max();

inline DeformConv2dGeometry check_deform_conv2d_args(
    DeviceType device, const Tensor& input, const Tensor& weight, const Tensor& offset,
    const Tensor& mask, const Tensor& bias, int64_t stride_h, int64_t stride_w, int64_t pad_h,
    int64_t pad_w, int64_t dilation_h, int64_t dilation_w, int64_t groups, int64_t offset_groups,
    bool use_mask) {
  const std::pair<const Tensor*, const char*> tensors[] = {{&input, "input"},
                                                           {&weight, "weight"},
                                                           {&offset, "offset"},
                                                           {&mask, "mask"},
                                                           {&bias, "bias"}};
  for (const auto& [t, name] : tensors) {
    OPFORGE_CHECK(t->defined(), "deform_conv2d: ", name, " must be a defined tensor");
    check_storage_holds("deform_conv2d", name, *t);
    OPFORGE_CHECK(device_type(*t) == device && same_device(*t, input), "deform_conv2d: ", name,
                  " must be a ", device_type_name(device, /*upper_case=*/true),
                  " tensor on the same device as input (", device_name(input), "), got ",
                  device_name(*t));
  }
  OPFORGE_CHECK(input.dim() == 4,
                "deform_conv2d: input must be 4-D (batch, channels, height, width), got ",
                input.dim(), "-D with shape ", shape(input));
  OPFORGE_CHECK(weight.dim() == 4,
                "deform_conv2d: weight must be 4-D (out_channels, in_channels / groups, kernel_h, "
                "kernel_w), got ",
                weight.dim(), "-D with shape ", shape(weight));
  OPFORGE_CHECK(
      offset.dim() == 4,
      "deform_conv2d: offset must be 4-D (batch, 2 * offset_groups * kernel_h * kernel_w, "
      "out_h, out_w), got ",
      offset.dim(), "-D with shape ", shape(offset));
  OPFORGE_CHECK(
      !use_mask || mask.dim() == 4,
      "deform_conv2d: mask must be 4-D (batch, offset_groups * kernel_h * kernel_w, out_h, "
      "out_w) when use_mask is true, got ",
      mask.dim(), "-D with shape ", shape(mask));
  OPFORGE_CHECK(bias.dim() == 1 && bias.size(0) == weight.size(0),
                "deform_conv2d: bias must have shape (out_channels,) = (", weight.size(0),
                ",), got ", shape(bias));

  const std::pair<int64_t, const char*> positive[] = {
      {stride_h, "stride_h"},     {stride_w, "stride_w"}, {dilation_h, "dilation_h"},
      {dilation_w, "dilation_w"}, {groups, "groups"},     {offset_groups, "offset_groups"}};
  for (const auto& [v, name] : positive) {
    OPFORGE_CHECK(v > 0 && v <= kMaxDeformParam, "deform_conv2d: ", name,
                  " must be a positive integer below 2^31, got ", v);
  }
  OPFORGE_CHECK(pad_h >= 0 && pad_h <= kMaxDeformParam && pad_w >= 0 && pad_w <= kMaxDeformParam,
                "deform_conv2d: padding (pad_h, pad_w) must be non-negative and below 2^31, got (",
                pad_h, ", ", pad_w, ")");

  DeformConv2dGeometry g{};
  g.batch = input.size(0);
  g.channels = input.size(1);
  g.height = input.size(2);
  g.width = input.size(3);
  g.out_channels = weight.size(0);
  g.kernel_h = weight.size(2);
  g.kernel_w = weight.size(3);
  g.stride_h = stride_h;
  g.stride_w = stride_w;
  g.pad_h = pad_h;
  g.pad_w = pad_w;
  g.dilation_h = dilation_h;
  g.dilation_w = dilation_w;
  g.groups = groups;
  g.offset_groups = offset_groups;
  g.use_mask = use_mask;

  OPFORGE_CHECK(g.kernel_h > 0 && g.kernel_w > 0,
                "deform_conv2d: weight kernel size must be positive, got kernel_h=", g.kernel_h,
                ", kernel_w=", g.kernel_w);
  OPFORGE_CHECK(g.channels % groups == 0, "deform_conv2d: groups (", groups,
                ") must divide the input channels (", g.channels, ")");
  OPFORGE_CHECK(weight.size(1) == g.channels / groups,
                "deform_conv2d: weight.shape[1] must be in_channels / groups = ", g.channels, " / ",
                groups, " = ", g.channels / groups, ", got ", weight.size(1));
  OPFORGE_CHECK(g.out_channels % groups == 0, "deform_conv2d: groups (", groups,
                ") must divide the output channels weight.shape[0] (", g.out_channels, ")");
  OPFORGE_CHECK(g.channels % offset_groups == 0, "deform_conv2d: offset_groups (", offset_groups,
                ") must divide the input channels (", g.channels, ")");
  const int64_t kk = g.kernel_h * g.kernel_w;
  OPFORGE_CHECK(offset.size(1) % (2 * kk) == 0 && offset.size(1) / (2 * kk) == offset_groups,
                "deform_conv2d: offset.shape[1] is not valid: got: ", offset.size(1),
                " expected: ", 2 * offset_groups * kk,
                " (2 * offset_groups * kernel_h * kernel_w = 2 * ", offset_groups, " * ",
                g.kernel_h, " * ", g.kernel_w, ")");
  OPFORGE_CHECK(!use_mask || (mask.size(1) % kk == 0 && mask.size(1) / kk == offset_groups),
                "deform_conv2d: mask.shape[1] is not valid: got: ", mask.size(1),
                " expected: ", offset_groups * kk,
                " (offset_groups * kernel_h * kernel_w = ", offset_groups, " * ", g.kernel_h, " * ",
                g.kernel_w, ")");
  OPFORGE_CHECK(offset.size(0) == g.batch, "deform_conv2d: offset.shape[0] (", offset.size(0),
                ") must equal the batch size input.shape[0] (", g.batch, ")");
  OPFORGE_CHECK(!use_mask || mask.size(0) == g.batch, "deform_conv2d: mask.shape[0] (",
                mask.size(0), ") must equal the batch size input.shape[0] (", g.batch, ")");

  // Parameters are below 2^31 and sizes below 2^63 / 8, so this cannot overflow.
  const int64_t span_h = dilation_h * (g.kernel_h - 1) + 1;
  const int64_t span_w = dilation_w * (g.kernel_w - 1) + 1;
  g.out_h = (g.height + 2 * pad_h - span_h) / stride_h + 1;
  g.out_w = (g.width + 2 * pad_w - span_w) / stride_w + 1;
  OPFORGE_CHECK(g.height + 2 * pad_h >= span_h && g.width + 2 * pad_w >= span_w,
                "deform_conv2d: the dilated kernel (", span_h, " x ", span_w,
                ") is larger than the padded input (", g.height + 2 * pad_h, " x ",
                g.width + 2 * pad_w, ")");
  OPFORGE_CHECK(offset.size(2) == g.out_h && offset.size(3) == g.out_w,
                "deform_conv2d: offset spatial size must equal the output size (", g.out_h, ", ",
                g.out_w, "), got (", offset.size(2), ", ", offset.size(3), ")");
  OPFORGE_CHECK(!use_mask || (mask.size(2) == g.out_h && mask.size(3) == g.out_w),
                "deform_conv2d: mask spatial size must equal the output size (", g.out_h, ", ",
                g.out_w, "), got (", mask.size(2), ", ", mask.size(3), ")");
  // dtypes last, as in torchvision, whose shape errors come first whatever the dtypes
  const auto dtype = input.scalar_type();
  OPFORGE_CHECK(dtype == ScalarType::Float || dtype == ScalarType::Double ||
                    dtype == ScalarType::Half || dtype == ScalarType::BFloat16,
                "deform_conv2d: input must be a floating point tensor (float16, bfloat16, "
                "float32 or float64), got ",
                dtype);
  for (const auto& [t, name] : tensors) {
    OPFORGE_CHECK(t->scalar_type() == dtype, "deform_conv2d: expected ", name,
                  " to have the same dtype as input (", dtype, "), got ", t->scalar_type());
  }
  return g;
}

// The grad a deform_conv2d backward receives: the forward's output, on input's device.
inline void check_deform_conv2d_grad(DeviceType device, const Tensor& grad, const Tensor& input,
                                     const DeformConv2dGeometry& g) {
  OPFORGE_CHECK(grad.defined(), "deform_conv2d backward: grad must be a defined tensor");
  check_storage_holds("deform_conv2d backward", "grad", grad);
  OPFORGE_CHECK(
      device_type(grad) == device && same_device(grad, input),
      "deform_conv2d backward: grad must be a ", device_type_name(device, /*upper_case=*/true),
      " tensor on the same device as input (", device_name(input), "), got ", device_name(grad));
  OPFORGE_CHECK(grad.scalar_type() == input.scalar_type(),
                "deform_conv2d backward: expected grad to have the same dtype as input (",
                input.scalar_type(), "), got ", grad.scalar_type());
  OPFORGE_CHECK(grad.dim() == 4 && grad.size(0) == g.batch && grad.size(1) == g.out_channels &&
                    grad.size(2) == g.out_h && grad.size(3) == g.out_w,
                "deform_conv2d backward: grad must have the output shape (", g.batch, ", ",
                g.out_channels, ", ", g.out_h, ", ", g.out_w, "), got ", shape(grad));
}

}  // namespace opforge
