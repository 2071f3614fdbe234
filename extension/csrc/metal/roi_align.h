// roi_align's Metal contract, read by roi_align.metal (embed.py inlines it),
// mps/roi_align_kernel.cpp and the Linux emulation: buffer bindings, the
// parameter struct, work items and the CPU crossover.
#ifndef OPFORGE_METAL_ROI_ALIGN_H
#define OPFORGE_METAL_ROI_ALIGN_H

#include "dispatch.h"

// roi_align, kernel roi_align_forward_<T>
#define OPF_ROI_ALIGN_FWD_BUF_INPUT 0   // T[N, C, H, W] contiguous
#define OPF_ROI_ALIGN_FWD_BUF_ROIS 1    // T[K, 5] contiguous
#define OPF_ROI_ALIGN_FWD_BUF_OUTPUT 2  // T[K, C, PH, PW]
#define OPF_ROI_ALIGN_FWD_BUF_PARAMS 3  // OpfRoiAlignParams
// roi_align, kernel roi_align_backward_<T>
#define OPF_ROI_ALIGN_BWD_BUF_GRAD 0        // T[K, C, PH, PW], any strides
#define OPF_ROI_ALIGN_BWD_BUF_ROIS 1        // T[K, 5] contiguous
#define OPF_ROI_ALIGN_BWD_BUF_GRAD_INPUT 2  // float[N, C, H, W], zeroed
#define OPF_ROI_ALIGN_BWD_BUF_PARAMS 3      // OpfRoiAlignParams

struct OpfRoiAlignParams {
  int64_t total;  // K * C * PH * PW
  int64_t channels;
  int64_t height;
  int64_t width;
  int64_t pooled_height;
  int64_t pooled_width;
  int64_t sampling_ratio;
  int64_t grad_stride_n;  // strides of grad in the backward kernel
  int64_t grad_stride_c;
  int64_t grad_stride_h;
  int64_t grad_stride_w;
  float spatial_scale;
  int32_t aligned;
};

#ifndef __METAL_VERSION__
namespace opforge::metal {
inline int64_t roi_work_items(int64_t num_rois, int64_t channels, int64_t pooled_h,
                              int64_t pooled_w) {
  return num_rois * channels * pooled_h * pooled_w;
}

// Below this many output elements the MPS kernel runs the CPU kernel instead (see dispatch.h);
// an estimate, not a measurement on a Mac.
inline constexpr Crossover kRoiAlignCrossover{"OPFORGE_MPS_CPU_BELOW_ROI_ALIGN", 4096};
}  // namespace opforge::metal
#endif

#endif  // OPFORGE_METAL_ROI_ALIGN_H
