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
#include "device.cuh"

namespace opforge::cuda {
namespace {

// Rounds half away from zero; the clamp keeps far-away rois finite in int64.
__device__ __forceinline__ int64_t round_to_pixel(double value) {
  return static_cast<int64_t>(round(fmin(fmax(value, -1e15), 1e15)));
}

__device__ __forceinline__ int64_t clamp_to(int64_t v, int64_t hi) {
  return v < 0 ? 0 : (v > hi ? hi : v);
}

// Rows [h0, h1) and columns [w0, w1) of bin (ph, pw) of a valid roi.
struct PsBin {
  int64_t batch, h0, h1, w0, w1;
};

template <typename scalar_t, typename acc_t>
__device__ PsBin ps_bin(const scalar_t* __restrict__ roi, acc_t spatial_scale, int64_t height,
                        int64_t width, int64_t pooled_height, int64_t pooled_width, int64_t ph,
                        int64_t pw) {
  PsBin b;
  b.batch = static_cast<int64_t>(static_cast<acc_t>(roi[0]));
  const int64_t start_w = round_to_pixel(static_cast<acc_t>(roi[1]) * spatial_scale);
  const int64_t start_h = round_to_pixel(static_cast<acc_t>(roi[2]) * spatial_scale);
  const int64_t end_w = round_to_pixel(static_cast<acc_t>(roi[3]) * spatial_scale);
  const int64_t end_h = round_to_pixel(static_cast<acc_t>(roi[4]) * spatial_scale);
  // Malformed rois are forced to be at least 1x1.
  const acc_t bin_h = static_cast<acc_t>(end_h - start_h > 1 ? end_h - start_h : 1) /
                      static_cast<acc_t>(pooled_height);
  const acc_t bin_w = static_cast<acc_t>(end_w - start_w > 1 ? end_w - start_w : 1) /
                      static_cast<acc_t>(pooled_width);
  const int64_t last_h = height > 0 ? height - 1 : 0;
  const int64_t last_w = width > 0 ? width - 1 : 0;
  b.h0 = clamp_to(static_cast<int64_t>(floor(static_cast<acc_t>(ph) * bin_h)) + start_h, last_h);
  b.h1 = clamp_to(static_cast<int64_t>(ceil(static_cast<acc_t>(ph + 1) * bin_h)) + start_h, last_h);
  b.w0 = clamp_to(static_cast<int64_t>(floor(static_cast<acc_t>(pw) * bin_w)) + start_w, last_w);
  b.w1 = clamp_to(static_cast<int64_t>(ceil(static_cast<acc_t>(pw + 1) * bin_w)) + start_w, last_w);
  return b;
}

template <typename scalar_t, typename acc_t>
__global__ void ps_roi_pool_forward_kernel(int64_t total, const scalar_t* __restrict__ input,
                                           const scalar_t* __restrict__ rois, int64_t batch_size,
                                           acc_t spatial_scale, int64_t channels, int64_t height,
                                           int64_t width, int64_t pooled_height,
                                           int64_t pooled_width, int64_t channels_out,
                                           scalar_t* __restrict__ output,
                                           int32_t* __restrict__ channel_mapping) {
  OPFORGE_CUDA_KERNEL_LOOP(index, total) {
    const int64_t pw = index % pooled_width;
    const int64_t ph = (index / pooled_width) % pooled_height;
    const int64_t c_out = (index / (pooled_width * pooled_height)) % channels_out;
    const int64_t n = index / (pooled_width * pooled_height * channels_out);
    const int64_t c_in = (c_out * pooled_height + ph) * pooled_width + pw;
    channel_mapping[index] = static_cast<int32_t>(c_in);
    const scalar_t* roi = rois + n * 5;
    if (!roi_is_valid<scalar_t, acc_t>(roi, batch_size)) {
      output[index] = static_cast<scalar_t>(0);
      continue;
    }
    const PsBin b = ps_bin<scalar_t, acc_t>(roi, spatial_scale, height, width, pooled_height,
                                            pooled_width, ph, pw);
    if (b.h1 <= b.h0 || b.w1 <= b.w0) {
      output[index] = static_cast<scalar_t>(0);
      continue;
    }
    const scalar_t* plane = input + (b.batch * channels + c_in) * height * width;
    acc_t sum = 0;
    for (int64_t h = b.h0; h < b.h1; ++h) {
      for (int64_t w = b.w0; w < b.w1; ++w) {
        sum += static_cast<acc_t>(plane[h * width + w]);
      }
    }
    output[index] = static_cast<scalar_t>(sum / static_cast<acc_t>((b.h1 - b.h0) * (b.w1 - b.w0)));
  }
}

template <typename scalar_t, typename acc_t>
__global__ void ps_roi_pool_backward_kernel(
    int64_t total,
    const scalar_t* __restrict__ grad_output,  // contiguous [K, C_out, PH, PW]
    const int32_t* __restrict__ channel_mapping, const scalar_t* __restrict__ rois,
    int64_t batch_size, acc_t spatial_scale, int64_t channels, int64_t height, int64_t width,
    int64_t pooled_height, int64_t pooled_width, int64_t channels_out,
    acc_t* __restrict__ grad_input) {
  OPFORGE_CUDA_KERNEL_LOOP(index, total) {
    const int64_t pw = index % pooled_width;
    const int64_t ph = (index / pooled_width) % pooled_height;
    const int64_t n = index / (pooled_width * pooled_height * channels_out);
    const int64_t c_in = channel_mapping[index];
    const scalar_t* roi = rois + n * 5;
    if (c_in < 0 || c_in >= channels || !roi_is_valid<scalar_t, acc_t>(roi, batch_size)) {
      continue;
    }
    const PsBin b = ps_bin<scalar_t, acc_t>(roi, spatial_scale, height, width, pooled_height,
                                            pooled_width, ph, pw);
    if (b.h1 <= b.h0 || b.w1 <= b.w0) {
      continue;
    }
    const acc_t grad =
        static_cast<acc_t>(grad_output[index]) / static_cast<acc_t>((b.h1 - b.h0) * (b.w1 - b.w0));
    acc_t* plane = grad_input + (b.batch * channels + c_in) * height * width;
    for (int64_t h = b.h0; h < b.h1; ++h) {
      for (int64_t w = b.w0; w < b.w1; ++w) {
        OPFORGE_ATOMIC_ADD(plane + h * width + w, grad);
      }
    }
  }
}

}  // namespace

template <typename scalar_t>
cudaError_t launch(const Grid& grid, const PsRoiPoolForward<scalar_t>& a) {
  using acc_t = opmath_t<scalar_t>;
  ps_roi_pool_forward_kernel<scalar_t, acc_t>
      <<<grid.blocks, grid.threads, grid.shared_bytes, grid.stream>>>(
          a.total, a.input, a.rois, a.batch_size, static_cast<acc_t>(a.spatial_scale), a.channels,
          a.height, a.width, a.pooled_height, a.pooled_width, a.channels_out, a.output,
          a.channel_mapping);
  return cudaGetLastError();
}

template <typename scalar_t>
cudaError_t launch(const Grid& grid, const PsRoiPoolBackward<scalar_t>& a) {
  using acc_t = opmath_t<scalar_t>;
  ps_roi_pool_backward_kernel<scalar_t, acc_t>
      <<<grid.blocks, grid.threads, grid.shared_bytes, grid.stream>>>(
          a.total, a.grad_output, a.channel_mapping, a.rois, a.batch_size,
          static_cast<acc_t>(a.spatial_scale), a.channels, a.height, a.width, a.pooled_height,
          a.pooled_width, a.channels_out, a.grad_input);
  return cudaGetLastError();
}

OPFORGE_INSTANTIATE_LAUNCH(PsRoiPoolForward);
OPFORGE_INSTANTIATE_LAUNCH(PsRoiPoolBackward);

}  // namespace opforge::cuda
