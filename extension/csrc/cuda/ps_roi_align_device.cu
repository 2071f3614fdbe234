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

}  // namespace

template <typename scalar_t>
cudaError_t launch(const Grid& grid, const PsRoiAlignForward<scalar_t>& a) {
  using acc_t = opmath_t<scalar_t>;
  ps_roi_align_forward_kernel<scalar_t, acc_t>
      <<<grid.blocks, grid.threads, grid.shared_bytes, grid.stream>>>(
          a.total, a.input, a.rois, a.batch_size, static_cast<acc_t>(a.spatial_scale), a.channels,
          a.height, a.width, a.pooled_height, a.pooled_width, a.sampling_ratio, a.channels_out,
          a.output, a.channel_mapping);
  return cudaGetLastError();
}

template <typename scalar_t>
cudaError_t launch(const Grid& grid, const PsRoiAlignBackward<scalar_t>& a) {
  using acc_t = opmath_t<scalar_t>;
  ps_roi_align_backward_kernel<scalar_t, acc_t>
      <<<grid.blocks, grid.threads, grid.shared_bytes, grid.stream>>>(
          a.total, a.grad_output, a.channel_mapping, a.rois, a.batch_size,
          static_cast<acc_t>(a.spatial_scale), a.channels, a.height, a.width, a.pooled_height,
          a.pooled_width, a.sampling_ratio, a.channels_out, a.grad_input);
  return cudaGetLastError();
}

OPFORGE_INSTANTIATE_LAUNCH(PsRoiAlignForward);
OPFORGE_INSTANTIATE_LAUNCH(PsRoiAlignBackward);

}  // namespace opforge::cuda
