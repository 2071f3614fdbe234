// deform_conv2d: the three sampling kernels around the GEMMs (which the host
// runs through ATen on MPS), float and half, math in float.
//   deform_im2col_<T>: columns[c*KH*KW + i*KW + j, b*OH*OW + y*OW + x] =
//       mask * bilinear(input[b, c], sampling point).  One thread per
//       (c, b, y, x); it writes its KH*KW column entries.
//   deform_col2im_<T>: grad_input += mask * bilinear weights * grad_columns.
//       One thread per column element, atomic float adds into a float32
//       grad_input (half inputs included).
//   deform_col2im_coord_<T>: grad_offset and grad_mask.  One thread per
//       offset element; it owns its outputs, so no atomics.
#include <metal_stdlib>
#include "deform_conv2d.h"
using namespace metal;

// Index helpers: every product is taken in 64 bits.
inline long deform_plane(long b, long c, constant OpfDeformParams& p) {
  return (b * p.channels + c) * p.height * p.width;
}
// Start of the offset rows of (image b, offset group g): [B, OG, 2*KH*KW, OH, OW].
inline long deform_offset_base(long b, long g, constant OpfDeformParams& p) {
  return (b * p.offset_groups + g) * 2 * p.kernel_h * p.kernel_w * p.out_h * p.out_w;
}
inline long deform_mask_base(long b, long g, constant OpfDeformParams& p) {
  return (b * p.offset_groups + g) * p.kernel_h * p.kernel_w * p.out_h * p.out_w;
}
// Column row (c, i, j), column (b, y, x) of [C*KH*KW, B*OH*OW].
inline long deform_column(long c, long i, long j, long b, long y, long x,
                          constant OpfDeformParams& p) {
  const long row = (c * p.kernel_h + i) * p.kernel_w + j;
  return (row * p.batch + b) * p.out_h * p.out_w + y * p.out_w + x;
}

template <typename T>
inline float deform_bilinear(device const T* plane, long height, long width, float h, float w) {
  // A NaN coordinate samples NaN, as on the CPU and CUDA (and floor(NaN) has no long value).
  if (isnan(h) || isnan(w)) return NAN;
  if (h <= -1.0f || (float)height <= h || w <= -1.0f || (float)width <= w) return 0.0f;
  const long h_low = (long)floor(h);
  const long w_low = (long)floor(w);
  const long h_high = h_low + 1;
  const long w_high = w_low + 1;
  const float lh = h - (float)h_low;
  const float lw = w - (float)w_low;
  const float hh = 1.0f - lh;
  const float hw = 1.0f - lw;
  const float v1 = (h_low >= 0 && w_low >= 0) ? (float)plane[h_low * width + w_low] : 0.0f;
  const float v2 = (h_low >= 0 && w_high <= width - 1) ? (float)plane[h_low * width + w_high] : 0.0f;
  const float v3 = (h_high <= height - 1 && w_low >= 0) ? (float)plane[h_high * width + w_low] : 0.0f;
  const float v4 = (h_high <= height - 1 && w_high <= width - 1) ? (float)plane[h_high * width + w_high] : 0.0f;
  return hh * hw * v1 + hh * lw * v2 + lh * hw * v3 + lh * lw * v4;
}

// d bilinear / d y (is_y) or d x of the sampling point.
template <typename T>
inline float deform_coordinate_weight(device const T* plane, long height, long width, float y,
                                      float x, bool is_y) {
  // As on the CPU and CUDA: NaN at a NaN coordinate, 0 outside (-1, height) x (-1, width).
  // Both are decided before floor() is converted to long, which is undefined for NaN and
  // for values past a long (e.g. an offset of 1e30).
  if (isnan(y) || isnan(x)) return NAN;
  if (!(y > -1.0f && y < (float)height && x > -1.0f && x < (float)width)) return 0.0f;
  const long y_l = (long)floor(y);
  const long x_l = (long)floor(x);
  const long y_h = y_l + 1;
  const long x_h = x_l + 1;
  const bool vyl = 0 <= y_l && y_l < height;
  const bool vyh = 0 <= y_h && y_h < height;
  const bool vxl = 0 <= x_l && x_l < width;
  const bool vxh = 0 <= x_h && x_h < width;
  const float v_yx = (vyl && vxl) ? (float)plane[y_l * width + x_l] : 0.0f;
  const float v_yX = (vyl && vxh) ? (float)plane[y_l * width + x_h] : 0.0f;
  const float v_Yx = (vyh && vxl) ? (float)plane[y_h * width + x_l] : 0.0f;
  const float v_YX = (vyh && vxh) ? (float)plane[y_h * width + x_h] : 0.0f;
  if (is_y) {
    const float dx = x - (float)x_l;
    return dx * (v_YX - v_yX) + (1.0f - dx) * (v_Yx - v_yx);
  }
  const float dy = y - (float)y_l;
  return dy * (v_YX - v_Yx) + (1.0f - dy) * (v_yX - v_yx);
}

