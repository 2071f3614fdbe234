// roi_align forward and backward, float and half.
// One thread per pooled output element (forward) or per grad element
// (backward); coordinates and sums are computed in float for both dtypes.
// The backward kernel scatters into a float32 grad_input with atomic float
// adds (Metal 3); the host casts it to half for half inputs.
#include <metal_stdlib>
#include "roi_align.h"
using namespace metal;

// Position of output element `index` in [K, C, PH, PW].
struct RoiAlignItem {
  long n;
  long c;
  long ph;
  long pw;
};

inline RoiAlignItem roi_align_item(ulong index, constant OpfRoiAlignParams& p) {
  const long i = (long)index;
  RoiAlignItem it;
  it.pw = i % p.pooled_width;
  it.ph = (i / p.pooled_width) % p.pooled_height;
  it.c = (i / (p.pooled_width * p.pooled_height)) % p.channels;
  it.n = i / (p.pooled_width * p.pooled_height * p.channels);
  return it;
}

// Offset of plane (batch, c) in a contiguous [N, C, H, W] tensor.
inline long roi_align_plane_offset(long batch, long c, constant OpfRoiAlignParams& p) {
  return (batch * p.channels + c) * p.height * p.width;
}

// Offset of grad element (n, c, ph, pw) under arbitrary strides.
inline long roi_align_grad_offset(thread const RoiAlignItem& it, constant OpfRoiAlignParams& p) {
  return it.n * p.grad_stride_n + it.c * p.grad_stride_c + it.ph * p.grad_stride_h +
         it.pw * p.grad_stride_w;
}

struct RoiBox {
  float start_w;
  float start_h;
  float bin_w;
  float bin_h;
  long grid_w;
  long grid_h;
  long batch;
};

template <typename T>
inline RoiBox roi_align_box(device const T* rois, long n, constant OpfRoiAlignParams& p) {
  device const T* r = rois + n * 5;
  const float offset = p.aligned ? 0.5f : 0.0f;
  RoiBox b;
  b.batch = (long)(float)r[0];
  b.start_w = (float)r[1] * p.spatial_scale - offset;
  b.start_h = (float)r[2] * p.spatial_scale - offset;
  const float end_w = (float)r[3] * p.spatial_scale - offset;
  const float end_h = (float)r[4] * p.spatial_scale - offset;
  float roi_w = end_w - b.start_w;
  float roi_h = end_h - b.start_h;
  if (!p.aligned) {
    // Malformed rois are forced to 1x1, as in the CPU kernel.
    roi_w = max(roi_w, 1.0f);
    roi_h = max(roi_h, 1.0f);
  }
  b.bin_h = roi_h / (float)p.pooled_height;
  b.bin_w = roi_w / (float)p.pooled_width;
  b.grid_h = p.sampling_ratio > 0 ? p.sampling_ratio : (long)ceil(roi_h / (float)p.pooled_height);
  b.grid_w = p.sampling_ratio > 0 ? p.sampling_ratio : (long)ceil(roi_w / (float)p.pooled_width);
  return b;
}

// Bilinear weights and corners of sample (y, x); all corners -1 when the
// sample falls outside the feature map (contributes nothing).
struct Bilinear {
  float w1, w2, w3, w4;
  long y_low, y_high, x_low, x_high;
};

inline Bilinear roi_align_bilinear(long height, long width, float y, float x) {
  Bilinear b;
  if (y < -1.0f || y > (float)height || x < -1.0f || x > (float)width) {
    b.w1 = b.w2 = b.w3 = b.w4 = 0.0f;
    b.y_low = b.y_high = b.x_low = b.x_high = -1;
    return b;
  }
  y = max(y, 0.0f);
  x = max(x, 0.0f);
  b.y_low = (long)y;
  b.x_low = (long)x;
  if (b.y_low >= height - 1) {
    b.y_high = b.y_low = height - 1;
    y = (float)b.y_low;
  } else {
    b.y_high = b.y_low + 1;
  }
  if (b.x_low >= width - 1) {
    b.x_high = b.x_low = width - 1;
    x = (float)b.x_low;
  } else {
    b.x_high = b.x_low + 1;
  }
  const float ly = y - (float)b.y_low;
  const float lx = x - (float)b.x_low;
  const float hy = 1.0f - ly;
  const float hx = 1.0f - lx;
  b.w1 = hy * hx;
  b.w2 = hy * lx;
  b.w3 = ly * hx;
  b.w4 = ly * lx;
  return b;
}

