// roi_pool forward (max + argmax) and backward, float and half.
// One thread per pooled output element / grad element.  argmax is the
// in-plane index h * W + w of the maximum (-1 for an empty bin), int32 as on
// CPU (the host refuses planes of 2^31 elements or more).
// The backward kernel scatters into a float32 grad_input with atomic adds.
#include <metal_stdlib>
#include "roi_pool.h"
using namespace metal;

struct RoiPoolItem {
  long n;
  long c;
  long ph;
  long pw;
};

inline RoiPoolItem roi_pool_item(ulong index, constant OpfRoiPoolParams& p) {
  const long i = (long)index;
  RoiPoolItem it;
  it.pw = i % p.pooled_width;
  it.ph = (i / p.pooled_width) % p.pooled_height;
  it.c = (i / (p.pooled_width * p.pooled_height)) % p.channels;
  it.n = i / (p.pooled_width * p.pooled_height * p.channels);
  return it;
}

inline long roi_pool_plane_offset(long batch, long c, constant OpfRoiPoolParams& p) {
  return (batch * p.channels + c) * p.height * p.width;
}

inline long roi_pool_grad_offset(thread const RoiPoolItem& it, constant OpfRoiPoolParams& p) {
  return it.n * p.grad_stride_n + it.c * p.grad_stride_c + it.ph * p.grad_stride_h +
         it.pw * p.grad_stride_w;
}

struct RoiPoolBin {
  long batch;
  long hstart, hend, wstart, wend;
};

inline long clamp_long(long v, long lo, long hi) { return v < lo ? lo : (v > hi ? hi : v); }

template <typename T>
inline RoiPoolBin roi_pool_bin(device const T* rois, thread const RoiPoolItem& it,
                               constant OpfRoiPoolParams& p) {
  device const T* r = rois + it.n * 5;
  RoiPoolBin b;
  b.batch = (long)(float)r[0];
  const long start_w = (long)round((float)r[1] * p.spatial_scale);
  const long start_h = (long)round((float)r[2] * p.spatial_scale);
  const long end_w = (long)round((float)r[3] * p.spatial_scale);
  const long end_h = (long)round((float)r[4] * p.spatial_scale);
  // Malformed rois are forced to 1x1.
  const long roi_w = end_w - start_w + 1 > 1 ? end_w - start_w + 1 : 1;
  const long roi_h = end_h - start_h + 1 > 1 ? end_h - start_h + 1 : 1;
  const float bin_h = (float)roi_h / (float)p.pooled_height;
  const float bin_w = (float)roi_w / (float)p.pooled_width;
  b.hstart = clamp_long((long)floor((float)it.ph * bin_h) + start_h, 0, p.height);
  b.hend = clamp_long((long)ceil((float)(it.ph + 1) * bin_h) + start_h, 0, p.height);
  b.wstart = clamp_long((long)floor((float)it.pw * bin_w) + start_w, 0, p.width);
  b.wend = clamp_long((long)ceil((float)(it.pw + 1) * bin_w) + start_w, 0, p.width);
  return b;
}

template <typename T>
inline void roi_pool_forward_item(device const T* input, device const T* rois, device T* output,
                                  device int* argmax, constant OpfRoiPoolParams& p,
                                  ulong index) {
  const RoiPoolItem it = roi_pool_item(index, p);
  const RoiPoolBin b = roi_pool_bin(rois, it, p);
  const bool empty = b.hend <= b.hstart || b.wend <= b.wstart;
  device const T* plane = input + roi_pool_plane_offset(b.batch, it.c, p);
  float best = empty ? 0.0f : -FLT_MAX;  // as on CPU; fast math may drop infinities
  long best_idx = -1;
  for (long h = b.hstart; h < b.hend; ++h) {
    for (long w = b.wstart; w < b.wend; ++w) {
      const long idx = h * p.width + w;
      const float v = (float)plane[idx];
      if (v > best) {
        best = v;
        best_idx = idx;
      }
    }
  }
  output[index] = (T)best;
  argmax[index] = (int)best_idx;
}

template <typename T>
inline void roi_pool_backward_item(device const T* grad, device const T* rois,
                                   device const int* argmax, device float* grad_input,
                                   constant OpfRoiPoolParams& p, ulong index) {
  const long idx = (long)argmax[index];
  if (idx < 0) return;
  const RoiPoolItem it = roi_pool_item(index, p);
  device const T* r = rois + it.n * 5;
  const long batch = (long)(float)r[0];
  device float* plane = grad_input + roi_pool_plane_offset(batch, it.c, p);
  const float g = (float)grad[roi_pool_grad_offset(it, p)];
  atomic_fetch_add_explicit((device atomic_float*)(plane + idx), g, memory_order_relaxed);
}

#define OPF_ROI_POOL_KERNELS(T)                                                        \
  kernel void roi_pool_forward_##T(                                                    \
      device const T* input [[buffer(OPF_ROI_POOL_FWD_BUF_INPUT)]],                    \
      device const T* rois [[buffer(OPF_ROI_POOL_FWD_BUF_ROIS)]],                      \
      device T* output [[buffer(OPF_ROI_POOL_FWD_BUF_OUTPUT)]],                        \
      device int* argmax [[buffer(OPF_ROI_POOL_FWD_BUF_ARGMAX)]],                     \
      constant OpfRoiPoolParams& p [[buffer(OPF_ROI_POOL_FWD_BUF_PARAMS)]],            \
      uint3 tgid [[threadgroup_position_in_grid]],                                     \
      uint3 groups [[threadgroups_per_grid]],                                          \
      uint3 threads [[threads_per_threadgroup]],                                       \
      uint3 tid [[thread_position_in_threadgroup]]) {                                  \
    const ulong index = opf_linear_index(tgid, groups, threads, tid);                  \
    if (index >= (ulong)p.total) return;                                               \
    roi_pool_forward_item<T>(input, rois, output, argmax, p, index);                   \
  }                                                                                    \
  kernel void roi_pool_backward_##T(                                                   \
      device const T* grad [[buffer(OPF_ROI_POOL_BWD_BUF_GRAD)]],                      \
      device const T* rois [[buffer(OPF_ROI_POOL_BWD_BUF_ROIS)]],                      \
      device const int* argmax [[buffer(OPF_ROI_POOL_BWD_BUF_ARGMAX)]],               \
      device float* grad_input [[buffer(OPF_ROI_POOL_BWD_BUF_GRAD_INPUT)]],            \
      constant OpfRoiPoolParams& p [[buffer(OPF_ROI_POOL_BWD_BUF_PARAMS)]],            \
      uint3 tgid [[threadgroup_position_in_grid]],                                     \
      uint3 groups [[threadgroups_per_grid]],                                          \
      uint3 threads [[threads_per_threadgroup]],                                       \
      uint3 tid [[thread_position_in_threadgroup]]) {                                  \
    const ulong index = opf_linear_index(tgid, groups, threads, tid);                  \
    if (index >= (ulong)p.total) return;                                               \
    roi_pool_backward_item<T>(grad, rois, argmax, grad_input, p, index);               \
  }

OPF_ROI_POOL_KERNELS(float)
OPF_ROI_POOL_KERNELS(half)
