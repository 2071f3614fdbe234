// ps_roi_align forward and backward, float and half. One thread per output
// element (forward) or grad element (backward); coordinates and sums in float.
// Output channel c of bin (ph, pw) samples input channel (c * PH + ph) * PW + pw.
// The backward kernel scatters into a float32 grad_input with atomic float
// adds (Metal 3); the host casts it to half for half inputs.
#include <metal_stdlib>
#include "ps_roi_align.h"
using namespace metal;

struct PsAlignItem {
  long n;
  long c_out;
  long ph;
  long pw;
};

inline PsAlignItem ps_align_item(ulong index, constant OpfPsRoiAlignParams& p) {
  const long i = (long)index;
  PsAlignItem it;
  it.pw = i % p.pooled_width;
  it.ph = (i / p.pooled_width) % p.pooled_height;
  it.c_out = (i / (p.pooled_width * p.pooled_height)) % p.channels_out;
  it.n = i / (p.pooled_width * p.pooled_height * p.channels_out);
  return it;
}

// The roi's sampling grid: boxes shifted by -0.5 pixel, no minimum size.
struct PsAlignBox {
  long batch;
  float start_w, start_h, bin_w, bin_h;
  long grid_w, grid_h;
  float count;  // the raw adaptive grid product: 0 (a NaN average) for an empty grid side
};

template <typename T>
inline PsAlignBox ps_align_box(device const T* rois, long n, constant OpfPsRoiAlignParams& p) {
  device const T* r = rois + n * 5;
  PsAlignBox b;
  b.batch = (long)(float)r[0];
  b.start_w = (float)r[1] * p.spatial_scale - 0.5f;
  b.start_h = (float)r[2] * p.spatial_scale - 0.5f;
  b.bin_w = ((float)r[3] * p.spatial_scale - 0.5f - b.start_w) / (float)p.pooled_width;
  b.bin_h = ((float)r[4] * p.spatial_scale - 0.5f - b.start_h) / (float)p.pooled_height;
  const float raw_w = p.sampling_ratio > 0 ? (float)p.sampling_ratio : ceil(b.bin_w);
  const float raw_h = p.sampling_ratio > 0 ? (float)p.sampling_ratio : ceil(b.bin_h);
  b.grid_w = (long)max(raw_w, 0.0f);
  b.grid_h = (long)max(raw_h, 0.0f);
  b.count = (raw_w == 0.0f || raw_h == 0.0f) ? 0.0f : (float)max(b.grid_w * b.grid_h, 1L);
  return b;
}

// Bilinear neighbours of (y, x) in an H x W plane; y_low = -1 outside.
struct PsAlignTaps {
  float w1, w2, w3, w4;
  long y_low, y_high, x_low, x_high;
};

inline PsAlignTaps ps_align_taps(long height, long width, float y, float x) {
  PsAlignTaps t;
  if (!(y >= -1.0f && y <= (float)height && x >= -1.0f && x <= (float)width)) {
    t.w1 = t.w2 = t.w3 = t.w4 = 0.0f;
    t.y_low = t.y_high = t.x_low = t.x_high = -1;
    return t;
  }
  y = max(y, 0.0f);
  x = max(x, 0.0f);
  t.y_low = (long)y;
  t.x_low = (long)x;
  t.y_high = t.y_low + 1;
  t.x_high = t.x_low + 1;
  if (t.y_low >= height - 1) {
    t.y_high = t.y_low = height - 1;
    y = (float)t.y_low;
  }
  if (t.x_low >= width - 1) {
    t.x_high = t.x_low = width - 1;
    x = (float)t.x_low;
  }
  const float ly = y - (float)t.y_low;
  const float lx = x - (float)t.x_low;
  t.w1 = (1.0f - ly) * (1.0f - lx);
  t.w2 = (1.0f - ly) * lx;
  t.w3 = ly * (1.0f - lx);
  t.w4 = ly * lx;
  return t;
}

inline float ps_align_sample_y(thread const PsAlignBox& b, long ph, long iy) {
  return b.start_h + (float)ph * b.bin_h + ((float)iy + 0.5f) * b.bin_h / (float)b.grid_h;
}

inline float ps_align_sample_x(thread const PsAlignBox& b, long pw, long ix) {
  return b.start_w + (float)pw * b.bin_w + ((float)ix + 0.5f) * b.bin_w / (float)b.grid_w;
}

template <typename T>
inline void ps_roi_align_forward_item(device const T* input, device const T* rois, device T* output,
                                      device int* mapping, constant OpfPsRoiAlignParams& p,
                                      ulong index) {
  const PsAlignItem it = ps_align_item(index, p);
  const long c_in = (it.c_out * p.pooled_height + it.ph) * p.pooled_width + it.pw;
  const PsAlignBox b = ps_align_box(rois, it.n, p);
  device const T* plane = input + (b.batch * p.channels + c_in) * p.height * p.width;
  float sum = 0.0f;
  for (long iy = 0; iy < b.grid_h; ++iy) {
    const float y = ps_align_sample_y(b, it.ph, iy);
    for (long ix = 0; ix < b.grid_w; ++ix) {
      const PsAlignTaps t = ps_align_taps(p.height, p.width, y, ps_align_sample_x(b, it.pw, ix));
      if (t.y_low < 0) continue;
      sum += t.w1 * (float)plane[t.y_low * p.width + t.x_low] +
             t.w2 * (float)plane[t.y_low * p.width + t.x_high] +
             t.w3 * (float)plane[t.y_high * p.width + t.x_low] +
             t.w4 * (float)plane[t.y_high * p.width + t.x_high];
    }
  }
  output[index] = (T)(sum / b.count);
  mapping[index] = (int)c_in;
}

