// CUDA kernels for opforge::roi_align and opforge::_roi_align_backward (dispatch key CUDA).
//
// Forward: one thread per output element (roi, channel, ph, pw), averaging bilinear
// samples of the feature map. Backward: one thread per grad_output element, scattering
// into grad_input with atomic adds. Float atomics make the backward nondeterministic, so
// under torch.use_deterministic_algorithms(True) it raises (or warns with warn_only=True)
// through at::globalContext().alertNotDeterministic, like the ATen ops without a
// deterministic CUDA path. Half and bfloat16 accumulate in float (at::acc_type), and the
// backward scatters into a float buffer, cast to the input dtype at the end.
#include <algorithm>
#include <cmath>

#include "roi_sampling.cuh"

namespace opforge::cuda {
namespace {

template <typename scalar_t, typename acc_t>
__global__ void roi_align_forward_kernel(int64_t total, const scalar_t* __restrict__ input,
                                         const scalar_t* __restrict__ rois, int64_t batch_size,
                                         acc_t spatial_scale, int64_t channels, int64_t height,
                                         int64_t width, int64_t pooled_height, int64_t pooled_width,
                                         int64_t sampling_ratio, bool aligned,
                                         scalar_t* __restrict__ output) {
  OPFORGE_CUDA_KERNEL_LOOP(index, total) {
    const int64_t pw = index % pooled_width;
    const int64_t ph = (index / pooled_width) % pooled_height;
    const int64_t c = (index / (pooled_width * pooled_height)) % channels;
    const int64_t n = index / (pooled_width * pooled_height * channels);

    const RoiGeometry<acc_t> g = roi_geometry<scalar_t, acc_t>(
        rois + n * 5, batch_size, spatial_scale, pooled_height, pooled_width, sampling_ratio,
        aligned, /*empty_is_nan=*/false);
    if (!g.valid) {
      output[index] = static_cast<scalar_t>(0);
      continue;
    }
    const scalar_t* plane = input + (g.batch * channels + c) * height * width;

    acc_t sum = 0;
    for_each_sample(g, ph, pw, [&](acc_t y, acc_t x) {
      sum += bilinear_sample<scalar_t, acc_t>(plane, height, width, y, x);
    });
    output[index] = static_cast<scalar_t>(sum / g.count);
  }
}

template <typename scalar_t, typename acc_t>
__global__ void roi_align_backward_kernel(int64_t total, const scalar_t* __restrict__ grad_output,
                                          int64_t grad_stride_n, int64_t grad_stride_c,
                                          int64_t grad_stride_h, int64_t grad_stride_w,
                                          const scalar_t* __restrict__ rois, int64_t batch_size,
                                          acc_t spatial_scale, int64_t channels, int64_t height,
                                          int64_t width, int64_t pooled_height,
                                          int64_t pooled_width, int64_t sampling_ratio,
                                          bool aligned, acc_t* __restrict__ grad_input) {
  OPFORGE_CUDA_KERNEL_LOOP(index, total) {
    const int64_t pw = index % pooled_width;
    const int64_t ph = (index / pooled_width) % pooled_height;
    const int64_t c = (index / (pooled_width * pooled_height)) % channels;
    const int64_t n = index / (pooled_width * pooled_height * channels);

    const RoiGeometry<acc_t> g = roi_geometry<scalar_t, acc_t>(
        rois + n * 5, batch_size, spatial_scale, pooled_height, pooled_width, sampling_ratio,
        aligned, /*empty_is_nan=*/false);
    if (!g.valid) {
      continue;
    }
    const acc_t grad = static_cast<acc_t>(grad_output[n * grad_stride_n + c * grad_stride_c +
                                                      ph * grad_stride_h + pw * grad_stride_w]) /
                       g.count;
    acc_t* plane = grad_input + (g.batch * channels + c) * height * width;
    for_each_sample(g, ph, pw, [&](acc_t y, acc_t x) {
      bilinear_scatter<acc_t>(plane, height, width, y, x, grad);
    });
  }
}

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
    using acc_t = opmath_t<scalar_t>;
    roi_align_forward_kernel<scalar_t, acc_t>
        <<<capped_blocks(total), kThreadsPerBlock, 0, stream>>>(
            total, input_c.const_data_ptr<scalar_t>(), rois_c.const_data_ptr<scalar_t>(),
            input.size(0), static_cast<acc_t>(spatial_scale), channels, height, width,
            pooled_height, pooled_width, sampling_ratio, aligned,
            output.mutable_data_ptr<scalar_t>());
  });
  OPFORGE_CUDA_LAUNCH_CHECK();
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
    using acc_t = opmath_t<scalar_t>;
    roi_align_backward_kernel<scalar_t, acc_t>
        <<<capped_blocks(total), kThreadsPerBlock, 0, stream>>>(
            total, grad.const_data_ptr<scalar_t>(), grad.stride(0), grad.stride(1), grad.stride(2),
            grad.stride(3), rois_c.const_data_ptr<scalar_t>(), batch_size,
            static_cast<acc_t>(spatial_scale), channels, height, width, pooled_height, pooled_width,
            sampling_ratio, aligned, grad_input.mutable_data_ptr<acc_t>());
  });
  OPFORGE_CUDA_LAUNCH_CHECK();
  return to_dtype(grad_input, grad.scalar_type());
}

}  // namespace

OPFORGE_LIBRARY_IMPL(CUDA, m) {
  m.impl("roi_align", OPFORGE_KERNEL(roi_align_forward_cuda));
  m.impl("_roi_align_backward", OPFORGE_KERNEL(roi_align_backward_cuda));
}

}  // namespace opforge::cuda
