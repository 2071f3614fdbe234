// CUDA kernels for opforge::roi_align and opforge::_roi_align_backward (dispatch key CUDA).
//
// Forward: one thread per output element (roi, channel, ph, pw), averaging bilinear
// samples of the feature map. Backward: one thread per grad_output element, scattering
// into grad_input with atomic adds. Float atomics make the backward nondeterministic, so
// under torch.use_deterministic_algorithms(True) it raises (or warns with warn_only=True)
// through at::globalContext().alertNotDeterministic, like the ATen ops without a
// deterministic CUDA path. Half and bfloat16 accumulate in float (at::acc_type), and the
// backward scatters into a float buffer, cast to the input dtype at the end.
#include <ATen/ATen.h>
#include <ATen/AccumulateType.h>
#include <ATen/cuda/Atomic.cuh>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>

#include "cuda_utils.cuh"

namespace opforge {
namespace cuda {
namespace {

// Bilinear sample of one (height, width) plane at (y, x); 0 outside [-1, height] x [-1, width].
template <typename scalar_t, typename acc_t>
__device__ acc_t bilinear_sample(
    const scalar_t* __restrict__ plane, int64_t height, int64_t width, acc_t y, acc_t x) {
  // Written so that NaN positions land here too.
  if (!(y >= acc_t(-1) && y <= acc_t(height) && x >= acc_t(-1) && x <= acc_t(width))) {
    return acc_t(0);
  }
  if (y <= acc_t(0)) y = acc_t(0);
  if (x <= acc_t(0)) x = acc_t(0);
  int64_t y_low = static_cast<int64_t>(y);
  int64_t x_low = static_cast<int64_t>(x);
  int64_t y_high;
  int64_t x_high;
  if (y_low >= height - 1) {
    y_high = y_low = height - 1;
    y = static_cast<acc_t>(y_low);
  } else {
    y_high = y_low + 1;
  }
  if (x_low >= width - 1) {
    x_high = x_low = width - 1;
    x = static_cast<acc_t>(x_low);
  } else {
    x_high = x_low + 1;
  }
  const acc_t ly = y - static_cast<acc_t>(y_low);
  const acc_t lx = x - static_cast<acc_t>(x_low);
  const acc_t hy = acc_t(1) - ly;
  const acc_t hx = acc_t(1) - lx;
  const acc_t v1 = static_cast<acc_t>(plane[y_low * width + x_low]);
  const acc_t v2 = static_cast<acc_t>(plane[y_low * width + x_high]);
  const acc_t v3 = static_cast<acc_t>(plane[y_high * width + x_low]);
  const acc_t v4 = static_cast<acc_t>(plane[y_high * width + x_high]);
  return hy * hx * v1 + hy * lx * v2 + ly * hx * v3 + ly * lx * v4;
}

// The four corner offsets and weights of a bilinear sample; all weights 0 outside.
template <typename acc_t>
__device__ void bilinear_corners(
    int64_t height, int64_t width, acc_t y, acc_t x,
    acc_t& w1, acc_t& w2, acc_t& w3, acc_t& w4,
    int64_t& o1, int64_t& o2, int64_t& o3, int64_t& o4) {
  if (!(y >= acc_t(-1) && y <= acc_t(height) && x >= acc_t(-1) && x <= acc_t(width))) {
    w1 = w2 = w3 = w4 = acc_t(0);
    o1 = o2 = o3 = o4 = -1;
    return;
  }
  if (y <= acc_t(0)) y = acc_t(0);
  if (x <= acc_t(0)) x = acc_t(0);
  int64_t y_low = static_cast<int64_t>(y);
  int64_t x_low = static_cast<int64_t>(x);
  int64_t y_high;
  int64_t x_high;
  if (y_low >= height - 1) {
    y_high = y_low = height - 1;
    y = static_cast<acc_t>(y_low);
  } else {
    y_high = y_low + 1;
  }
  if (x_low >= width - 1) {
    x_high = x_low = width - 1;
    x = static_cast<acc_t>(x_low);
  } else {
    x_high = x_low + 1;
  }
  const acc_t ly = y - static_cast<acc_t>(y_low);
  const acc_t lx = x - static_cast<acc_t>(x_low);
  const acc_t hy = acc_t(1) - ly;
  const acc_t hx = acc_t(1) - lx;
  w1 = hy * hx;
  w2 = hy * lx;
  w3 = ly * hx;
  w4 = ly * lx;
  o1 = y_low * width + x_low;
  o2 = y_low * width + x_high;
  o3 = y_high * width + x_low;
  o4 = y_high * width + x_high;
}

// Geometry of one roi, shared by forward and backward.
template <typename acc_t>
struct RoiGeometry {
  bool valid;  // batch index in range and finite coordinates (see roi_is_valid)
  int64_t batch;
  acc_t start_y, start_x, bin_h, bin_w;
  int64_t grid_h, grid_w;
  acc_t count;
};

template <typename scalar_t, typename acc_t>
__device__ RoiGeometry<acc_t> roi_geometry(
    const scalar_t* __restrict__ roi, int64_t batch_size, acc_t spatial_scale,
    int64_t pooled_height, int64_t pooled_width, int64_t sampling_ratio, bool aligned) {
  RoiGeometry<acc_t> g;
  g.valid = roi_is_valid<acc_t>(
      static_cast<acc_t>(roi[0]), static_cast<acc_t>(roi[1]), static_cast<acc_t>(roi[2]),
      static_cast<acc_t>(roi[3]), static_cast<acc_t>(roi[4]), batch_size);
  if (!g.valid) {
    return g;
  }
  g.batch = static_cast<int64_t>(static_cast<acc_t>(roi[0]));
  const acc_t offset = aligned ? acc_t(0.5) : acc_t(0);
  g.start_x = static_cast<acc_t>(roi[1]) * spatial_scale - offset;
  g.start_y = static_cast<acc_t>(roi[2]) * spatial_scale - offset;
  const acc_t end_x = static_cast<acc_t>(roi[3]) * spatial_scale - offset;
  const acc_t end_y = static_cast<acc_t>(roi[4]) * spatial_scale - offset;
  acc_t roi_w = end_x - g.start_x;
  acc_t roi_h = end_y - g.start_y;
  if (!aligned) {
    // Legacy behaviour: malformed rois are forced to be 1x1.
    roi_w = roi_w > acc_t(1) ? roi_w : acc_t(1);
    roi_h = roi_h > acc_t(1) ? roi_h : acc_t(1);
  }
  g.bin_h = roi_h / static_cast<acc_t>(pooled_height);
  g.bin_w = roi_w / static_cast<acc_t>(pooled_width);
  // Adaptive sampling: about one sample per input pixel in each bin (0 for empty rois).
  g.grid_h = sampling_ratio > 0
      ? sampling_ratio
      : static_cast<int64_t>(fmax(0.0, ceil(static_cast<double>(roi_h / static_cast<acc_t>(pooled_height)))));
  g.grid_w = sampling_ratio > 0
      ? sampling_ratio
      : static_cast<int64_t>(fmax(0.0, ceil(static_cast<double>(roi_w / static_cast<acc_t>(pooled_width)))));
  const int64_t samples = g.grid_h * g.grid_w;
  g.count = static_cast<acc_t>(samples > 1 ? samples : 1);
  return g;
}

template <typename scalar_t, typename acc_t>
__global__ void roi_align_forward_kernel(
    int64_t total,
    const scalar_t* __restrict__ input,
    const scalar_t* __restrict__ rois,
    int64_t batch_size,
    acc_t spatial_scale,
    int64_t channels,
    int64_t height,
    int64_t width,
    int64_t pooled_height,
    int64_t pooled_width,
    int64_t sampling_ratio,
    bool aligned,
    scalar_t* __restrict__ output) {
  OPFORGE_CUDA_KERNEL_LOOP(index, total) {
    const int64_t pw = index % pooled_width;
    const int64_t ph = (index / pooled_width) % pooled_height;
    const int64_t c = (index / (pooled_width * pooled_height)) % channels;
    const int64_t n = index / (pooled_width * pooled_height * channels);

    const RoiGeometry<acc_t> g = roi_geometry<scalar_t, acc_t>(
        rois + n * 5, batch_size, spatial_scale, pooled_height, pooled_width, sampling_ratio,
        aligned);
    if (!g.valid) {
      output[index] = static_cast<scalar_t>(0);
      continue;
    }
    const scalar_t* plane = input + (g.batch * channels + c) * height * width;

    acc_t sum = 0;
    for (int64_t iy = 0; iy < g.grid_h; ++iy) {
      const acc_t y = g.start_y + static_cast<acc_t>(ph) * g.bin_h +
          (static_cast<acc_t>(iy) + acc_t(0.5)) * g.bin_h / static_cast<acc_t>(g.grid_h);
      for (int64_t ix = 0; ix < g.grid_w; ++ix) {
        const acc_t x = g.start_x + static_cast<acc_t>(pw) * g.bin_w +
            (static_cast<acc_t>(ix) + acc_t(0.5)) * g.bin_w / static_cast<acc_t>(g.grid_w);
        sum += bilinear_sample<scalar_t, acc_t>(plane, height, width, y, x);
      }
    }
    output[index] = static_cast<scalar_t>(sum / g.count);
  }
}

template <typename scalar_t, typename acc_t>
__global__ void roi_align_backward_kernel(
    int64_t total,
    const scalar_t* __restrict__ grad_output,
    int64_t grad_stride_n,
    int64_t grad_stride_c,
    int64_t grad_stride_h,
    int64_t grad_stride_w,
    const scalar_t* __restrict__ rois,
    int64_t batch_size,
    acc_t spatial_scale,
    int64_t channels,
    int64_t height,
    int64_t width,
    int64_t pooled_height,
    int64_t pooled_width,
    int64_t sampling_ratio,
    bool aligned,
    acc_t* __restrict__ grad_input) {
  OPFORGE_CUDA_KERNEL_LOOP(index, total) {
    const int64_t pw = index % pooled_width;
    const int64_t ph = (index / pooled_width) % pooled_height;
    const int64_t c = (index / (pooled_width * pooled_height)) % channels;
    const int64_t n = index / (pooled_width * pooled_height * channels);

    const RoiGeometry<acc_t> g = roi_geometry<scalar_t, acc_t>(
        rois + n * 5, batch_size, spatial_scale, pooled_height, pooled_width, sampling_ratio,
        aligned);
    if (!g.valid) {
      continue;
    }
    const acc_t grad = static_cast<acc_t>(grad_output[
        n * grad_stride_n + c * grad_stride_c + ph * grad_stride_h + pw * grad_stride_w]) /
        g.count;
    acc_t* plane = grad_input + (g.batch * channels + c) * height * width;
    const int64_t plane_numel = height * width;

    for (int64_t iy = 0; iy < g.grid_h; ++iy) {
      const acc_t y = g.start_y + static_cast<acc_t>(ph) * g.bin_h +
          (static_cast<acc_t>(iy) + acc_t(0.5)) * g.bin_h / static_cast<acc_t>(g.grid_h);
      for (int64_t ix = 0; ix < g.grid_w; ++ix) {
        const acc_t x = g.start_x + static_cast<acc_t>(pw) * g.bin_w +
            (static_cast<acc_t>(ix) + acc_t(0.5)) * g.bin_w / static_cast<acc_t>(g.grid_w);
        acc_t w1, w2, w3, w4;
        int64_t o1, o2, o3, o4;
        bilinear_corners<acc_t>(height, width, y, x, w1, w2, w3, w4, o1, o2, o3, o4);
        if (o1 >= 0 && o1 < plane_numel) {
          gpuAtomicAdd(plane + o1, grad * w1);
          gpuAtomicAdd(plane + o2, grad * w2);
          gpuAtomicAdd(plane + o3, grad * w3);
          gpuAtomicAdd(plane + o4, grad * w4);
        }
      }
    }
  }
}

// The CPU kernel's bound on samples per roi (adaptive sampling of a huge roi would
// otherwise keep the GPU busy for hours), checked on the host copy of the rois.
constexpr int64_t kMaxSamplesPerRoi = int64_t(1) << 24;

void check_sample_count(
    const char* op, const at::Tensor& host_rois, double spatial_scale, int64_t pooled_height,
    int64_t pooled_width, int64_t sampling_ratio, bool aligned) {
  if (sampling_ratio > 0) {
    TORCH_CHECK(
        double(sampling_ratio) * double(sampling_ratio) * double(pooled_height) *
                double(pooled_width) <= double(kMaxSamplesPerRoi),
        op, ": sampling_ratio ", sampling_ratio, " needs more than ", kMaxSamplesPerRoi,
        " samples per roi; pass a smaller sampling_ratio");
    return;
  }
  const auto r = host_rois.to(at::kDouble);
  const double* p = r.const_data_ptr<double>();
  const double offset = aligned ? 0.5 : 0.0;
  for (int64_t n = 0; n < r.size(0); ++n) {
    double roi_w = (p[n * 5 + 3] * spatial_scale - offset) - (p[n * 5 + 1] * spatial_scale - offset);
    double roi_h = (p[n * 5 + 4] * spatial_scale - offset) - (p[n * 5 + 2] * spatial_scale - offset);
    if (!aligned) {
      roi_w = std::max(roi_w, 1.0);
      roi_h = std::max(roi_h, 1.0);
    }
    const double grid_h = std::max(0.0, std::ceil(roi_h / pooled_height));
    const double grid_w = std::max(0.0, std::ceil(roi_w / pooled_width));
    TORCH_CHECK(
        grid_h * grid_w * pooled_height * pooled_width <= double(kMaxSamplesPerRoi),
        op, ": a roi of ", roi_h, " x ", roi_w, " (after spatial_scale) with sampling_ratio ",
        sampling_ratio, " needs more than ", kMaxSamplesPerRoi,
        " samples; pass a small positive sampling_ratio");
  }
}

at::Tensor roi_align_forward_cuda(
    const at::Tensor& input,
    const at::Tensor& rois,
    double spatial_scale,
    int64_t pooled_height,
    int64_t pooled_width,
    int64_t sampling_ratio,
    bool aligned) {
  constexpr const char* op = "roi_align";
  check_cuda(op, "input", input);
  check_roi_inputs(op, input, rois, pooled_height, pooled_width);

  const c10::cuda::CUDAGuard device_guard(input.device());
  const int64_t num_rois = rois.size(0);
  const int64_t channels = input.size(1);
  const int64_t height = input.size(2);
  const int64_t width = input.size(3);
  auto output = at::empty({num_rois, channels, pooled_height, pooled_width}, input.options());
  const int64_t total = output.numel();
  if (total == 0) {
    return output;
  }
  const auto host_rois = check_rois_values_cuda(op, rois, input.size(0));
  if (host_rois.defined()) {
    check_sample_count(op, host_rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned);
  }
  if (input.numel() == 0) {
    return output.zero_();  // an empty (H, W) plane: every sample is outside
  }

  const auto input_c = input.contiguous();
  const auto rois_c = rois.contiguous();
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::ScalarType::Half, at::ScalarType::BFloat16, input.scalar_type(),
      "opforge_roi_align_forward_cuda", [&] {
        using acc_t = at::acc_type<scalar_t, /*is_cuda=*/true>;
        roi_align_forward_kernel<scalar_t, acc_t>
            <<<capped_blocks(total), kThreadsPerBlock, 0, stream>>>(
                total, input_c.const_data_ptr<scalar_t>(), rois_c.const_data_ptr<scalar_t>(),
                input.size(0), static_cast<acc_t>(spatial_scale), channels, height, width, pooled_height,
                pooled_width, sampling_ratio, aligned, output.data_ptr<scalar_t>());
      });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return output;
}

at::Tensor roi_align_backward_cuda(
    const at::Tensor& grad,
    const at::Tensor& rois,
    double spatial_scale,
    int64_t pooled_height,
    int64_t pooled_width,
    int64_t batch_size,
    int64_t channels,
    int64_t height,
    int64_t width,
    int64_t sampling_ratio,
    bool aligned) {
  constexpr const char* op = "_roi_align_backward";
  check_cuda(op, "grad", grad);
  check_roi_backward_inputs(
      op, grad, rois, pooled_height, pooled_width, batch_size, channels, height, width);
  TORCH_CHECK(
      is_supported_float(grad), op, ": grad must be a floating point tensor, got ",
      grad.scalar_type());

  const c10::cuda::CUDAGuard device_guard(grad.device());
  const int64_t total = grad.numel();
  if (total == 0 || batch_size * channels * height * width == 0) {
    return at::zeros({batch_size, channels, height, width}, grad.options());
  }
  check_rois_values_cuda(op, rois, batch_size);
  at::globalContext().alertNotDeterministic("opforge::roi_align_backward_cuda");

  const auto rois_c = rois.contiguous();
  const auto acc_dtype = at::toAccumulateType(grad.scalar_type(), /*is_cuda=*/true);
  auto grad_input = at::zeros({batch_size, channels, height, width}, grad.options().dtype(acc_dtype));
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::ScalarType::Half, at::ScalarType::BFloat16, grad.scalar_type(),
      "opforge_roi_align_backward_cuda", [&] {
        using acc_t = at::acc_type<scalar_t, /*is_cuda=*/true>;
        roi_align_backward_kernel<scalar_t, acc_t>
            <<<capped_blocks(total), kThreadsPerBlock, 0, stream>>>(
                total, grad.const_data_ptr<scalar_t>(), grad.stride(0), grad.stride(1),
                grad.stride(2), grad.stride(3), rois_c.const_data_ptr<scalar_t>(),
                batch_size, static_cast<acc_t>(spatial_scale), channels, height, width, pooled_height,
                pooled_width, sampling_ratio, aligned, grad_input.data_ptr<acc_t>());
      });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return grad_input.scalar_type() == grad.scalar_type() ? grad_input
                                                        : grad_input.to(grad.scalar_type());
}

}  // namespace

TORCH_LIBRARY_IMPL(opforge, CUDA, m) {
  m.impl("roi_align", TORCH_FN(roi_align_forward_cuda));
  m.impl("_roi_align_backward", TORCH_FN(roi_align_backward_cuda));
}

}  // namespace cuda
}  // namespace opforge
