// CUDA kernels for opforge::ps_roi_pool and opforge::_ps_roi_pool_backward (dispatch key CUDA).
//
// Forward: one thread per output element (roi, output channel c, ph, pw) averages input
// channel (c * PH + ph) * PW + pw over the quantized bin (ph, pw), which stops before the
// last input row and column as in torchvision, and records that channel in
// channel_mapping. Backward: one thread per grad element spreads its gradient evenly
// over the same bin of the channel channel_mapping names, with atomic adds (so under
// torch.use_deterministic_algorithms(True) it goes through alertNotDeterministic).
// Rois are not validated on the host (a device->host sync per call): an invalid roi
// reads nothing and yields 0; a channel_mapping entry outside [0, channels) writes nothing.
#include "cuda_utils.h"

namespace opforge::cuda {
namespace {

std::tuple<Tensor, Tensor> ps_roi_pool_forward_cuda(const Tensor& input, const Tensor& rois,
                                                    double spatial_scale, int64_t pooled_height,
                                                    int64_t pooled_width) {
  constexpr const char* op = "ps_roi_pool";
  check_cuda(op, "input", input);
  check_ps_roi_inputs(op, input, rois, pooled_height, pooled_width);
  const CudaDeviceGuard device_guard(input);
  const int64_t channels_out = input.size(1) / (pooled_height * pooled_width);
  auto output = alloc_empty(input, {rois.size(0), channels_out, pooled_height, pooled_width});
  auto channel_mapping = alloc_empty(input, sizes_of(output), ScalarType::Int);
  const int64_t total = output.numel();
  if (total == 0) {
    return {output, channel_mapping};
  }
  const Tensor input_c = as_contiguous(input);
  const Tensor rois_c = as_contiguous(rois);
  const cudaStream_t stream = current_cuda_stream(input);
  OPFORGE_DISPATCH_FLOATING_TYPES(input.scalar_type(), "opforge_ps_roi_pool_forward_cuda", [&] {
    OPFORGE_CUDA_CHECK(launch(elementwise_grid(total, stream),
                              PsRoiPoolForward<scalar_t>{
                                  .total = total,
                                  .input = input_c.const_data_ptr<scalar_t>(),
                                  .rois = rois_c.const_data_ptr<scalar_t>(),
                                  .batch_size = input.size(0),
                                  .spatial_scale = spatial_scale,
                                  .channels = input.size(1),
                                  .height = input.size(2),
                                  .width = input.size(3),
                                  .pooled_height = pooled_height,
                                  .pooled_width = pooled_width,
                                  .channels_out = channels_out,
                                  .output = output.mutable_data_ptr<scalar_t>(),
                                  .channel_mapping = channel_mapping.mutable_data_ptr<int32_t>(),
                              }));
  });
  return {output, channel_mapping};
}

Tensor ps_roi_pool_backward_cuda(const Tensor& grad, const Tensor& rois,
                                 const Tensor& channel_mapping, double spatial_scale,
                                 int64_t pooled_height, int64_t pooled_width, int64_t batch_size,
                                 int64_t channels, int64_t height, int64_t width) {
  constexpr const char* op = "_ps_roi_pool_backward";
  check_cuda(op, "grad", grad);
  check_ps_roi_backward_inputs(op, grad, rois, channel_mapping, pooled_height, pooled_width,
                               batch_size, channels, height, width);
  const CudaDeviceGuard device_guard(grad);
  const int64_t total = grad.numel();
  if (total == 0 || batch_size * channels * height * width == 0) {
    return alloc_zeros(grad, {batch_size, channels, height, width});
  }
  alert_not_deterministic("opforge::ps_roi_pool_backward_cuda");
  const Tensor grad_c = as_contiguous(grad);
  const Tensor rois_c = as_contiguous(rois);
  const Tensor mapping_c = as_contiguous(channel_mapping);
  const ScalarType acc_dtype = opmath_dtype(grad.scalar_type());
  auto grad_input = alloc_zeros(grad, {batch_size, channels, height, width}, acc_dtype);
  const cudaStream_t stream = current_cuda_stream(grad);
  OPFORGE_DISPATCH_FLOATING_TYPES(grad.scalar_type(), "opforge_ps_roi_pool_backward_cuda", [&] {
    OPFORGE_CUDA_CHECK(launch(elementwise_grid(total, stream),
                              PsRoiPoolBackward<scalar_t>{
                                  .total = total,
                                  .grad_output = grad_c.const_data_ptr<scalar_t>(),
                                  .channel_mapping = mapping_c.const_data_ptr<int32_t>(),
                                  .rois = rois_c.const_data_ptr<scalar_t>(),
                                  .batch_size = batch_size,
                                  .spatial_scale = spatial_scale,
                                  .channels = channels,
                                  .height = height,
                                  .width = width,
                                  .pooled_height = pooled_height,
                                  .pooled_width = pooled_width,
                                  .channels_out = grad.size(1),
                                  .grad_input = grad_input.mutable_data_ptr<opmath_t<scalar_t>>(),
                              }));
  });
  return to_dtype(grad_input, grad.scalar_type());
}

}  // namespace

OPFORGE_LIBRARY_IMPL(CUDA, m) {
  m.impl("ps_roi_pool", OPFORGE_KERNEL(ps_roi_pool_forward_cuda));
  m.impl("_ps_roi_pool_backward", OPFORGE_KERNEL(ps_roi_pool_backward_cuda));
}

}  // namespace opforge::cuda
