// CUDA kernels for opforge::roi_align and opforge::_roi_align_backward (dispatch key CUDA).
//
// Forward: one thread per output element (roi, channel, ph, pw), averaging bilinear
// samples of the feature map. Backward: one thread per grad_output element, scattering
// into grad_input with atomic adds. Float atomics make the backward nondeterministic, so
// under torch.use_deterministic_algorithms(True) it raises (or warns with warn_only=True)
// through at::globalContext().alertNotDeterministic, like the ATen ops without a
// deterministic CUDA path. Half and bfloat16 accumulate in float (at::acc_type), and the
// backward scatters into a float buffer, cast to the input dtype at the end.
#include "cuda_utils.h"

namespace opforge::cuda {
namespace {

Tensor roi_align_forward_cuda(const Tensor& input, const Tensor& rois, double spatial_scale,
                              int64_t pooled_height, int64_t pooled_width, int64_t sampling_ratio,
                              bool aligned) {
  constexpr const char* op = "roi_align";
  check_cuda(op, "input", input);
  check_roi_inputs(op, input, rois, pooled_height, pooled_width);
  check_sampling_ratio(op, sampling_ratio, pooled_height, pooled_width);

  const CudaDeviceGuard device_guard(input);
  const int64_t num_rois = rois.size(0);
  const int64_t channels = input.size(1);
  const int64_t height = input.size(2);
  const int64_t width = input.size(3);
  auto output = alloc_empty(input, {num_rois, channels, pooled_height, pooled_width});
  const int64_t total = output.numel();
  if (total == 0) {
    return output;
  }
  // Rois are not validated here: that would copy them to the host (a sync) on every call.
  // A roi the CPU rejects (bad batch index, non-finite coordinate, too many samples)
  // reads nothing and yields 0 (roi_is_valid in roi_geometry).
  if (input.numel() == 0) {
    fill_zero(output);
    return output;  // an empty (H, W) plane: every sample is outside
  }

  const Tensor input_c = as_contiguous(input);
  const Tensor rois_c = as_contiguous(rois);
  const cudaStream_t stream = current_cuda_stream(input);
  OPFORGE_DISPATCH_FLOATING_TYPES(input.scalar_type(), "opforge_roi_align_forward_cuda", [&] {
    OPFORGE_CUDA_CHECK(
        launch(elementwise_grid(total, stream), RoiAlignForward<scalar_t>{
                                                    .total = total,
                                                    .input = input_c.const_data_ptr<scalar_t>(),
                                                    .rois = rois_c.const_data_ptr<scalar_t>(),
                                                    .batch_size = input.size(0),
                                                    .spatial_scale = spatial_scale,
                                                    .channels = channels,
                                                    .height = height,
                                                    .width = width,
                                                    .pooled_height = pooled_height,
                                                    .pooled_width = pooled_width,
                                                    .sampling_ratio = sampling_ratio,
                                                    .aligned = aligned,
                                                    .output = output.mutable_data_ptr<scalar_t>(),
                                                }));
  });
  return output;
}

Tensor roi_align_backward_cuda(const Tensor& grad, const Tensor& rois, double spatial_scale,
                               int64_t pooled_height, int64_t pooled_width, int64_t batch_size,
                               int64_t channels, int64_t height, int64_t width,
                               int64_t sampling_ratio, bool aligned) {
  constexpr const char* op = "_roi_align_backward";
  check_cuda(op, "grad", grad);
  check_roi_backward_inputs(op, grad, rois, pooled_height, pooled_width, batch_size, channels,
                            height, width);
  check_sampling_ratio(op, sampling_ratio, pooled_height, pooled_width);

  const CudaDeviceGuard device_guard(grad);
  const int64_t total = grad.numel();
  if (total == 0 || batch_size * channels * height * width == 0) {
    return alloc_zeros(grad, {batch_size, channels, height, width});
  }
  alert_not_deterministic("opforge::roi_align_backward_cuda");

  const Tensor rois_c = as_contiguous(rois);
  const ScalarType acc_dtype = opmath_dtype(grad.scalar_type());
  auto grad_input = alloc_zeros(grad, {batch_size, channels, height, width}, acc_dtype);
  const cudaStream_t stream = current_cuda_stream(grad);
  OPFORGE_DISPATCH_FLOATING_TYPES(grad.scalar_type(), "opforge_roi_align_backward_cuda", [&] {
    OPFORGE_CUDA_CHECK(launch(elementwise_grid(total, stream),
                              RoiAlignBackward<scalar_t>{
                                  .total = total,
                                  .grad_output = grad.const_data_ptr<scalar_t>(),
                                  .grad_stride_n = grad.stride(0),
                                  .grad_stride_c = grad.stride(1),
                                  .grad_stride_h = grad.stride(2),
                                  .grad_stride_w = grad.stride(3),
                                  .rois = rois_c.const_data_ptr<scalar_t>(),
                                  .batch_size = batch_size,
                                  .spatial_scale = spatial_scale,
                                  .channels = channels,
                                  .height = height,
                                  .width = width,
                                  .pooled_height = pooled_height,
                                  .pooled_width = pooled_width,
                                  .sampling_ratio = sampling_ratio,
                                  .aligned = aligned,
                                  .grad_input = grad_input.mutable_data_ptr<opmath_t<scalar_t>>(),
                              }));
  });
  return to_dtype(grad_input, grad.scalar_type());
}

}  // namespace

OPFORGE_LIBRARY_IMPL(CUDA, m) {
  m.impl("roi_align", OPFORGE_KERNEL(roi_align_forward_cuda));
  m.impl("_roi_align_backward", OPFORGE_KERNEL(roi_align_backward_cuda));
}

}  // namespace opforge::cuda
