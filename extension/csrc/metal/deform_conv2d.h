// deform_conv2d's Metal contract, read by deform_conv2d.metal (embed.py inlines it),
// mps/deform_conv2d_kernel.cpp and the Linux emulation: buffer bindings, the
// parameter struct, work items per kernel and the CPU crossover.
#ifndef OPFORGE_METAL_DEFORM_CONV2D_H
#define OPFORGE_METAL_DEFORM_CONV2D_H

#include "dispatch.h"

// deform_conv2d, kernel deform_im2col_<T>
#define OPF_DEFORM_IM2COL_BUF_INPUT 0    // T[B, C, H, W] (B = images in chunk)
#define OPF_DEFORM_IM2COL_BUF_OFFSET 1   // T[B, 2*OG*KH*KW, OH, OW]
#define OPF_DEFORM_IM2COL_BUF_MASK 2     // T[B, OG*KH*KW, OH, OW]
#define OPF_DEFORM_IM2COL_BUF_COLUMNS 3  // T[C*KH*KW, B*OH*OW]
#define OPF_DEFORM_IM2COL_BUF_PARAMS 4   // OpfDeformParams
// deform_conv2d, kernel deform_col2im_<T>
#define OPF_DEFORM_COL2IM_BUF_COLUMNS 0  // T[C*KH*KW, B*OH*OW] (grad)
#define OPF_DEFORM_COL2IM_BUF_OFFSET 1
#define OPF_DEFORM_COL2IM_BUF_MASK 2
#define OPF_DEFORM_COL2IM_BUF_GRAD_INPUT 3  // float[B, C, H, W], zeroed
#define OPF_DEFORM_COL2IM_BUF_PARAMS 4
// deform_conv2d, kernel deform_col2im_coord_<T>
#define OPF_DEFORM_COORD_BUF_COLUMNS 0  // T[C*KH*KW, B*OH*OW] (grad)
#define OPF_DEFORM_COORD_BUF_INPUT 1
#define OPF_DEFORM_COORD_BUF_OFFSET 2
#define OPF_DEFORM_COORD_BUF_MASK 3
#define OPF_DEFORM_COORD_BUF_GRAD_OFFSET 4  // T[B, 2*OG*KH*KW, OH, OW]
#define OPF_DEFORM_COORD_BUF_GRAD_MASK 5    // T[B, OG*KH*KW, OH, OW]
#define OPF_DEFORM_COORD_BUF_PARAMS 6

struct OpfDeformParams {
  int64_t total;  // work items of the kernel this struct is passed to
  int64_t batch;  // images in this chunk
  int64_t channels;
  int64_t height;
  int64_t width;
  int64_t out_h;
  int64_t out_w;
  int64_t kernel_h;
  int64_t kernel_w;
  int64_t stride_h;
  int64_t stride_w;
  int64_t pad_h;
  int64_t pad_w;
  int64_t dilation_h;
  int64_t dilation_w;
  int64_t offset_groups;
  int32_t use_mask;
  int32_t reserved;
};

#ifndef __METAL_VERSION__
namespace opforge::metal {
// im2col: one thread per (input channel, image, output pixel); col2im: one per
// column element; coord: one per offset element.
inline int64_t deform_im2col_items(const OpfDeformParams& p) {
  return p.channels * p.batch * p.out_h * p.out_w;
}
inline int64_t deform_col2im_items(const OpfDeformParams& p) {
  return p.channels * p.kernel_h * p.kernel_w * p.batch * p.out_h * p.out_w;
}
inline int64_t deform_coord_items(const OpfDeformParams& p) {
  return p.batch * 2 * p.offset_groups * p.kernel_h * p.kernel_w * p.out_h * p.out_w;
}

// Below this many output elements the MPS kernel runs the CPU kernel instead (see dispatch.h);
// an estimate, not a measurement on a Mac.
inline constexpr Crossover kDeformConv2dCrossover{"OPFORGE_MPS_CPU_BELOW_DEFORM_CONV2D", 4096};
}  // namespace opforge::metal
#endif

#endif  // OPFORGE_METAL_DEFORM_CONV2D_H
