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
#include "cuda_utils.cuh"

namespace opforge::cuda {
namespace {

// Most images processed per chunk, and most elements in one columns buffer.
constexpr int64_t kMaxImagesPerChunk = 32;
constexpr int64_t kMaxColumnElements = int64_t(1) << 28;

struct DeformGeometry {
  int64_t channels, height, width;
  int64_t kernel_h, kernel_w;
  int64_t stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w;
  int64_t out_h, out_w;
  int64_t offset_groups, channels_per_offset_group;
  bool use_mask;
};

// Whether (h, w) samples the plane at all; written so that NaN coordinates fail it.
template <typename acc_t>
__device__ __forceinline__ bool samples_inside(acc_t h, acc_t w, int64_t height, int64_t width) {
  return h > acc_t(-1) && h < acc_t(height) && w > acc_t(-1) && w < acc_t(width);
}

// Bilinear sample of one plane at a point inside (samples_inside); corners outside the
// plane count as 0.
template <typename scalar_t, typename acc_t>
__device__ acc_t deform_sample(const scalar_t* __restrict__ plane, int64_t height, int64_t width,
                               acc_t h, acc_t w) {
  const int64_t h_low = static_cast<int64_t>(floor(h));
  const int64_t w_low = static_cast<int64_t>(floor(w));
  const int64_t h_high = h_low + 1;
  const int64_t w_high = w_low + 1;
  const acc_t lh = h - static_cast<acc_t>(h_low);
  const acc_t lw = w - static_cast<acc_t>(w_low);
  const acc_t hh = acc_t(1) - lh;
  const acc_t hw = acc_t(1) - lw;
  const bool top = h_low >= 0, bottom = h_high <= height - 1;
  const bool left = w_low >= 0, right = w_high <= width - 1;
  const acc_t v1 = top && left ? static_cast<acc_t>(plane[h_low * width + w_low]) : acc_t(0);
  const acc_t v2 = top && right ? static_cast<acc_t>(plane[h_low * width + w_high]) : acc_t(0);
  const acc_t v3 = bottom && left ? static_cast<acc_t>(plane[h_high * width + w_low]) : acc_t(0);
  const acc_t v4 = bottom && right ? static_cast<acc_t>(plane[h_high * width + w_high]) : acc_t(0);
  return hh * hw * v1 + hh * lw * v2 + lh * hw * v3 + lh * lw * v4;
}

// Value and partial derivatives (d/dh, d/dw) of deform_sample at a point inside.
template <typename scalar_t, typename acc_t>
__device__ void deform_sample_grad(const scalar_t* __restrict__ plane, int64_t height,
                                   int64_t width, acc_t h, acc_t w, acc_t& value, acc_t& d_h,
                                   acc_t& d_w) {
  const int64_t h_low = static_cast<int64_t>(floor(h));
  const int64_t w_low = static_cast<int64_t>(floor(w));
  const int64_t h_high = h_low + 1;
  const int64_t w_high = w_low + 1;
  const acc_t lh = h - static_cast<acc_t>(h_low);
  const acc_t lw = w - static_cast<acc_t>(w_low);
  const acc_t hh = acc_t(1) - lh;
  const acc_t hw = acc_t(1) - lw;
  const bool top = h_low >= 0, bottom = h_high <= height - 1;
  const bool left = w_low >= 0, right = w_high <= width - 1;
  const acc_t v1 = top && left ? static_cast<acc_t>(plane[h_low * width + w_low]) : acc_t(0);
  const acc_t v2 = top && right ? static_cast<acc_t>(plane[h_low * width + w_high]) : acc_t(0);
  const acc_t v3 = bottom && left ? static_cast<acc_t>(plane[h_high * width + w_low]) : acc_t(0);
  const acc_t v4 = bottom && right ? static_cast<acc_t>(plane[h_high * width + w_high]) : acc_t(0);
  value = hh * hw * v1 + hh * lw * v2 + lh * hw * v3 + lh * lw * v4;
  d_h = hw * (v3 - v1) + lw * (v4 - v2);
  d_w = hh * (v2 - v1) + lh * (v4 - v3);
}

// Where kernel tap (i, j) of output pixel (y, x) of image b samples, and its mask.
template <typename scalar_t, typename acc_t>
__device__ __forceinline__ void tap_position(const DeformGeometry& g,
                                             const scalar_t* __restrict__ offset,
                                             const scalar_t* __restrict__ mask, int64_t b,
                                             int64_t group, int64_t i, int64_t j, int64_t y,
                                             int64_t x, acc_t& h, acc_t& w, acc_t& m) {
  const int64_t taps = g.kernel_h * g.kernel_w;
  const int64_t plane = g.out_h * g.out_w;
  const int64_t pixel = y * g.out_w + x;
  const int64_t tap = i * g.kernel_w + j;
  const scalar_t* off = offset + (b * g.offset_groups + group) * 2 * taps * plane;
  const acc_t off_h = static_cast<acc_t>(off[(2 * tap) * plane + pixel]);
  const acc_t off_w = static_cast<acc_t>(off[(2 * tap + 1) * plane + pixel]);
  h = static_cast<acc_t>(y * g.stride_h - g.pad_h + i * g.dilation_h) + off_h;
  w = static_cast<acc_t>(x * g.stride_w - g.pad_w + j * g.dilation_w) + off_w;
  m = g.use_mask
          ? static_cast<acc_t>(mask[((b * g.offset_groups + group) * taps + tap) * plane + pixel])
          : acc_t(1);
}

// columns[(c * taps + tap), (b - b0) * plane + pixel] for images b0 .. b0 + images - 1.
template <typename scalar_t, typename acc_t>
__global__ void deform_im2col_kernel(int64_t total, DeformGeometry g, int64_t b0, int64_t images,
                                     const scalar_t* __restrict__ input,
                                     const scalar_t* __restrict__ offset,
                                     const scalar_t* __restrict__ mask,
                                     scalar_t* __restrict__ columns) {
  const int64_t plane = g.out_h * g.out_w;
  const int64_t taps = g.kernel_h * g.kernel_w;
  const int64_t col_width = images * plane;
  OPFORGE_CUDA_KERNEL_LOOP(index, total) {
    const int64_t x = index % g.out_w;
    const int64_t y = (index / g.out_w) % g.out_h;
    const int64_t bl = (index / plane) % images;
    const int64_t c = index / (plane * images);
    const int64_t b = b0 + bl;
    const int64_t group = c / g.channels_per_offset_group;
    const scalar_t* in_plane = input + (b * g.channels + c) * g.height * g.width;
    scalar_t* col = columns + c * taps * col_width + bl * plane + y * g.out_w + x;
    for (int64_t i = 0; i < g.kernel_h; ++i) {
      for (int64_t j = 0; j < g.kernel_w; ++j) {
        acc_t h, w, m;
        tap_position<scalar_t, acc_t>(g, offset, mask, b, group, i, j, y, x, h, w, m);
        // Outside: 0; a NaN coordinate: NaN (as on the CPU), whatever the mask.
        const acc_t v = samples_inside(h, w, g.height, g.width)
                            ? m * deform_sample<scalar_t, acc_t>(in_plane, g.height, g.width, h, w)
                            : (isnan(h) || isnan(w) ? acc_t(NAN) : acc_t(0));
        col[(i * g.kernel_w + j) * col_width] = static_cast<scalar_t>(v);
      }
    }
  }
}

// Scatters columns_grad * mask into grad_input (atomic adds; one thread per column entry).
template <typename scalar_t, typename acc_t>
__global__ void deform_col2im_kernel(int64_t total, DeformGeometry g, int64_t b0, int64_t images,
                                     const scalar_t* __restrict__ columns_grad,
                                     const scalar_t* __restrict__ offset,
                                     const scalar_t* __restrict__ mask,
                                     acc_t* __restrict__ grad_input) {
  const int64_t plane = g.out_h * g.out_w;
  const int64_t taps = g.kernel_h * g.kernel_w;
  OPFORGE_CUDA_KERNEL_LOOP(index, total) {
    const int64_t x = index % g.out_w;
    const int64_t y = (index / g.out_w) % g.out_h;
    const int64_t bl = (index / plane) % images;
    const int64_t tap = (index / (plane * images)) % taps;
    const int64_t c = index / (plane * images * taps);
    const int64_t b = b0 + bl;
    const int64_t group = c / g.channels_per_offset_group;
    acc_t h, w, m;
    tap_position<scalar_t, acc_t>(g, offset, mask, b, group, tap / g.kernel_w, tap % g.kernel_w, y,
                                  x, h, w, m);
    if (!samples_inside(h, w, g.height, g.width)) {
      continue;  // outside, or a NaN coordinate: no input pixel was read
    }
    const acc_t grad = static_cast<acc_t>(columns_grad[index]) * m;
    const int64_t h_low = static_cast<int64_t>(floor(h));
    const int64_t w_low = static_cast<int64_t>(floor(w));
    const acc_t lh = h - static_cast<acc_t>(h_low);
    const acc_t lw = w - static_cast<acc_t>(w_low);
    acc_t* in_plane = grad_input + (b * g.channels + c) * g.height * g.width;
#pragma unroll
    for (int dy = 0; dy < 2; ++dy) {
      const int64_t yy = h_low + dy;
      if (yy < 0 || yy >= g.height)
        continue;
      const acc_t wy = dy ? lh : acc_t(1) - lh;
#pragma unroll
      for (int dx = 0; dx < 2; ++dx) {
        const int64_t xx = w_low + dx;
        if (xx < 0 || xx >= g.width)
          continue;
        const acc_t wx = dx ? lw : acc_t(1) - lw;
        OPFORGE_ATOMIC_ADD(in_plane + yy * g.width + xx, grad * wy * wx);
      }
    }
  }
}

// One thread per (image, offset group, tap, pixel): sums over the group's channels to get
// d/d offset_h, d/d offset_w and d/d mask. Each output element is written once.
template <typename scalar_t, typename acc_t>
__global__ void deform_coord_grad_kernel(int64_t total, DeformGeometry g, int64_t b0,
                                         int64_t images, const scalar_t* __restrict__ columns_grad,
                                         const scalar_t* __restrict__ input,
                                         const scalar_t* __restrict__ offset,
                                         const scalar_t* __restrict__ mask,
                                         scalar_t* __restrict__ grad_offset,
                                         scalar_t* __restrict__ grad_mask) {
  const int64_t plane = g.out_h * g.out_w;
  const int64_t taps = g.kernel_h * g.kernel_w;
  const int64_t col_width = images * plane;
  OPFORGE_CUDA_KERNEL_LOOP(index, total) {
    const int64_t x = index % g.out_w;
    const int64_t y = (index / g.out_w) % g.out_h;
    const int64_t tap = (index / plane) % taps;
    const int64_t group = (index / (plane * taps)) % g.offset_groups;
    const int64_t bl = index / (plane * taps * g.offset_groups);
    const int64_t b = b0 + bl;
    acc_t h, w, m;
    tap_position<scalar_t, acc_t>(g, offset, mask, b, group, tap / g.kernel_w, tap % g.kernel_w, y,
                                  x, h, w, m);
    acc_t grad_h = 0, grad_w = 0, grad_m = 0;
    const int64_t c_begin = group * g.channels_per_offset_group;
    const bool inside = samples_inside(h, w, g.height, g.width);
    for (int64_t c = c_begin; inside && c < c_begin + g.channels_per_offset_group; ++c) {
      const acc_t cg = static_cast<acc_t>(
          columns_grad[(c * taps + tap) * col_width + bl * plane + y * g.out_w + x]);
      acc_t v, d_h, d_w;
      deform_sample_grad<scalar_t, acc_t>(input + (b * g.channels + c) * g.height * g.width,
                                          g.height, g.width, h, w, v, d_h, d_w);
      grad_h += cg * d_h;
      grad_w += cg * d_w;
      grad_m += cg * v;
    }
    if (isnan(h) || isnan(w)) {
      grad_h = grad_w = grad_m = acc_t(NAN);
    }
    const int64_t pixel = y * g.out_w + x;
    scalar_t* goff = grad_offset + (b * g.offset_groups + group) * 2 * taps * plane;
    goff[(2 * tap) * plane + pixel] = static_cast<scalar_t>(grad_h * m);
    goff[(2 * tap + 1) * plane + pixel] = static_cast<scalar_t>(grad_w * m);
    if (g.use_mask) {
      grad_mask[((b * g.offset_groups + group) * taps + tap) * plane + pixel] =
          static_cast<scalar_t>(grad_m);
    }
  }
}

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
  using acc_t = opmath_t<scalar_t>;
  const int64_t total = g.channels * images * g.out_h * g.out_w;
  if (total == 0)
    return;
  deform_im2col_kernel<scalar_t, acc_t><<<capped_blocks(total), kThreadsPerBlock, 0, stream>>>(
      total, g, b0, images, input.const_data_ptr<scalar_t>(), offset.const_data_ptr<scalar_t>(),
      g.use_mask ? mask.const_data_ptr<scalar_t>() : nullptr, columns.mutable_data_ptr<scalar_t>());
  OPFORGE_CUDA_LAUNCH_CHECK();
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
            using acc_t = opmath_t<scalar_t>;
            const int64_t coord_total = images * g.offset_groups * taps * plane;
            deform_coord_grad_kernel<scalar_t, acc_t>
                <<<capped_blocks(coord_total), kThreadsPerBlock, 0, stream>>>(
                    coord_total, g, b0, images, columns_grad.const_data_ptr<scalar_t>(),
                    input_c.const_data_ptr<scalar_t>(), offset_c.const_data_ptr<scalar_t>(),
                    use_mask ? mask_c.const_data_ptr<scalar_t>() : nullptr,
                    grad_offset.mutable_data_ptr<scalar_t>(),
                    use_mask ? grad_mask.mutable_data_ptr<scalar_t>() : nullptr);
            OPFORGE_CUDA_LAUNCH_CHECK();
            const int64_t col_total = g.channels * taps * images * plane;
            deform_col2im_kernel<scalar_t, acc_t>
                <<<capped_blocks(col_total), kThreadsPerBlock, 0, stream>>>(
                    col_total, g, b0, images, columns_grad.const_data_ptr<scalar_t>(),
                    offset_c.const_data_ptr<scalar_t>(),
                    use_mask ? mask_c.const_data_ptr<scalar_t>() : nullptr,
                    grad_input_acc.mutable_data_ptr<acc_t>());
            OPFORGE_CUDA_LAUNCH_CHECK();
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