template <typename T>
inline void ps_roi_align_backward_item(device const T* grad, device const T* rois,
                                       device const int* mapping, device float* grad_input,
                                       constant OpfPsRoiAlignParams& p, ulong index) {
  const PsAlignItem it = ps_align_item(index, p);
  const long c_in = (long)mapping[index];
  if (c_in < 0 || c_in >= p.channels) return;  // a foreign mapping writes nothing
  const PsAlignBox b = ps_align_box(rois, it.n, p);
  if (b.grid_h <= 0 || b.grid_w <= 0) return;
  const float g = (float)grad[index] / b.count;
  device float* plane = grad_input + (b.batch * p.channels + c_in) * p.height * p.width;
  for (long iy = 0; iy < b.grid_h; ++iy) {
    const float y = ps_align_sample_y(b, it.ph, iy);
    for (long ix = 0; ix < b.grid_w; ++ix) {
      const PsAlignTaps t = ps_align_taps(p.height, p.width, y, ps_align_sample_x(b, it.pw, ix));
      if (t.y_low < 0) continue;
      atomic_fetch_add_explicit((device atomic_float*)(plane + t.y_low * p.width + t.x_low),
                                g * t.w1, memory_order_relaxed);
      atomic_fetch_add_explicit((device atomic_float*)(plane + t.y_low * p.width + t.x_high),
                                g * t.w2, memory_order_relaxed);
      atomic_fetch_add_explicit((device atomic_float*)(plane + t.y_high * p.width + t.x_low),
                                g * t.w3, memory_order_relaxed);
      atomic_fetch_add_explicit((device atomic_float*)(plane + t.y_high * p.width + t.x_high),
                                g * t.w4, memory_order_relaxed);
    }
  }
}

#define OPF_PS_ROI_ALIGN_KERNELS(T)                                                  \
  kernel void ps_roi_align_forward_##T(                                              \
      device const T* input [[buffer(OPF_PS_ROI_ALIGN_FWD_BUF_INPUT)]],              \
      device const T* rois [[buffer(OPF_PS_ROI_ALIGN_FWD_BUF_ROIS)]],                \
      device T* output [[buffer(OPF_PS_ROI_ALIGN_FWD_BUF_OUTPUT)]],                  \
      device int* mapping [[buffer(OPF_PS_ROI_ALIGN_FWD_BUF_MAPPING)]],              \
      constant OpfPsRoiAlignParams& p [[buffer(OPF_PS_ROI_ALIGN_FWD_BUF_PARAMS)]],   \
      uint3 tgid [[threadgroup_position_in_grid]],                                   \
      uint3 groups [[threadgroups_per_grid]],                                        \
      uint3 threads [[threads_per_threadgroup]],                                     \
      uint3 tid [[thread_position_in_threadgroup]]) {                                \
    const ulong index = opf_linear_index(tgid, groups, threads, tid);                \
    if (index >= (ulong)p.total) return;                                             \
    ps_roi_align_forward_item<T>(input, rois, output, mapping, p, index);            \
  }                                                                                  \
  kernel void ps_roi_align_backward_##T(                                             \
      device const T* grad [[buffer(OPF_PS_ROI_ALIGN_BWD_BUF_GRAD)]],                \
      device const T* rois [[buffer(OPF_PS_ROI_ALIGN_BWD_BUF_ROIS)]],                \
      device const int* mapping [[buffer(OPF_PS_ROI_ALIGN_BWD_BUF_MAPPING)]],        \
      device float* grad_input [[buffer(OPF_PS_ROI_ALIGN_BWD_BUF_GRAD_INPUT)]],      \
      constant OpfPsRoiAlignParams& p [[buffer(OPF_PS_ROI_ALIGN_BWD_BUF_PARAMS)]],   \
      uint3 tgid [[threadgroup_position_in_grid]],                                   \
      uint3 groups [[threadgroups_per_grid]],                                        \
      uint3 threads [[threads_per_threadgroup]],                                     \
      uint3 tid [[thread_position_in_threadgroup]]) {                                \
    const ulong index = opf_linear_index(tgid, groups, threads, tid);                \
    if (index >= (ulong)p.total) return;                                             \
    ps_roi_align_backward_item<T>(grad, rois, mapping, grad_input, p, index);        \
  }

OPF_PS_ROI_ALIGN_KERNELS(float)
OPF_PS_ROI_ALIGN_KERNELS(half)