template <typename T>
inline void deform_im2col_item(device const T* input, device const T* offset,
                               device const T* mask, device T* columns,
                               constant OpfDeformParams& p, ulong index) {
  const long i0 = (long)index;
  const long x = i0 % p.out_w;
  const long y = (i0 / p.out_w) % p.out_h;
  const long b = (i0 / (p.out_w * p.out_h)) % p.batch;
  const long c = i0 / (p.out_w * p.out_h * p.batch);
  const long g = c / (p.channels / p.offset_groups);
  const long pix = y * p.out_w + x;
  const long plane_size = p.out_h * p.out_w;
  device const T* plane = input + deform_plane(b, c, p);
  device const T* off = offset + deform_offset_base(b, g, p);
  device const T* msk = mask + deform_mask_base(b, g, p);
  for (long i = 0; i < p.kernel_h; ++i) {
    for (long j = 0; j < p.kernel_w; ++j) {
      const long k = i * p.kernel_w + j;
      const float m = p.use_mask ? (float)msk[k * plane_size + pix] : 1.0f;
      const float dy = (float)off[(2 * k) * plane_size + pix];
      const float dx = (float)off[(2 * k + 1) * plane_size + pix];
      const float sy = (float)(y * p.stride_h - p.pad_h + i * p.dilation_h) + dy;
      const float sx = (float)(x * p.stride_w - p.pad_w + j * p.dilation_w) + dx;
      columns[deform_column(c, i, j, b, y, x, p)] =
          (T)(m * deform_bilinear(plane, p.height, p.width, sy, sx));
    }
  }
}

template <typename T>
inline void deform_col2im_item(device const T* columns, device const T* offset,
                               device const T* mask, device float* grad_input,
                               constant OpfDeformParams& p, ulong index) {
  const long i0 = (long)index;
  const long x = i0 % p.out_w;
  const long y = (i0 / p.out_w) % p.out_h;
  const long b = (i0 / (p.out_w * p.out_h)) % p.batch;
  const long j = (i0 / (p.out_w * p.out_h * p.batch)) % p.kernel_w;
  const long i = (i0 / (p.out_w * p.out_h * p.batch * p.kernel_w)) % p.kernel_h;
  const long c = i0 / (p.out_w * p.out_h * p.batch * p.kernel_w * p.kernel_h);
  const long g = c / (p.channels / p.offset_groups);
  const long pix = y * p.out_w + x;
  const long plane_size = p.out_h * p.out_w;
  const long k = i * p.kernel_w + j;
  device const T* off = offset + deform_offset_base(b, g, p);
  const float m = p.use_mask ? (float)mask[deform_mask_base(b, g, p) + k * plane_size + pix] : 1.0f;
  const float sy = (float)(y * p.stride_h - p.pad_h + i * p.dilation_h) + (float)off[(2 * k) * plane_size + pix];
  const float sx = (float)(x * p.stride_w - p.pad_w + j * p.dilation_w) + (float)off[(2 * k + 1) * plane_size + pix];
  const float grad = (float)columns[index];
  // Outside (-1, height) x (-1, width), or NaN: the sample read no pixel (and converting
  // such a coordinate to long is undefined).
  if (!(sy > -1.0f && sy < (float)p.height && sx > -1.0f && sx < (float)p.width)) return;
  device float* plane = grad_input + deform_plane(b, c, p);
  for (long dy = -1; dy <= 1; ++dy) {
    for (long dx = -1; dx <= 1; ++dx) {
      const long yy = (long)sy + dy;
      const long xx = (long)sx + dx;
      if (0 <= yy && yy < p.height && 0 <= xx && xx < p.width &&
          fabs(sy - (float)yy) < 1.0f && fabs(sx - (float)xx) < 1.0f) {
        const float w = (1.0f - fabs(sy - (float)yy)) * (1.0f - fabs(sx - (float)xx));
        atomic_fetch_add_explicit((device atomic_float*)(plane + yy * p.width + xx),
                                  m * w * grad, memory_order_relaxed);
      }
    }
  }
}

