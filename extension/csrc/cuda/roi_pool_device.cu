// CUDA kernels for opforge::roi_pool and opforge::_roi_pool_backward (dispatch key CUDA).
//
// Forward: one thread per output element takes the max over its quantized bin and records
// the argmax (flat index into the H*W plane, -1 for an empty bin; int32 like torchvision).
// Backward: one thread per grad_output element adds its gradient at the argmax with an
// atomic add; rois that overlap make that order-dependent, so under
// torch.use_deterministic_algorithms(True) it goes through
// at::globalContext().alertNotDeterministic (an error, or a warning with warn_only=True).
#include <limits>

#include "device.cuh"

namespace opforge::cuda {
namespace {

// Rounds a roi coordinate to the input grid; the clamp keeps far-away rois finite in int64.
__device__ __forceinline__ int64_t round_coordinate(double value) {
  return static_cast<int64_t>(round(fmin(fmax(value, -1e15), 1e15)));
}

template <typename scalar_t, typename acc_t>
__global__ void roi_pool_forward_kernel(int64_t total, const scalar_t* __restrict__ input,
                                        const scalar_t* __restrict__ rois, int64_t batch_size,
                                        acc_t spatial_scale, int64_t channels, int64_t height,
                                        int64_t width, int64_t pooled_height, int64_t pooled_width,
                                        scalar_t* __restrict__ output,
                                        int32_t* __restrict__ argmax) {
  OPFORGE_CUDA_KERNEL_LOOP(index, total) {
    const int64_t pw = index % pooled_width;
    const int64_t ph = (index / pooled_width) % pooled_height;
    const int64_t c = (index / (pooled_width * pooled_height)) % channels;
    const int64_t n = index / (pooled_width * pooled_height * channels);

    const scalar_t* roi = rois + n * 5;
    if (!roi_is_valid<scalar_t, acc_t>(roi, batch_size)) {
      output[index] = static_cast<scalar_t>(0);
      argmax[index] = -1;
      continue;
    }
    const int64_t batch = static_cast<int64_t>(static_cast<acc_t>(roi[0]));
    const int64_t start_w = round_coordinate(static_cast<acc_t>(roi[1]) * spatial_scale);
    const int64_t start_h = round_coordinate(static_cast<acc_t>(roi[2]) * spatial_scale);
    const int64_t end_w = round_coordinate(static_cast<acc_t>(roi[3]) * spatial_scale);
    const int64_t end_h = round_coordinate(static_cast<acc_t>(roi[4]) * spatial_scale);
    // Malformed rois are forced to be 1x1.
    const int64_t roi_w = end_w - start_w + 1 > 1 ? end_w - start_w + 1 : 1;
    const int64_t roi_h = end_h - start_h + 1 > 1 ? end_h - start_h + 1 : 1;
    const acc_t bin_h = static_cast<acc_t>(roi_h) / static_cast<acc_t>(pooled_height);
    const acc_t bin_w = static_cast<acc_t>(roi_w) / static_cast<acc_t>(pooled_width);

    int64_t hstart = static_cast<int64_t>(floor(static_cast<acc_t>(ph) * bin_h));
    int64_t wstart = static_cast<int64_t>(floor(static_cast<acc_t>(pw) * bin_w));
    int64_t hend = static_cast<int64_t>(ceil(static_cast<acc_t>(ph + 1) * bin_h));
    int64_t wend = static_cast<int64_t>(ceil(static_cast<acc_t>(pw + 1) * bin_w));
    hstart = min(max(hstart + start_h, int64_t(0)), height);
    hend = min(max(hend + start_h, int64_t(0)), height);
    wstart = min(max(wstart + start_w, int64_t(0)), width);
    wend = min(max(wend + start_w, int64_t(0)), width);
    const bool empty = hend <= hstart || wend <= wstart;

    // Like torchvision: start from the lowest finite value, so NaN and -inf never win.
    acc_t best = empty ? acc_t(0) : static_cast<acc_t>(std::numeric_limits<scalar_t>::lowest());
    int64_t best_index = -1;
    const scalar_t* plane = input + (batch * channels + c) * height * width;
    for (int64_t h = hstart; h < hend; ++h) {
      for (int64_t w = wstart; w < wend; ++w) {
        const int64_t at = h * width + w;
        const acc_t v = static_cast<acc_t>(plane[at]);
        if (v > best) {
          best = v;
          best_index = at;
        }
      }
    }
    output[index] = static_cast<scalar_t>(best);
    argmax[index] = static_cast<int32_t>(best_index);
  }
}

template <typename scalar_t, typename acc_t>
__global__ void roi_pool_backward_kernel(
    int64_t total, const scalar_t* __restrict__ grad_output, int64_t grad_stride_n,
    int64_t grad_stride_c, int64_t grad_stride_h, int64_t grad_stride_w,
    const scalar_t* __restrict__ rois,
    const int32_t* __restrict__ argmax,  // contiguous (K, C, PH, PW)
    int64_t batch_size, int64_t channels, int64_t height, int64_t width, int64_t pooled_height,
    int64_t pooled_width, acc_t* __restrict__ grad_input) {
  OPFORGE_CUDA_KERNEL_LOOP(index, total) {
    const int64_t pw = index % pooled_width;
    const int64_t ph = (index / pooled_width) % pooled_height;
    const int64_t c = (index / (pooled_width * pooled_height)) % channels;
    const int64_t n = index / (pooled_width * pooled_height * channels);
    const int64_t at = argmax[index];
    const int64_t batch = static_cast<int64_t>(static_cast<acc_t>(rois[n * 5]));
    // A foreign or stale argmax must not write outside grad_input.
    if (at < 0 || at >= height * width || batch < 0 || batch >= batch_size) {
      continue;
    }
    const acc_t grad = static_cast<acc_t>(grad_output[n * grad_stride_n + c * grad_stride_c +
                                                      ph * grad_stride_h + pw * grad_stride_w]);
    OPFORGE_ATOMIC_ADD(grad_input + (batch * channels + c) * height * width + at, grad);
  }
}

}  // namespace

template <typename scalar_t>
cudaError_t launch(const Grid& grid, const RoiPoolForward<scalar_t>& a) {
  using acc_t = opmath_t<scalar_t>;
  roi_pool_forward_kernel<scalar_t, acc_t>
      <<<grid.blocks, grid.threads, grid.shared_bytes, grid.stream>>>(
          a.total, a.input, a.rois, a.batch_size, static_cast<acc_t>(a.spatial_scale), a.channels,
          a.height, a.width, a.pooled_height, a.pooled_width, a.output, a.argmax);
  return cudaGetLastError();
}

template <typename scalar_t>
cudaError_t launch(const Grid& grid, const RoiPoolBackward<scalar_t>& a) {
  using acc_t = opmath_t<scalar_t>;
  roi_pool_backward_kernel<scalar_t, acc_t>
      <<<grid.blocks, grid.threads, grid.shared_bytes, grid.stream>>>(
          a.total, a.grad_output, a.grad_stride_n, a.grad_stride_c, a.grad_stride_h,
          a.grad_stride_w, a.rois, a.argmax, a.batch_size, a.channels, a.height, a.width,
          a.pooled_height, a.pooled_width, a.grad_input);
  return cudaGetLastError();
}

OPFORGE_INSTANTIATE_LAUNCH(RoiPoolForward);
OPFORGE_INSTANTIATE_LAUNCH(RoiPoolBackward);

}  // namespace opforge::cuda
