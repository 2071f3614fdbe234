// CUDA kernels for opforge::roi_pool and opforge::_roi_pool_backward (dispatch key CUDA).
//
// Forward: one thread per output element takes the max over its quantized bin and records
// the argmax (flat index into the H*W plane, -1 for an empty bin; int32 like torchvision).
// Backward: one thread per grad_output element adds its gradient at the argmax with an
// atomic add; rois that overlap make that order-dependent, so under
// torch.use_deterministic_algorithms(True) it goes through
// at::globalContext().alertNotDeterministic (an error, or a warning with warn_only=True).
#include "cuda_utils.h"

namespace opforge::cuda {
namespace {

std::tuple<Tensor, Tensor> roi_pool_forward_cuda(const Tensor& input, const Tensor& rois,
                                                 double spatial_scale, int64_t pooled_height,
                                                 int64_t pooled_width) {
  constexpr const char* op = "roi_pool";
  check_cuda(op, "input", input);
  check_roi_inputs(op, input, rois, pooled_height, pooled_width);

  const CudaDeviceGuard device_guard(input);
  const int64_t num_rois = rois.size(0);
  const int64_t channels = input.size(1);
  const int64_t height = input.size(2);
  const int64_t width = input.size(3);
  auto output = alloc_empty(input, {num_rois, channels, pooled_height, pooled_width});
  auto argmax =
      alloc_empty(input, {num_rois, channels, pooled_height, pooled_width}, ScalarType::Int);
  const int64_t total = output.numel();
  if (total == 0) {
    return std::make_tuple(output, argmax);
  }
  // No host copy of the rois to validate them (a sync per call): an invalid roi reads
  // nothing and yields 0 with argmax -1 (roi_is_valid in the kernel).

  const Tensor input_c = as_contiguous(input);
  const Tensor rois_c = as_contiguous(rois);
  const cudaStream_t stream = current_cuda_stream(input);
  OPFORGE_DISPATCH_FLOATING_TYPES(input.scalar_type(), "opforge_roi_pool_forward_cuda", [&] {
    OPFORGE_CUDA_CHECK(
        launch(elementwise_grid(total, stream), RoiPoolForward<scalar_t>{
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
                                                    .output = output.mutable_data_ptr<scalar_t>(),
                                                    .argmax = argmax.mutable_data_ptr<int32_t>(),
                                                }));
  });
  return std::make_tuple(output, argmax);
}

Tensor roi_pool_backward_cuda(const Tensor& grad, const Tensor& rois, const Tensor& argmax,
                              double spatial_scale, int64_t pooled_height, int64_t pooled_width,
                              int64_t batch_size, int64_t channels, int64_t height, int64_t width) {
  constexpr const char* op = "_roi_pool_backward";
  (void)spatial_scale;  // the argmax already encodes the geometry
  check_cuda(op, "grad", grad);
  check_roi_backward_inputs(op, grad, rois, pooled_height, pooled_width, batch_size, channels,
                            height, width);
  check_int32_like_grad(op, "argmax", argmax, grad);

  const CudaDeviceGuard device_guard(grad);
  const int64_t total = grad.numel();
  if (total == 0 || batch_size * channels * height * width == 0) {
    return alloc_zeros(grad, {batch_size, channels, height, width});
  }
  alert_not_deterministic("opforge::roi_pool_backward_cuda");

  const Tensor rois_c = as_contiguous(rois);
  const Tensor argmax_c = as_contiguous(argmax);
  const ScalarType acc_dtype = opmath_dtype(grad.scalar_type());
  auto grad_input = alloc_zeros(grad, {batch_size, channels, height, width}, acc_dtype);
  const cudaStream_t stream = current_cuda_stream(grad);
  OPFORGE_DISPATCH_FLOATING_TYPES(grad.scalar_type(), "opforge_roi_pool_backward_cuda", [&] {
    OPFORGE_CUDA_CHECK(launch(elementwise_grid(total, stream),
                              RoiPoolBackward<scalar_t>{
                                  .total = total,
                                  .grad_output = grad.const_data_ptr<scalar_t>(),
                                  .grad_stride_n = grad.stride(0),
                                  .grad_stride_c = grad.stride(1),
                                  .grad_stride_h = grad.stride(2),
                                  .grad_stride_w = grad.stride(3),
                                  .rois = rois_c.const_data_ptr<scalar_t>(),
                                  .argmax = argmax_c.const_data_ptr<int32_t>(),
                                  .batch_size = batch_size,
                                  .channels = channels,
                                  .height = height,
                                  .width = width,
                                  .pooled_height = pooled_height,
                                  .pooled_width = pooled_width,
                                  .grad_input = grad_input.mutable_data_ptr<opmath_t<scalar_t>>(),
                              }));
  });
  return to_dtype(grad_input, grad.scalar_type());
}

}  // namespace

OPFORGE_LIBRARY_IMPL(CUDA, m) {
  m.impl("roi_pool", OPFORGE_KERNEL(roi_pool_forward_cuda));
  m.impl("_roi_pool_backward", OPFORGE_KERNEL(roi_pool_backward_cuda));
}

}  // namespace opforge::cuda
