#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/SymInt.h>
#include <c10/util/Exception.h>

#include <tuple>

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

}  // namespace opforge::ops
