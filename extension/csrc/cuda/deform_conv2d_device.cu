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
#include "device.cuh"

namespace opforge::cuda {
namespace {

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

}  // namespace

template <typename scalar_t>
cudaError_t launch(const Grid& grid, const DeformIm2col<scalar_t>& a) {
  deform_im2col_kernel<scalar_t, opmath_t<scalar_t>>
      <<<grid.blocks, grid.threads, grid.shared_bytes, grid.stream>>>(
          a.total, a.g, a.b0, a.images, a.input, a.offset, a.mask, a.columns);
  return cudaGetLastError();
}

template <typename scalar_t>
cudaError_t launch(const Grid& grid, const DeformCol2im<scalar_t>& a) {
  deform_col2im_kernel<scalar_t, opmath_t<scalar_t>>
      <<<grid.blocks, grid.threads, grid.shared_bytes, grid.stream>>>(
          a.total, a.g, a.b0, a.images, a.columns_grad, a.offset, a.mask, a.grad_input);
  return cudaGetLastError();
}

template <typename scalar_t>
cudaError_t launch(const Grid& grid, const DeformCoordGrad<scalar_t>& a) {
  deform_coord_grad_kernel<scalar_t, opmath_t<scalar_t>>
      <<<grid.blocks, grid.threads, grid.shared_bytes, grid.stream>>>(
          a.total, a.g, a.b0, a.images, a.columns_grad, a.input, a.offset, a.mask, a.grad_offset,
          a.grad_mask);
  return cudaGetLastError();
}

OPFORGE_INSTANTIATE_LAUNCH(DeformIm2col);
OPFORGE_INSTANTIATE_LAUNCH(DeformCol2im);
OPFORGE_INSTANTIATE_LAUNCH(DeformCoordGrad);

}  // namespace opforge::cuda
