// roi_pool's Metal contract, read by roi_pool.metal (embed.py inlines it),
// mps/roi_pool_kernel.cpp and the Linux emulation: buffer bindings, the
// parameter struct and the CPU crossover.
#ifndef OPFORGE_METAL_ROI_POOL_H
#define OPFORGE_METAL_ROI_POOL_H

#include "dispatch.h"

// roi_pool, kernel roi_pool_forward_<T>
#define OPF_ROI_POOL_FWD_BUF_INPUT 0
#define OPF_ROI_POOL_FWD_BUF_ROIS 1
#define OPF_ROI_POOL_FWD_BUF_OUTPUT 2
#define OPF_ROI_POOL_FWD_BUF_ARGMAX 3  // int[K, C, PH, PW]
#define OPF_ROI_POOL_FWD_BUF_PARAMS 4  // OpfRoiPoolParams
// roi_pool, kernel roi_pool_backward_<T>
#define OPF_ROI_POOL_BWD_BUF_GRAD 0  // T[K, C, PH, PW], any strides
#define OPF_ROI_POOL_BWD_BUF_ROIS 1
#define OPF_ROI_POOL_BWD_BUF_ARGMAX 2      // int[K, C, PH, PW] contiguous
#define OPF_ROI_POOL_BWD_BUF_GRAD_INPUT 3  // float[N, C, H, W], zeroed
#define OPF_ROI_POOL_BWD_BUF_PARAMS 4

struct OpfRoiPoolParams {
  int64_t total;  // K * C * PH * PW
  int64_t channels;
  int64_t height;
  int64_t width;
  int64_t pooled_height;
  int64_t pooled_width;
  int64_t grad_stride_n;
  int64_t grad_stride_c;
  int64_t grad_stride_h;
  int64_t grad_stride_w;
  float spatial_scale;
  int32_t reserved;
};

#ifndef __METAL_VERSION__
namespace opforge::metal {
// Below this many output elements the MPS kernel runs the CPU kernel instead (see dispatch.h);
// an estimate, not a measurement on a Mac.
inline constexpr Crossover kRoiPoolCrossover{"OPFORGE_MPS_CPU_BELOW_ROI_POOL", 8192};
}  // namespace opforge::metal
#endif

#endif  // OPFORGE_METAL_ROI_POOL_H
