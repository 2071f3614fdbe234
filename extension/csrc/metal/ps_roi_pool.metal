// ps_roi_pool forward and backward, float and half. One thread per output
// element (forward) or grad element (backward); sums in float. Output channel c
// of bin (ph, pw) averages input channel (c * PH + ph) * PW + pw over the bin,
// which stops before the last input row and column (as torchvision's).
// The backward kernel scatters into a float32 grad_input with atomic float adds.
#include <metal_stdlib>
#include "ps_roi_pool.h"
using namespace metal;

struct PsPoolBin {
  long n, c_out, ph, pw;
  long batch, h0, h1, w0, w1;
};

inline long ps_pool_clamp(long v, long hi) { return v < 0 ? 0 : (v > hi ? hi : v); }

template <typename T>
inline PsPoolBin ps_pool_bin(device const T* rois, constant OpfPsRoiPoolParams& p, ulong index) {
  const long i = (long)index;
  PsPoolBin b;
  b.pw = i % p.pooled_width;
  b.ph = (i / p.pooled_width) % p.pooled_height;
  b.c_out = (i / (p.pooled_width * p.pooled_height)) % p.channels_out;
  b.n = i / (p.pooled_width * p.pooled_height * p.channels_out);
  device const T* r = rois + b.n * 5;
  b.batch = (long)(float)r[0];
  const long start_w = (long)round((float)r[1] * p.spatial_scale);
  const long start_h = (long)round((float)r[2] * p.spatial_scale);
  const long end_w = (long)round((float)r[3] * p.spatial_scale);
  const long end_h = (long)round((float)r[4] * p.spatial_scale);
  // Malformed rois are forced to be at least 1x1.
  const float bin_h = (float)max(end_h - start_h, 1L) / (float)p.pooled_height;
  const float bin_w = (float)max(end_w - start_w, 1L) / (float)p.pooled_width;
  const long last_h = max(p.height - 1, 0L);
  const long last_w = max(p.width - 1, 0L);
  b.h0 = ps_pool_clamp((long)floor((float)b.ph * bin_h) + start_h, last_h);
  b.h1 = ps_pool_clamp((long)ceil((float)(b.ph + 1) * bin_h) + start_h, last_h);
  b.w0 = ps_pool_clamp((long)floor((float)b.pw * bin_w) + start_w, last_w);
  b.w1 = ps_pool_clamp((long)ceil((float)(b.pw + 1) * bin_w) + start_w, last_w);
  return b;
}

template <typename T>
inline void ps_roi_pool_forward_item(device const T* input, device const T* rois, device T* output,
                                     device int* mapping, constant OpfPsRoiPoolParams& p,
                                     ulong index) {
  const PsPoolBin b = ps_pool_bin(rois, p, index);
  const long c_in = (b.c_out * p.pooled_height + b.ph) * p.pooled_width + b.pw;
  mapping[index] = (int)c_in;
  if (b.h1 <= b.h0 || b.w1 <= b.w0) {
    output[index] = (T)0.0f;
    return;
  }
  device const T* plane = input + (b.batch * p.channels + c_in) * p.height * p.width;
  float sum = 0.0f;
  for (long h = b.h0; h < b.h1; ++h) {
    for (long w = b.w0; w < b.w1; ++w) {
      sum += (float)plane[h * p.width + w];
    }
  }
  output[index] = (T)(sum / (float)((b.h1 - b.h0) * (b.w1 - b.w0)));
}

template <typename T>
inline void ps_roi_pool_backward_item(device const T* grad, device const T* rois,
                                      device const int* mapping, device float* grad_input,
                                      constant OpfPsRoiPoolParams& p, ulong index) {
  const long c_in = (long)mapping[index];
  if (c_in < 0 || c_in >= p.channels) return;  // a foreign mapping writes nothing
  const PsPoolBin b = ps_pool_bin(rois, p, index);
  if (b.h1 <= b.h0 || b.w1 <= b.w0) return;
  const float g = (float)grad[index] / (float)((b.h1 - b.h0) * (b.w1 - b.w0));
  device float* plane = grad_input + (b.batch * p.channels + c_in) * p.height * p.width;
  for (long h = b.h0; h < b.h1; ++h) {
    for (long w = b.w0; w < b.w1; ++w) {
      atomic_fetch_add_explicit((device atomic_float*)(plane + h * p.width + w), g,
                                memory_order_relaxed);
    }
  }
}

#define OPF_PS_ROI_POOL_KERNELS(T)                                                   \
  kernel void ps_roi_pool_forward_##T(                                               \
      device const T* input [[buffer(OPF_PS_ROI_POOL_FWD_BUF_INPUT)]],               \
      device const T* rois [[buffer(OPF_PS_ROI_POOL_FWD_BUF_ROIS)]],                 \
      device T* output [[buffer(OPF_PS_ROI_POOL_FWD_BUF_OUTPUT)]],                   \
      device int* mapping [[buffer(OPF_PS_ROI_POOL_FWD_BUF_MAPPING)]],               \
      constant OpfPsRoiPoolParams& p [[buffer(OPF_PS_ROI_POOL_FWD_BUF_PARAMS)]],     \
      uint3 tgid [[threadgroup_position_in_grid]],                                   \
      uint3 groups [[threadgroups_per_grid]],                                        \
      uint3 threads [[threads_per_threadgroup]],                                     \
      uint3 tid [[thread_position_in_threadgroup]]) {                                \
    const ulong index = opf_linear_index(tgid, groups, threads, tid);                \
    if (index >= (ulong)p.total) return;                                             \
    ps_roi_pool_forward_item<T>(input, rois, output, mapping, p, index);             \
  }                                                                                  \
  kernel void ps_roi_pool_backward_##T(                                              \
      device const T* grad [[buffer(OPF_PS_ROI_POOL_BWD_BUF_GRAD)]],                 \
      device const T* rois [[buffer(OPF_PS_ROI_POOL_BWD_BUF_ROIS)]],                 \
      device const int* mapping [[buffer(OPF_PS_ROI_POOL_BWD_BUF_MAPPING)]],         \
      device float* grad_input [[buffer(OPF_PS_ROI_POOL_BWD_BUF_GRAD_INPUT)]],       \
      constant OpfPsRoiPoolParams& p [[buffer(OPF_PS_ROI_POOL_BWD_BUF_PARAMS)]],     \
      uint3 tgid [[threadgroup_position_in_grid]],                                   \
      uint3 groups [[threadgroups_per_grid]],                                        \
      uint3 threads [[threads_per_threadgroup]],                                     \
      uint3 tid [[thread_position_in_threadgroup]]) {                                \
    const ulong index = opf_linear_index(tgid, groups, threads, tid);                \
    if (index >= (ulong)p.total) return;                                             \
    ps_roi_pool_backward_item<T>(grad, rois, mapping, grad_input, p, index);         \
  }

OPF_PS_ROI_POOL_KERNELS(float)
OPF_PS_ROI_POOL_KERNELS(half)
