#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/SymInt.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <limits>
#include <tuple>
#include <utility>

#include "../common.h"

namespace opforge::ops {

// Deformable convolution v1/v2 (use_mask), as torchvision.ops.deform_conv2d.
at::Tensor deform_conv2d(const at::Tensor& input, const at::Tensor& weight,
                         const at::Tensor& offset, const at::Tensor& mask, const at::Tensor& bias,
                         c10::SymInt stride_h, c10::SymInt stride_w, c10::SymInt pad_h,
                         c10::SymInt pad_w, c10::SymInt dilation_h, c10::SymInt dilation_w,
                         c10::SymInt groups, c10::SymInt offset_groups, bool use_mask);

// Gradients with respect to (input, weight, offset, mask, bias).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> _deform_conv2d_backward(
    const at::Tensor& grad, const at::Tensor& input, const at::Tensor& weight,
    const at::Tensor& offset, const at::Tensor& mask, const at::Tensor& bias, c10::SymInt stride_h,
    c10::SymInt stride_w, c10::SymInt pad_h, c10::SymInt pad_w, c10::SymInt dilation_h,
    c10::SymInt dilation_w, c10::SymInt groups, c10::SymInt offset_groups, bool use_mask);

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
    c10::DeviceType device, const at::Tensor& input, const at::Tensor& weight,
    const at::Tensor& offset, const at::Tensor& mask, const at::Tensor& bias, int64_t stride_h,
    int64_t stride_w, int64_t pad_h, int64_t pad_w, int64_t dilation_h, int64_t dilation_w,
    int64_t groups, int64_t offset_groups, bool use_mask) {
  const std::pair<const at::Tensor*, const char*> tensors[] = {{&input, "input"},
                                                               {&weight, "weight"},
                                                               {&offset, "offset"},
                                                               {&mask, "mask"},
                                                               {&bias, "bias"}};
  for (const auto& [t, name] : tensors) {
    TORCH_CHECK(t->defined(), "deform_conv2d: ", name, " must be a defined tensor");
    opforge::check_storage_holds("deform_conv2d", name, *t);
    TORCH_CHECK(t->device().type() == device && t->device() == input.device(),
                "deform_conv2d: ", name, " must be a ", c10::DeviceTypeName(device),
                " tensor on the same device as input (", input.device(), "), got ", t->device());
    TORCH_CHECK(t->scalar_type() == input.scalar_type(), "deform_conv2d: expected ", name,
                " to have the same dtype as input (", input.scalar_type(), "), got ",
                t->scalar_type());
  }
  const auto dtype = input.scalar_type();
  TORCH_CHECK(
      dtype == at::kFloat || dtype == at::kDouble || dtype == at::kHalf || dtype == at::kBFloat16,
      "deform_conv2d: input must be a floating point tensor (float16, bfloat16, "
      "float32 or float64), got ",
      dtype);
  TORCH_CHECK(input.dim() == 4,
              "deform_conv2d: input must be 4-D (batch, channels, height, width), got ",
              input.dim(), "-D with shape ", input.sizes());
  TORCH_CHECK(weight.dim() == 4,
              "deform_conv2d: weight must be 4-D (out_channels, in_channels / groups, kernel_h, "
              "kernel_w), got ",
              weight.dim(), "-D with shape ", weight.sizes());
  TORCH_CHECK(offset.dim() == 4,
              "deform_conv2d: offset must be 4-D (batch, 2 * offset_groups * kernel_h * kernel_w, "
              "out_h, out_w), got ",
              offset.dim(), "-D with shape ", offset.sizes());
  TORCH_CHECK(!use_mask || mask.dim() == 4,
              "deform_conv2d: mask must be 4-D (batch, offset_groups * kernel_h * kernel_w, out_h, "
              "out_w) when use_mask is true, got ",
              mask.dim(), "-D with shape ", mask.sizes());
  TORCH_CHECK(bias.dim() == 1 && bias.size(0) == weight.size(0),
              "deform_conv2d: bias must have shape (out_channels,) = (", weight.size(0), ",), got ",
              bias.sizes());

  const std::pair<int64_t, const char*> positive[] = {
      {stride_h, "stride_h"},     {stride_w, "stride_w"}, {dilation_h, "dilation_h"},
      {dilation_w, "dilation_w"}, {groups, "groups"},     {offset_groups, "offset_groups"}};
  for (const auto& [v, name] : positive) {
    TORCH_CHECK(v > 0 && v <= kMaxDeformParam, "deform_conv2d: ", name,
                " must be a positive integer below 2^31, got ", v);
  }
  TORCH_CHECK(pad_h >= 0 && pad_h <= kMaxDeformParam && pad_w >= 0 && pad_w <= kMaxDeformParam,
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

  TORCH_CHECK(g.kernel_h > 0 && g.kernel_w > 0,
              "deform_conv2d: weight kernel size must be positive, got kernel_h=", g.kernel_h,
              ", kernel_w=", g.kernel_w);
  TORCH_CHECK(g.channels % groups == 0, "deform_conv2d: groups (", groups,
              ") must divide the input channels (", g.channels, ")");
  TORCH_CHECK(weight.size(1) == g.channels / groups,
              "deform_conv2d: weight.shape[1] must be in_channels / groups = ", g.channels, " / ",
              groups, " = ", g.channels / groups, ", got ", weight.size(1));
  TORCH_CHECK(g.out_channels % groups == 0, "deform_conv2d: groups (", groups,
              ") must divide the output channels weight.shape[0] (", g.out_channels, ")");
  TORCH_CHECK(g.channels % offset_groups == 0, "deform_conv2d: offset_groups (", offset_groups,
              ") must divide the input channels (", g.channels, ")");
  const int64_t kk = g.kernel_h * g.kernel_w;
  TORCH_CHECK(
      offset.size(1) % (2 * kk) == 0 && offset.size(1) / (2 * kk) == offset_groups,
      "deform_conv2d: offset.shape[1] must be 2 * offset_groups * kernel_h * kernel_w = 2 * ",
      offset_groups, " * ", g.kernel_h, " * ", g.kernel_w, ", got ", offset.size(1));
  TORCH_CHECK(!use_mask || (mask.size(1) % kk == 0 && mask.size(1) / kk == offset_groups),
              "deform_conv2d: mask.shape[1] must be offset_groups * kernel_h * kernel_w = ",
              offset_groups, " * ", g.kernel_h, " * ", g.kernel_w, ", got ", mask.size(1));
  TORCH_CHECK(offset.size(0) == g.batch, "deform_conv2d: offset.shape[0] (", offset.size(0),
              ") must equal the batch size input.shape[0] (", g.batch, ")");
  TORCH_CHECK(!use_mask || mask.size(0) == g.batch, "deform_conv2d: mask.shape[0] (", mask.size(0),
              ") must equal the batch size input.shape[0] (", g.batch, ")");

  // Parameters are below 2^31 and sizes below 2^63 / 8, so this cannot overflow.
  const int64_t span_h = dilation_h * (g.kernel_h - 1) + 1;
  const int64_t span_w = dilation_w * (g.kernel_w - 1) + 1;
  g.out_h = (g.height + 2 * pad_h - span_h) / stride_h + 1;
  g.out_w = (g.width + 2 * pad_w - span_w) / stride_w + 1;
  TORCH_CHECK(g.height + 2 * pad_h >= span_h && g.width + 2 * pad_w >= span_w,
              "deform_conv2d: the dilated kernel (", span_h, " x ", span_w,
              ") is larger than the padded input (", g.height + 2 * pad_h, " x ",
              g.width + 2 * pad_w, ")");
  TORCH_CHECK(offset.size(2) == g.out_h && offset.size(3) == g.out_w,
              "deform_conv2d: offset spatial size must equal the output size (", g.out_h, ", ",
              g.out_w, "), got (", offset.size(2), ", ", offset.size(3), ")");
  TORCH_CHECK(!use_mask || (mask.size(2) == g.out_h && mask.size(3) == g.out_w),
              "deform_conv2d: mask spatial size must equal the output size (", g.out_h, ", ",
              g.out_w, "), got (", mask.size(2), ", ", mask.size(3), ")");
  return g;
}

}  // namespace opforge::ops
