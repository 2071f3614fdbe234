// ps_roi_pool's Metal contract, read by ps_roi_pool.metal (embed.py inlines it),
// mps/ps_roi_pool_kernel.cpp and the Linux emulation: buffer bindings, the
// parameter struct passed with setBytes, and the CPU crossover.
#ifndef OPFORGE_METAL_PS_ROI_POOL_H
#define OPFORGE_METAL_PS_ROI_POOL_H

#include "dispatch.h"

// kernel ps_roi_pool_forward_<T>: one thread per output element
#define OPF_PS_ROI_POOL_FWD_BUF_INPUT 0    // T[N, C, H, W] contiguous
#define OPF_PS_ROI_POOL_FWD_BUF_ROIS 1     // T[K, 5] contiguous
#define OPF_PS_ROI_POOL_FWD_BUF_OUTPUT 2   // T[K, C / (PH * PW), PH, PW]
#define OPF_PS_ROI_POOL_FWD_BUF_MAPPING 3  // int[K, C / (PH * PW), PH, PW]
#define OPF_PS_ROI_POOL_FWD_BUF_PARAMS 4   // OpfPsRoiPoolParams
// kernel ps_roi_pool_backward_<T>: one thread per grad element
#define OPF_PS_ROI_POOL_BWD_BUF_GRAD 0        // T[K, C / (PH * PW), PH, PW] contiguous
#define OPF_PS_ROI_POOL_BWD_BUF_ROIS 1        // T[K, 5] contiguous
#define OPF_PS_ROI_POOL_BWD_BUF_MAPPING 2     // int[K, C / (PH * PW), PH, PW] contiguous
#define OPF_PS_ROI_POOL_BWD_BUF_GRAD_INPUT 3  // float[N, C, H, W], zeroed
#define OPF_PS_ROI_POOL_BWD_BUF_PARAMS 4      // OpfPsRoiPoolParams

// 8-byte fields first, then 4-byte ones (the layout rule of dispatch.h).
struct OpfPsRoiPoolParams {
  int64_t total;         // K * C_out * PH * PW
  int64_t channels;      // input channels C
  int64_t channels_out;  // C / (PH * PW)
  int64_t height;
  int64_t width;
  int64_t pooled_height;
  int64_t pooled_width;
  float spatial_scale;
  int32_t reserved;
};

#ifndef __METAL_VERSION__
namespace opforge::metal {
// Below this many output elements the MPS kernel runs the CPU kernel (see dispatch.h).
inline constexpr Crossover kPsRoiPoolCrossover{"OPFORGE_MPS_CPU_BELOW_PS_ROI_POOL", 8192};
}  // namespace opforge::metal
#endif

#endif  // OPFORGE_METAL_PS_ROI_POOL_H
