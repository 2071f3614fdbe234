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

}  // namespace

template <typename scalar_t>
cudaError_t launch(const Grid& grid, const RoiAlignForward<scalar_t>& a) {
  using acc_t = opmath_t<scalar_t>;
  roi_align_forward_kernel<scalar_t, acc_t>
      <<<grid.blocks, grid.threads, grid.shared_bytes, grid.stream>>>(
          a.total, a.input, a.rois, a.batch_size, static_cast<acc_t>(a.spatial_scale), a.channels,
          a.height, a.width, a.pooled_height, a.pooled_width, a.sampling_ratio, a.aligned,
          a.output);
  return cudaGetLastError();
}

template <typename scalar_t>
cudaError_t launch(const Grid& grid, const RoiAlignBackward<scalar_t>& a) {
  using acc_t = opmath_t<scalar_t>;
  roi_align_backward_kernel<scalar_t, acc_t>
      <<<grid.blocks, grid.threads, grid.shared_bytes, grid.stream>>>(
          a.total, a.grad_output, a.grad_stride_n, a.grad_stride_c, a.grad_stride_h,
          a.grad_stride_w, a.rois, a.batch_size, static_cast<acc_t>(a.spatial_scale), a.channels,
          a.height, a.width, a.pooled_height, a.pooled_width, a.sampling_ratio, a.aligned,
          a.grad_input);
  return cudaGetLastError();
}

OPFORGE_INSTANTIATE_LAUNCH(RoiAlignForward);
OPFORGE_INSTANTIATE_LAUNCH(RoiAlignBackward);

}  // namespace opforge::cuda
