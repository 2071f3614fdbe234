// CUDA kernels for opforge::ps_roi_align and opforge::_ps_roi_align_backward (dispatch key CUDA).
//
// Forward: one thread per output element (roi, output channel c, ph, pw) averages the
// bilinear samples of input channel (c * PH + ph) * PW + pw inside bin (ph, pw) and
// records that channel in channel_mapping. Backward: one thread per grad element
// scatters into the channel channel_mapping names, with atomic adds (so under
// torch.use_deterministic_algorithms(True) it goes through alertNotDeterministic).
// Rois are not validated on the host (that would be a device->host sync per call): an
// invalid roi (bad batch index, non-finite coordinate, too many samples) reads nothing
// and yields 0; a channel_mapping entry outside [0, channels) writes nothing.
#include <limits>

#include "roi_sampling.cuh"

namespace opforge::cuda {
namespace {

template <typename scalar_t, typename acc_t>
__global__ void ps_roi_align_forward_kernel(int64_t total, const scalar_t* __restrict__ input,
                                            const scalar_t* __restrict__ rois, int64_t batch_size,
                                            acc_t spatial_scale, int64_t channels, int64_t height,
                                            int64_t width, int64_t pooled_height,
                                            int64_t pooled_width, int64_t sampling_ratio,
                                            int64_t channels_out, scalar_t* __restrict__ output,
                                            int32_t* __restrict__ channel_mapping) {
  OPFORGE_CUDA_KERNEL_LOOP(index, total) {
    const int64_t pw = index % pooled_width;
    const int64_t ph = (index / pooled_width) % pooled_height;
    const int64_t c_out = (index / (pooled_width * pooled_height)) % channels_out;
    const int64_t n = index / (pooled_width * pooled_height * channels_out);
    const int64_t c_in = (c_out * pooled_height + ph) * pooled_width + pw;
    channel_mapping[index] = static_cast<int32_t>(c_in);

    const RoiGeometry<acc_t> g = roi_geometry<scalar_t, acc_t>(
        rois + n * 5, batch_size, spatial_scale, pooled_height, pooled_width, sampling_ratio,
        /*aligned=*/true, /*empty_is_nan=*/true);
    if (!g.valid) {
      output[index] = static_cast<scalar_t>(0);
      continue;
    }
    const scalar_t* plane = input + (g.batch * channels + c_in) * height * width;
    acc_t sum = 0;
    for_each_sample(g, ph, pw, [&](acc_t y, acc_t x) {
      sum += bilinear_sample<scalar_t, acc_t>(plane, height, width, y, x);
    });
    output[index] = static_cast<scalar_t>(sum / g.count);
  }
}

template <typename scalar_t, typename acc_t>
__global__ void ps_roi_align_backward_kernel(
    int64_t total,
    const scalar_t* __restrict__ grad_output,  // contiguous [K, C_out, PH, PW]
    const int32_t* __restrict__ channel_mapping, const scalar_t* __restrict__ rois,
    int64_t batch_size, acc_t spatial_scale, int64_t channels, int64_t height, int64_t width,
    int64_t pooled_height, int64_t pooled_width, int64_t sampling_ratio, int64_t channels_out,
    acc_t* __restrict__ grad_input) {
  OPFORGE_CUDA_KERNEL_LOOP(index, total) {
    const int64_t pw = index % pooled_width;
    const int64_t ph = (index / pooled_width) % pooled_height;
    const int64_t n = index / (pooled_width * pooled_height * channels_out);
    const int64_t c_in = channel_mapping[index];
    const RoiGeometry<acc_t> g = roi_geometry<scalar_t, acc_t>(
        rois + n * 5, batch_size, spatial_scale, pooled_height, pooled_width, sampling_ratio,
        /*aligned=*/true, /*empty_is_nan=*/true);
    if (!g.valid || c_in < 0 || c_in >= channels || g.grid_h <= 0 || g.grid_w <= 0) {
      continue;
    }
    const acc_t grad = static_cast<acc_t>(grad_output[index]) / g.count;
    acc_t* plane = grad_input + (g.batch * channels + c_in) * height * width;
    for_each_sample(g, ph, pw, [&](acc_t y, acc_t x) {
      bilinear_scatter<acc_t>(plane, height, width, y, x, grad);
    });
  }
}

std::tuple<Tensor, Tensor> ps_roi_align_forward_cuda(const Tensor& input, const Tensor& rois,
                                                     double spatial_scale, int64_t pooled_height,
                                                     int64_t pooled_width, int64_t sampling_ratio) {
  constexpr const char* op = "ps_roi_align";
  check_cuda(op, "input", input);
  check_ps_roi_inputs(op, input, rois, pooled_height, pooled_width);
  check_sampling_ratio(op, sampling_ratio, pooled_height, pooled_width);
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
  OPFORGE_DISPATCH_FLOATING_TYPES(input.scalar_type(), "opforge_ps_roi_align_forward_cuda", [&] {
    using acc_t = opmath_t<scalar_t>;
    ps_roi_align_forward_kernel<scalar_t, acc_t>
        <<<capped_blocks(total), kThreadsPerBlock, 0, stream>>>(
            total, input_c.const_data_ptr<scalar_t>(), rois_c.const_data_ptr<scalar_t>(),
            input.size(0), static_cast<acc_t>(spatial_scale), input.size(1), input.size(2),
            input.size(3), pooled_height, pooled_width, sampling_ratio, channels_out,
            output.mutable_data_ptr<scalar_t>(), channel_mapping.mutable_data_ptr<int32_t>());
  });
  OPFORGE_CUDA_LAUNCH_CHECK();
  return {output, channel_mapping};
}

Tensor ps_roi_align_backward_cuda(const Tensor& grad, const Tensor& rois,
                                  const Tensor& channel_mapping, double spatial_scale,
                                  int64_t pooled_height, int64_t pooled_width,
                                  int64_t sampling_ratio, int64_t batch_size, int64_t channels,
                                  int64_t height, int64_t width) {
  constexpr const char* op = "_ps_roi_align_backward";
  check_cuda(op, "grad", grad);
  check_ps_roi_backward_inputs(op, grad, rois, channel_mapping, pooled_height, pooled_width,
                               batch_size, channels, height, width);
  check_sampling_ratio(op, sampling_ratio, pooled_height, pooled_width);
  const CudaDeviceGuard device_guard(grad);
  const int64_t total = grad.numel();
  if (total == 0 || batch_size * channels * height * width == 0) {
    return alloc_zeros(grad, {batch_size, channels, height, width});
  }
  alert_not_deterministic("opforge::ps_roi_align_backward_cuda");
  const Tensor grad_c = as_contiguous(grad);
  const Tensor rois_c = as_contiguous(rois);
  const Tensor mapping_c = as_contiguous(channel_mapping);
  const ScalarType acc_dtype = opmath_dtype(grad.scalar_type());
  auto grad_input = alloc_zeros(grad, {batch_size, channels, height, width}, acc_dtype);
  const cudaStream_t stream = current_cuda_stream(grad);
  OPFORGE_DISPATCH_FLOATING_TYPES(grad.scalar_type(), "opforge_ps_roi_align_backward_cuda", [&] {
    using acc_t = opmath_t<scalar_t>;
    ps_roi_align_backward_kernel<scalar_t, acc_t>
        <<<capped_blocks(total), kThreadsPerBlock, 0, stream>>>(
            total, grad_c.const_data_ptr<scalar_t>(), mapping_c.const_data_ptr<int32_t>(),
            rois_c.const_data_ptr<scalar_t>(), batch_size, static_cast<acc_t>(spatial_scale),
            channels, height, width, pooled_height, pooled_width, sampling_ratio, grad.size(1),
            grad_input.mutable_data_ptr<acc_t>());
  });
  OPFORGE_CUDA_LAUNCH_CHECK();
  return to_dtype(grad_input, grad.scalar_type());
}

}  // namespace

OPFORGE_LIBRARY_IMPL(CUDA, m) {
  m.impl("ps_roi_align", OPFORGE_KERNEL(ps_roi_align_forward_cuda));
  m.impl("_ps_roi_align_backward", OPFORGE_KERNEL(ps_roi_align_backward_cuda));
}

}  // namespace opforge::cuda