template <typename T>
inline void roi_align_forward_item(device const T* input, device const T* rois,
                                   device T* output, constant OpfRoiAlignParams& p,
                                   ulong index) {
  const RoiAlignItem it = roi_align_item(index, p);
  const RoiBox box = roi_align_box(rois, it.n, p);
  device const T* plane = input + roi_align_plane_offset(box.batch, it.c, p);
  const long cells = box.grid_h * box.grid_w;
  const float count = (float)(cells > 0 ? cells : 1);  // empty grid: output 0
  float sum = 0.0f;
  for (long iy = 0; iy < box.grid_h; ++iy) {
    const float y = box.start_h + (float)it.ph * box.bin_h +
                    ((float)iy + 0.5f) * box.bin_h / (float)box.grid_h;
    for (long ix = 0; ix < box.grid_w; ++ix) {
      const float x = box.start_w + (float)it.pw * box.bin_w +
                      ((float)ix + 0.5f) * box.bin_w / (float)box.grid_w;
      const Bilinear b = roi_align_bilinear(p.height, p.width, y, x);
      if (b.y_low < 0) continue;
      sum += b.w1 * (float)plane[b.y_low * p.width + b.x_low] +
             b.w2 * (float)plane[b.y_low * p.width + b.x_high] +
             b.w3 * (float)plane[b.y_high * p.width + b.x_low] +
             b.w4 * (float)plane[b.y_high * p.width + b.x_high];
    }
  }
  output[index] = (T)(sum / count);
}

template <typename T>
inline void roi_align_backward_item(device const T* grad, device const T* rois,
                                    device float* grad_input,
                                    constant OpfRoiAlignParams& p, ulong index) {
  const RoiAlignItem it = roi_align_item(index, p);
  const RoiBox box = roi_align_box(rois, it.n, p);
  const float g = (float)grad[roi_align_grad_offset(it, p)];
  const float count = (float)(box.grid_h * box.grid_w);
  device float* plane = grad_input + roi_align_plane_offset(box.batch, it.c, p);
  for (long iy = 0; iy < box.grid_h; ++iy) {
    const float y = box.start_h + (float)it.ph * box.bin_h +
                    ((float)iy + 0.5f) * box.bin_h / (float)box.grid_h;
    for (long ix = 0; ix < box.grid_w; ++ix) {
      const float x = box.start_w + (float)it.pw * box.bin_w +
                      ((float)ix + 0.5f) * box.bin_w / (float)box.grid_w;
      const Bilinear b = roi_align_bilinear(p.height, p.width, y, x);
      if (b.y_low < 0) continue;
      device atomic_float* a1 = (device atomic_float*)(plane + b.y_low * p.width + b.x_low);
      device atomic_float* a2 = (device atomic_float*)(plane + b.y_low * p.width + b.x_high);
      device atomic_float* a3 = (device atomic_float*)(plane + b.y_high * p.width + b.x_low);
      device atomic_float* a4 = (device atomic_float*)(plane + b.y_high * p.width + b.x_high);
      atomic_fetch_add_explicit(a1, g * b.w1 / count, memory_order_relaxed);
      atomic_fetch_add_explicit(a2, g * b.w2 / count, memory_order_relaxed);
      atomic_fetch_add_explicit(a3, g * b.w3 / count, memory_order_relaxed);
      atomic_fetch_add_explicit(a4, g * b.w4 / count, memory_order_relaxed);
    }
  }
}

#define OPF_ROI_ALIGN_KERNELS(T)                                                       \
  kernel void roi_align_forward_##T(                                                   \
      device const T* input [[buffer(OPF_ROI_ALIGN_FWD_BUF_INPUT)]],                   \
      device const T* rois [[buffer(OPF_ROI_ALIGN_FWD_BUF_ROIS)]],                     \
      device T* output [[buffer(OPF_ROI_ALIGN_FWD_BUF_OUTPUT)]],                       \
      constant OpfRoiAlignParams& p [[buffer(OPF_ROI_ALIGN_FWD_BUF_PARAMS)]],          \
      uint3 tgid [[threadgroup_position_in_grid]],                                     \
      uint3 groups [[threadgroups_per_grid]],                                          \
      uint3 threads [[threads_per_threadgroup]],                                       \
      uint3 tid [[thread_position_in_threadgroup]]) {                                  \
    const ulong index = opf_linear_index(tgid, groups, threads, tid);                  \
    if (index >= (ulong)p.total) return;                                               \
    roi_align_forward_item<T>(input, rois, output, p, index);                          \
  }                                                                                    \
  kernel void roi_align_backward_##T(                                                  \
      device const T* grad [[buffer(OPF_ROI_ALIGN_BWD_BUF_GRAD)]],                     \
      device const T* rois [[buffer(OPF_ROI_ALIGN_BWD_BUF_ROIS)]],                     \
      device float* grad_input [[buffer(OPF_ROI_ALIGN_BWD_BUF_GRAD_INPUT)]],           \
      constant OpfRoiAlignParams& p [[buffer(OPF_ROI_ALIGN_BWD_BUF_PARAMS)]],          \
      uint3 tgid [[threadgroup_position_in_grid]],                                     \
      uint3 groups [[threadgroups_per_grid]],                                          \
      uint3 threads [[threads_per_threadgroup]],                                       \
      uint3 tid [[thread_position_in_threadgroup]]) {                                  \
    const ulong index = opf_linear_index(tgid, groups, threads, tid);                  \
    if (index >= (ulong)p.total) return;                                               \
    roi_align_backward_item<T>(grad, rois, grad_input, p, index);                      \
  }

OPF_ROI_ALIGN_KERNELS(float)
OPF_ROI_ALIGN_KERNELS(half)
