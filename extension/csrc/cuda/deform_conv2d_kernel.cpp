// CUDA kernels for opforge::deform_conv2d and opforge::_deform_conv2d_backward
// (dispatch key CUDA).
//
// The batch is processed in chunks of images. For each chunk:
//   forward:  im2col (bilinear samples at the offset positions, times the mask) into
//             columns (Cin*kh*kw, images*out_h*out_w), then one batched GEMM per group
//             through aten::bmm on the current stream.
//   backward: columns_grad = weight^T @ grad_out (aten::bmm); a coordinate kernel turns it
//             into grad_offset and grad_mask; col2im scatters it into grad_input with
//             atomic adds (hence alertNotDeterministic under deterministic mode); im2col
//             again and grad_out @ columns^T accumulates grad_weight.
// Sampling math runs in opmath_t (float for half/bfloat16); grad_input and
// grad_weight accumulate in that type and are cast to the input dtype at the end.
#include "cuda_utils.h"

namespace opforge::cuda {
namespace {

// Most images processed per chunk, and most elements in one columns buffer.
constexpr int64_t kMaxImagesPerChunk = 32;
constexpr int64_t kMaxColumnElements = int64_t(1) << 28;

struct Checked {
  DeformGeometry geometry;
  int64_t batch, out_channels, groups;
  DeformConv2dGeometry shared;  // what the shared checks (common.h) computed
};

// The shared argument checks (common.h, the same messages on every backend),
// turned into the geometry the kernels take.
Checked check_deform_args(const Tensor& input, const Tensor& weight, const Tensor& offset,
                          const Tensor& mask, const Tensor& bias, int64_t stride_h,
                          int64_t stride_w, int64_t pad_h, int64_t pad_w, int64_t dilation_h,
                          int64_t dilation_w, int64_t groups, int64_t offset_groups,
                          bool use_mask) {
  const DeformConv2dGeometry s = check_deform_conv2d_args(
      DeviceType::CUDA, input, weight, offset, mask, bias, stride_h, stride_w, pad_h, pad_w,
      dilation_h, dilation_w, groups, offset_groups, use_mask);
  DeformGeometry g;
  g.channels = s.channels;
  g.height = s.height;
  g.width = s.width;
  g.kernel_h = s.kernel_h;
  g.kernel_w = s.kernel_w;
  g.stride_h = s.stride_h;
  g.stride_w = s.stride_w;
  g.pad_h = s.pad_h;
  g.pad_w = s.pad_w;
  g.dilation_h = s.dilation_h;
  g.dilation_w = s.dilation_w;
  g.out_h = s.out_h;
  g.out_w = s.out_w;
  g.offset_groups = s.offset_groups;
  g.channels_per_offset_group = s.channels_per_offset_group();
  g.use_mask = s.use_mask;
  return Checked{g, s.batch, s.out_channels, s.groups, s};
}

int64_t images_per_chunk(const DeformGeometry& g, int64_t batch) {
  const int64_t per_image = g.channels * g.kernel_h * g.kernel_w * g.out_h * g.out_w;
  int64_t images = std::min(batch, kMaxImagesPerChunk);
  while (images > 1 && images * per_image > kMaxColumnElements) {
    images = (images + 1) / 2;
  }
  return std::max<int64_t>(images, 1);
}

template <typename scalar_t>
void launch_im2col(const DeformGeometry& g, int64_t b0, int64_t images, const Tensor& input,
                   const Tensor& offset, const Tensor& mask, const Tensor& columns,
                   cudaStream_t stream) {
  const int64_t total = g.channels * images * g.out_h * g.out_w;
  if (total == 0)
    return;
  OPFORGE_CUDA_CHECK(launch(elementwise_grid(total, stream),
                            DeformIm2col<scalar_t>{
                                .total = total,
                                .g = g,
                                .b0 = b0,
                                .images = images,
                                .input = input.const_data_ptr<scalar_t>(),
                                .offset = offset.const_data_ptr<scalar_t>(),
                                .mask = g.use_mask ? mask.const_data_ptr<scalar_t>() : nullptr,
                                .columns = columns.mutable_data_ptr<scalar_t>(),
                            }));
}

Tensor deform_conv2d_forward_cuda(const Tensor& input, const Tensor& weight, const Tensor& offset,
                                  const Tensor& mask, const Tensor& bias, int64_t stride_h,
                                  int64_t stride_w, int64_t pad_h, int64_t pad_w,
                                  int64_t dilation_h, int64_t dilation_w, int64_t groups,
                                  int64_t offset_groups, bool use_mask) {
  const Checked checked =
      check_deform_args(input, weight, offset, mask, bias, stride_h, stride_w, pad_h, pad_w,
                        dilation_h, dilation_w, groups, offset_groups, use_mask);
  const DeformGeometry& g = checked.geometry;
  const CudaDeviceGuard device_guard(input);
  const Tensor output = alloc_zeros(input, {checked.batch, checked.out_channels, g.out_h, g.out_w});
  if (output.numel() == 0) {
    return output;
  }
  const Tensor input_c = as_contiguous(input);
  const Tensor offset_c = as_contiguous(offset);
  const Tensor mask_c = use_mask ? as_contiguous(mask) : mask;
  const int64_t taps = g.kernel_h * g.kernel_w;
  const int64_t plane = g.out_h * g.out_w;
  // (g, Cout/g, Cin/g*taps)
  const Tensor weight_g =
      viewed(as_contiguous(weight), {groups, checked.out_channels / groups, -1});
  const int64_t chunk = images_per_chunk(g, checked.batch);
  const Tensor columns = alloc_empty(input, {g.channels * taps, chunk * plane});
  const cudaStream_t stream = current_cuda_stream(input);

  for (int64_t b0 = 0; b0 < checked.batch; b0 += chunk) {
    const int64_t images = std::min(chunk, checked.batch - b0);
    // The last chunk may hold fewer images; it gets its own (contiguous) buffer.
    const Tensor cols =
        images == chunk ? columns : alloc_empty(input, {g.channels * taps, images * plane});
    OPFORGE_DISPATCH_FLOATING_TYPES(input.scalar_type(), "opforge_deform_conv2d_forward_cuda", [&] {
      launch_im2col<scalar_t>(g, b0, images, input_c, offset_c, mask_c, cols, stream);
    });
    // (g, Cout/g, K) @ (g, K, images*plane) -> (Cout, images, plane) -> (images, Cout, plane)
    const Tensor out_g = batched_matmul(weight_g, viewed(cols, {groups, -1, images * plane}));
    copy_into(viewed(narrowed(output, 0, b0, images), {images, checked.out_channels, plane}),
              transposed(viewed(out_g, {checked.out_channels, images, plane}), 0, 1));
  }
  add_into(output, viewed(bias, {1, checked.out_channels, 1, 1}));
  return output;
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> deform_conv2d_backward_cuda(
    const Tensor& grad_out, const Tensor& input, const Tensor& weight, const Tensor& offset,
    const Tensor& mask, const Tensor& bias, int64_t stride_h, int64_t stride_w, int64_t pad_h,
    int64_t pad_w, int64_t dilation_h, int64_t dilation_w, int64_t groups, int64_t offset_groups,
    bool use_mask) {
  const Checked checked =
      check_deform_args(input, weight, offset, mask, bias, stride_h, stride_w, pad_h, pad_w,
                        dilation_h, dilation_w, groups, offset_groups, use_mask);
  const DeformGeometry& g = checked.geometry;
  check_deform_conv2d_grad(DeviceType::CUDA, grad_out, input, checked.shared);

  const CudaDeviceGuard device_guard(input);
  const ScalarType acc_dtype = opmath_dtype(input.scalar_type());
  const int64_t taps = g.kernel_h * g.kernel_w;
  const int64_t plane = g.out_h * g.out_w;
  const int64_t cout_g = checked.out_channels / groups;

  const Tensor grad_input_acc = alloc_zeros(input, sizes_of(input), acc_dtype);
  const Tensor grad_weight_acc =
      alloc_zeros(weight, {groups, cout_g, (g.channels / groups) * taps}, acc_dtype);
  const Tensor grad_offset = alloc_zeros(offset, sizes_of(offset));
  const Tensor grad_mask = alloc_zeros(mask, sizes_of(mask));
  const Tensor grad_bias = sum_over(grad_out, {0, 2, 3});

  if (grad_out.numel() > 0 && input.numel() > 0) {
    alert_not_deterministic("opforge::deform_conv2d_backward_cuda");
    const Tensor input_c = as_contiguous(input);
    const Tensor offset_c = as_contiguous(offset);
    const Tensor mask_c = use_mask ? as_contiguous(mask) : mask;
    const Tensor grad_c = as_contiguous(grad_out);
    // (g, K, Cout/g): weight^T per group.
    const Tensor weight_t = transposed(viewed(as_contiguous(weight), {groups, cout_g, -1}), 1, 2);
    const int64_t chunk = images_per_chunk(g, checked.batch);
    const cudaStream_t stream = current_cuda_stream(input);

    for (int64_t b0 = 0; b0 < checked.batch; b0 += chunk) {
      const int64_t images = std::min(chunk, checked.batch - b0);
      // (images, Cout, plane) -> (g, Cout/g, images*plane)
      const Tensor grad_g = reshaped(
          transposed(viewed(narrowed(grad_c, 0, b0, images), {images, checked.out_channels, plane}),
                     0, 1),
          {groups, cout_g, images * plane});
      // (g, K, images*plane), contiguous
      const Tensor columns_grad = batched_matmul(weight_t, grad_g);
      const Tensor columns = alloc_empty(input, {g.channels * taps, images * plane});
      OPFORGE_DISPATCH_FLOATING_TYPES(
          input.scalar_type(), "opforge_deform_conv2d_backward_cuda", [&] {
            const int64_t coord_total = images * g.offset_groups * taps * plane;
            OPFORGE_CUDA_CHECK(
                launch(elementwise_grid(coord_total, stream),
                       DeformCoordGrad<scalar_t>{
                           .total = coord_total,
                           .g = g,
                           .b0 = b0,
                           .images = images,
                           .columns_grad = columns_grad.const_data_ptr<scalar_t>(),
                           .input = input_c.const_data_ptr<scalar_t>(),
                           .offset = offset_c.const_data_ptr<scalar_t>(),
                           .mask = use_mask ? mask_c.const_data_ptr<scalar_t>() : nullptr,
                           .grad_offset = grad_offset.mutable_data_ptr<scalar_t>(),
                           .grad_mask = use_mask ? grad_mask.mutable_data_ptr<scalar_t>() : nullptr,
                       }));
            const int64_t col_total = g.channels * taps * images * plane;
            OPFORGE_CUDA_CHECK(
                launch(elementwise_grid(col_total, stream),
                       DeformCol2im<scalar_t>{
                           .total = col_total,
                           .g = g,
                           .b0 = b0,
                           .images = images,
                           .columns_grad = columns_grad.const_data_ptr<scalar_t>(),
                           .offset = offset_c.const_data_ptr<scalar_t>(),
                           .mask = use_mask ? mask_c.const_data_ptr<scalar_t>() : nullptr,
                           .grad_input = grad_input_acc.mutable_data_ptr<opmath_t<scalar_t>>(),
                       }));
            launch_im2col<scalar_t>(g, b0, images, input_c, offset_c, mask_c, columns, stream);
            // (g, Cout/g, images*plane) @ (g, images*plane, K) -> (g, Cout/g, K), added
            const Tensor gw = batched_matmul(
                grad_g, transposed(viewed(columns, {groups, -1, images * plane}), 1, 2));
            add_into(grad_weight_acc, gw);
          });
    }
  }
  const Tensor grad_input = to_dtype(grad_input_acc, input.scalar_type());
  const Tensor grad_weight =
      to_dtype(viewed(grad_weight_acc, sizes_of(weight)), weight.scalar_type());
  return std::make_tuple(grad_input, grad_weight, grad_offset, grad_mask, grad_bias);
}

}  // namespace

OPFORGE_LIBRARY_IMPL(CUDA, m) {
  m.impl("deform_conv2d", OPFORGE_KERNEL(deform_conv2d_forward_cuda));
  m.impl("_deform_conv2d_backward", OPFORGE_KERNEL(deform_conv2d_backward_cuda));
}

}  // namespace opforge::cuda
