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
#include <ATen/ATen.h>
#include <ATen/AccumulateType.h>
#include <ATen/cuda/Atomic.cuh>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

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

std::tuple<at::Tensor, at::Tensor> ps_roi_align_forward_cuda(
    const at::Tensor& input, const at::Tensor& rois, double spatial_scale, int64_t pooled_height,
    int64_t pooled_width, int64_t sampling_ratio) {
  constexpr const char* op = "ps_roi_align";
  check_cuda(op, "input", input);
  check_ps_roi_inputs(op, input, rois, pooled_height, pooled_width);
  check_sampling_ratio(op, sampling_ratio, pooled_height, pooled_width);
  const c10::cuda::CUDAGuard device_guard(input.device());
  const int64_t channels_out = input.size(1) / (pooled_height * pooled_width);
  auto output =
      at::empty({rois.size(0), channels_out, pooled_height, pooled_width}, input.options());
  auto channel_mapping = at::empty(output.sizes(), input.options().dtype(at::kInt));
  const int64_t total = output.numel();
  if (total == 0) {
    return {output, channel_mapping};
  }
  const auto input_c = input.contiguous();
  const auto rois_c = rois.contiguous();
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::ScalarType::Half, at::ScalarType::BFloat16, input.scalar_type(),
      "opforge_ps_roi_align_forward_cuda", [&] {
        using acc_t = at::acc_type<scalar_t, /*is_cuda=*/true>;
        ps_roi_align_forward_kernel<scalar_t, acc_t>
            <<<capped_blocks(total), kThreadsPerBlock, 0, stream>>>(
                total, input_c.const_data_ptr<scalar_t>(), rois_c.const_data_ptr<scalar_t>(),
                input.size(0), static_cast<acc_t>(spatial_scale), input.size(1), input.size(2),
                input.size(3), pooled_height, pooled_width, sampling_ratio, channels_out,
                output.data_ptr<scalar_t>(), channel_mapping.data_ptr<int32_t>());
      });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {output, channel_mapping};
}

at::Tensor ps_roi_align_backward_cuda(const at::Tensor& grad, const at::Tensor& rois,
                                      const at::Tensor& channel_mapping, double spatial_scale,
                                      int64_t pooled_height, int64_t pooled_width,
                                      int64_t sampling_ratio, int64_t batch_size, int64_t channels,
                                      int64_t height, int64_t width) {
  constexpr const char* op = "_ps_roi_align_backward";
  check_cuda(op, "grad", grad);
  check_ps_roi_backward_inputs(op, grad, rois, channel_mapping, pooled_height, pooled_width,
                               batch_size, channels, height, width);
  check_sampling_ratio(op, sampling_ratio, pooled_height, pooled_width);
  const c10::cuda::CUDAGuard device_guard(grad.device());
  const int64_t total = grad.numel();
  if (total == 0 || batch_size * channels * height * width == 0) {
    return at::zeros({batch_size, channels, height, width}, grad.options());
  }
  at::globalContext().alertNotDeterministic("opforge::ps_roi_align_backward_cuda");
  const auto grad_c = grad.contiguous();
  const auto rois_c = rois.contiguous();
  const auto mapping_c = channel_mapping.contiguous();
  const auto acc_dtype = at::toAccumulateType(grad.scalar_type(), /*is_cuda=*/true);
  auto grad_input =
      at::zeros({batch_size, channels, height, width}, grad.options().dtype(acc_dtype));
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::ScalarType::Half, at::ScalarType::BFloat16, grad.scalar_type(),
      "opforge_ps_roi_align_backward_cuda", [&] {
        using acc_t = at::acc_type<scalar_t, /*is_cuda=*/true>;
        ps_roi_align_backward_kernel<scalar_t, acc_t>
            <<<capped_blocks(total), kThreadsPerBlock, 0, stream>>>(
                total, grad_c.const_data_ptr<scalar_t>(), mapping_c.const_data_ptr<int32_t>(),
                rois_c.const_data_ptr<scalar_t>(), batch_size, static_cast<acc_t>(spatial_scale),
                channels, height, width, pooled_height, pooled_width, sampling_ratio, grad.size(1),
                grad_input.data_ptr<acc_t>());
      });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return grad_input.scalar_type() == grad.scalar_type() ? grad_input
                                                        : grad_input.to(grad.scalar_type());
}

}  // namespace

TORCH_LIBRARY_IMPL(opforge, CUDA, m) {
  m.impl("ps_roi_align", TORCH_FN(ps_roi_align_forward_cuda));
  m.impl("_ps_roi_align_backward", TORCH_FN(ps_roi_align_backward_cuda));
}

}  // namespace opforge::cuda