template <typename T>
inline void deform_coord_item(device const T* columns, device const T* input,
                              device const T* offset, device const T* mask,
                              device T* grad_offset, device T* grad_mask,
                              constant OpfDeformParams& p, ulong index) {
  const long i0 = (long)index;
  const long offset_channels = 2 * p.offset_groups * p.kernel_h * p.kernel_w;
  const long x = i0 % p.out_w;
  const long y = (i0 / p.out_w) % p.out_h;
  const long oc = (i0 / (p.out_w * p.out_h)) % offset_channels;
  const long b = i0 / (p.out_w * p.out_h * offset_channels);
  const long g = oc / (2 * p.kernel_h * p.kernel_w);
  const long within = oc - g * 2 * p.kernel_h * p.kernel_w;  // 2 * k + direction
  const long k = within / 2;
  const bool is_y = (within % 2) == 0;
  const long i = k / p.kernel_w;
  const long j = k % p.kernel_w;
  const long per_group = p.channels / p.offset_groups;
  const long pix = y * p.out_w + x;
  const long plane_size = p.out_h * p.out_w;
  device const T* off = offset + deform_offset_base(b, g, p);
  const float m = p.use_mask ? (float)mask[deform_mask_base(b, g, p) + k * plane_size + pix] : 1.0f;
  const float sy = (float)(y * p.stride_h - p.pad_h + i * p.dilation_h) + (float)off[(2 * k) * plane_size + pix];
  const float sx = (float)(x * p.stride_w - p.pad_w + j * p.dilation_w) + (float)off[(2 * k + 1) * plane_size + pix];
  float val = 0.0f;
  float mval = 0.0f;
  for (long cc = 0; cc < per_group; ++cc) {
    const long c = g * per_group + cc;
    device const T* plane = input + deform_plane(b, c, p);
    const float col = (float)columns[deform_column(c, i, j, b, y, x, p)];
    val += deform_coordinate_weight(plane, p.height, p.width, sy, sx, is_y) * col * m;
    if (is_y) mval += col * deform_bilinear(plane, p.height, p.width, sy, sx);
  }
  grad_offset[index] = (T)val;
  if (p.use_mask && is_y) grad_mask[deform_mask_base(b, g, p) + k * plane_size + pix] = (T)mval;
}

#define OPF_DEFORM_KERNEL_ARGS                                                         \
  uint3 tgid [[threadgroup_position_in_grid]], uint3 groups [[threadgroups_per_grid]], \
      uint3 threads [[threads_per_threadgroup]], uint3 tid [[thread_position_in_threadgroup]]

#define OPF_DEFORM_KERNELS(T)                                                          \
  kernel void deform_im2col_##T(                                                       \
      device const T* input [[buffer(OPF_DEFORM_IM2COL_BUF_INPUT)]],                   \
      device const T* offset [[buffer(OPF_DEFORM_IM2COL_BUF_OFFSET)]],                 \
      device const T* mask [[buffer(OPF_DEFORM_IM2COL_BUF_MASK)]],                     \
      device T* columns [[buffer(OPF_DEFORM_IM2COL_BUF_COLUMNS)]],                     \
      constant OpfDeformParams& p [[buffer(OPF_DEFORM_IM2COL_BUF_PARAMS)]],            \
      OPF_DEFORM_KERNEL_ARGS) {                                                        \
    const ulong index = opf_linear_index(tgid, groups, threads, tid);                  \
    if (index >= (ulong)p.total) return;                                               \
    deform_im2col_item<T>(input, offset, mask, columns, p, index);                     \
  }                                                                                    \
  kernel void deform_col2im_##T(                                                       \
      device const T* columns [[buffer(OPF_DEFORM_COL2IM_BUF_COLUMNS)]],               \
      device const T* offset [[buffer(OPF_DEFORM_COL2IM_BUF_OFFSET)]],                 \
      device const T* mask [[buffer(OPF_DEFORM_COL2IM_BUF_MASK)]],                     \
      device float* grad_input [[buffer(OPF_DEFORM_COL2IM_BUF_GRAD_INPUT)]],           \
      constant OpfDeformParams& p [[buffer(OPF_DEFORM_COL2IM_BUF_PARAMS)]],            \
      OPF_DEFORM_KERNEL_ARGS) {                                                        \
    const ulong index = opf_linear_index(tgid, groups, threads, tid);                  \
    if (index >= (ulong)p.total) return;                                               \
    deform_col2im_item<T>(columns, offset, mask, grad_input, p, index);                \
  }                                                                                    \
  kernel void deform_col2im_coord_##T(                                                 \
      device const T* columns [[buffer(OPF_DEFORM_COORD_BUF_COLUMNS)]],                \
      device const T* input [[buffer(OPF_DEFORM_COORD_BUF_INPUT)]],                    \
      device const T* offset [[buffer(OPF_DEFORM_COORD_BUF_OFFSET)]],                  \
      device const T* mask [[buffer(OPF_DEFORM_COORD_BUF_MASK)]],                      \
      device T* grad_offset [[buffer(OPF_DEFORM_COORD_BUF_GRAD_OFFSET)]],              \
      device T* grad_mask [[buffer(OPF_DEFORM_COORD_BUF_GRAD_MASK)]],                  \
      constant OpfDeformParams& p [[buffer(OPF_DEFORM_COORD_BUF_PARAMS)]],             \
      OPF_DEFORM_KERNEL_ARGS) {                                                        \
    const ulong index = opf_linear_index(tgid, groups, threads, tid);                  \
    if (index >= (ulong)p.total) return;                                               \
    deform_coord_item<T>(columns, input, offset, mask, grad_offset, grad_mask, p, index); \
  }

OPF_DEFORM_KERNELS(float)
OPF_DEFORM_KERNELS(half)
