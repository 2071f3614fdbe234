// Dispatch geometry of every opforge Metal kernel: the one place that says how
// many threads a threadgroup has, how many threadgroups a problem needs, which
// [[buffer(n)]] index each argument is bound to, and the layout of the
// parameter structs passed with setBytes.
//
// Three readers, one truth:
//   * the .metal kernels (embed.py inlines this file into the shader source;
//     __METAL_VERSION__ is defined there, so only the shared part is seen),
//   * the host code csrc/mps/<op>_kernel.mm,
//   * the Linux emulation in tests/metal_emu, which runs the kernels with the
//     geometry computed by the functions below.
//
// Every kernel runs exactly one thread per work item and bounds-checks its
// linear index; no kernel loops over a grid stride.  The linear index is
// 64-bit and spread over a 2-D grid of threadgroups so that work sizes past
// 2^32 items still get one thread each.
#ifndef OPFORGE_METAL_DISPATCH_H
#define OPFORGE_METAL_DISPATCH_H

#ifndef __METAL_VERSION__
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#endif

// ---------------------------------------------------------------- constants
// Threads per threadgroup of the one-thread-per-item kernels.  256 is a
// multiple of Apple GPUs' 32-wide SIMD groups and below every pipeline's
// maxTotalThreadsPerThreadgroup seen for these kernels; the host clamps to the
// pipeline limit anyway (opf_dispatch_1d).
#define OPF_THREADS_1D 256
// Metal allows far more, but 65535 threadgroups per grid dimension is the
// portable limit; larger problems spill into the y dimension.
#define OPF_MAX_GROUPS_X 65535
// nms works on 64-box tiles: one bit per box in a 64-bit mask word.
#define OPF_NMS_TILE 64
// Threads of the single-threadgroup nms reduction.
#define OPF_NMS_REDUCE_THREADS 256

// ---------------------------------------------------------- buffer bindings
// nms, kernel nms_mask_<T>
#define OPF_NMS_MASK_BUF_BOXES 0   // T[n, 4], sorted by score, contiguous
#define OPF_NMS_MASK_BUF_MASK 1    // ulong[n, col_blocks]
#define OPF_NMS_MASK_BUF_PARAMS 2  // OpfNmsParams
// nms, kernel nms_reduce
#define OPF_NMS_REDUCE_BUF_MASK 0      // ulong[n, col_blocks]
#define OPF_NMS_REDUCE_BUF_ORDER 1     // long[n]: sorted position -> box index
#define OPF_NMS_REDUCE_BUF_KEEP 2      // long[n]: kept box indices, in order
#define OPF_NMS_REDUCE_BUF_NUM_KEEP 3  // long[1]
#define OPF_NMS_REDUCE_BUF_REMOVED 4   // ulong[col_blocks], scratch
#define OPF_NMS_REDUCE_BUF_PARAMS 5    // OpfNmsParams

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

// roi_pool, kernel roi_pool_forward_<T>
#define OPF_ROI_POOL_FWD_BUF_INPUT 0
#define OPF_ROI_POOL_FWD_BUF_ROIS 1
#define OPF_ROI_POOL_FWD_BUF_OUTPUT 2
#define OPF_ROI_POOL_FWD_BUF_ARGMAX 3  // int[K, C, PH, PW]
#define OPF_ROI_POOL_FWD_BUF_PARAMS 4  // OpfRoiPoolParams
// roi_pool, kernel roi_pool_backward_<T>
#define OPF_ROI_POOL_BWD_BUF_GRAD 0        // T[K, C, PH, PW], any strides
#define OPF_ROI_POOL_BWD_BUF_ROIS 1
#define OPF_ROI_POOL_BWD_BUF_ARGMAX 2      // int[K, C, PH, PW] contiguous
#define OPF_ROI_POOL_BWD_BUF_GRAD_INPUT 3  // float[N, C, H, W], zeroed
#define OPF_ROI_POOL_BWD_BUF_PARAMS 4

// deform_conv2d, kernel deform_im2col_<T>
#define OPF_DEFORM_IM2COL_BUF_INPUT 0    // T[B, C, H, W] (B = images in chunk)
#define OPF_DEFORM_IM2COL_BUF_OFFSET 1   // T[B, 2*OG*KH*KW, OH, OW]
#define OPF_DEFORM_IM2COL_BUF_MASK 2     // T[B, OG*KH*KW, OH, OW]
#define OPF_DEFORM_IM2COL_BUF_COLUMNS 3  // T[C*KH*KW, B*OH*OW]
#define OPF_DEFORM_IM2COL_BUF_PARAMS 4   // OpfDeformParams
// deform_conv2d, kernel deform_col2im_<T>
#define OPF_DEFORM_COL2IM_BUF_COLUMNS 0     // T[C*KH*KW, B*OH*OW] (grad)
#define OPF_DEFORM_COL2IM_BUF_OFFSET 1
#define OPF_DEFORM_COL2IM_BUF_MASK 2
#define OPF_DEFORM_COL2IM_BUF_GRAD_INPUT 3  // float[B, C, H, W], zeroed
#define OPF_DEFORM_COL2IM_BUF_PARAMS 4
// deform_conv2d, kernel deform_col2im_coord_<T>
#define OPF_DEFORM_COORD_BUF_COLUMNS 0      // T[C*KH*KW, B*OH*OW] (grad)
#define OPF_DEFORM_COORD_BUF_INPUT 1
#define OPF_DEFORM_COORD_BUF_OFFSET 2
#define OPF_DEFORM_COORD_BUF_MASK 3
#define OPF_DEFORM_COORD_BUF_GRAD_OFFSET 4  // T[B, 2*OG*KH*KW, OH, OW]
#define OPF_DEFORM_COORD_BUF_GRAD_MASK 5    // T[B, OG*KH*KW, OH, OW]
#define OPF_DEFORM_COORD_BUF_PARAMS 6

// ------------------------------------------------------- parameter structs
// 8-byte fields first, then 4-byte ones, so Metal and C++ agree on the layout
// without packing pragmas.  `total` is the number of work items (threads that
// do work); kernels return early for linear indices at or past it.
struct OpfNmsParams {
  int64_t num_boxes;
  int64_t col_blocks;  // ceil(num_boxes / OPF_NMS_TILE)
  float iou_threshold;
  int32_t reserved;
};

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

#ifdef __METAL_VERSION__
// The 64-bit linear work-item index of this thread in a grid laid out by
// opf_dispatch_1d: threadgroups fill x first, then y.
inline ulong opf_linear_index(uint3 tgid, uint3 groups, uint3 threads, uint3 tid) {
  const ulong group = (ulong)tgid.y * (ulong)groups.x + (ulong)tgid.x;
  return group * (ulong)threads.x + (ulong)tid.x;
}
#else
// ------------------------------------------------------------ host geometry
namespace opforge {
namespace metal {

struct Dispatch {
  uint32_t groups[3];   // threadgroups per grid (dispatchThreadgroups)
  uint32_t threads[3];  // threads per threadgroup
};

// One thread per work item.  `pipeline_max_threads` is the pipeline state's
// maxTotalThreadsPerThreadgroup (the emulation passes the same number).
inline Dispatch dispatch_1d(uint64_t work_items, uint32_t pipeline_max_threads) {
  uint32_t threads = OPF_THREADS_1D;
  if (pipeline_max_threads > 0 && pipeline_max_threads < threads) {
    // Keep a multiple of the 32-wide SIMD group when clamping.
    threads = std::max<uint32_t>(32, pipeline_max_threads / 32 * 32);
    threads = std::min(threads, pipeline_max_threads);
  }
  const uint64_t total_groups = (work_items + threads - 1) / threads;
  const uint64_t gx = std::min<uint64_t>(std::max<uint64_t>(total_groups, 1), OPF_MAX_GROUPS_X);
  const uint64_t gy = (std::max<uint64_t>(total_groups, 1) + gx - 1) / gx;
  if (gy > OPF_MAX_GROUPS_X) {
    throw std::length_error(
        "opforge MPS: " + std::to_string(work_items) +
        " work items exceed the grid limit of one dispatch; split the input");
  }
  return Dispatch{{static_cast<uint32_t>(gx), static_cast<uint32_t>(gy), 1u}, {threads, 1u, 1u}};
}

inline int64_t nms_col_blocks(int64_t num_boxes) {
  return (num_boxes + OPF_NMS_TILE - 1) / OPF_NMS_TILE;
}

// nms_mask: one threadgroup per (column tile, row tile), 64 threads, one per
// box of the row tile.  Tiles below the diagonal exit at once.
inline Dispatch dispatch_nms_mask(int64_t num_boxes) {
  const int64_t blocks = nms_col_blocks(num_boxes);
  if (blocks > OPF_MAX_GROUPS_X) {
    throw std::length_error("opforge MPS nms: more than " +
                            std::to_string(int64_t(OPF_MAX_GROUPS_X) * OPF_NMS_TILE) +
                            " boxes in one call");
  }
  const uint32_t b = static_cast<uint32_t>(std::max<int64_t>(blocks, 1));
  return Dispatch{{b, b, 1u}, {OPF_NMS_TILE, 1u, 1u}};
}

// nms_reduce: exactly one threadgroup (the greedy scan is sequential over
// tiles; its threads share the OR of suppressed rows).
inline Dispatch dispatch_nms_reduce(uint32_t pipeline_max_threads) {
  uint32_t threads = OPF_NMS_REDUCE_THREADS;
  if (pipeline_max_threads > 0 && pipeline_max_threads < threads) {
    threads = pipeline_max_threads;
  }
  return Dispatch{{1u, 1u, 1u}, {threads, 1u, 1u}};
}

// Work items per kernel, as functions of the problem.
inline int64_t roi_work_items(int64_t num_rois, int64_t channels, int64_t pooled_h,
                              int64_t pooled_w) {
  return num_rois * channels * pooled_h * pooled_w;
}
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

// ------------------------------------------------------- CPU crossover rule
// A Metal dispatch on torch's MPS stream costs about 0.25 ms of launch and
// synchronisation.  Below these sizes the CPU kernel finishes sooner, so the
// MPS kernels copy to the CPU, run the CPU kernel and copy back.  The numbers
// are estimates of where one CPU core spends ~0.25 ms on the op (work items at
// roughly 10-60 ns each), NOT measurements on a Mac: no Mac was available when
// they were set.  Override per op with OPFORGE_MPS_CPU_BELOW_<OP> (an integer,
// in the unit named below) or globally disable routing with
// OPFORGE_MPS_CPU_BELOW=0; tests of the Metal path set it to 0.
enum class CrossoverOp { kNms, kRoiAlign, kRoiPool, kDeformConv2d };

inline int64_t default_cpu_below(CrossoverOp op) {
  switch (op) {
    case CrossoverOp::kNms: return 256;            // boxes (nms already syncs once)
    case CrossoverOp::kRoiAlign: return 4096;      // output elements
    case CrossoverOp::kRoiPool: return 8192;       // output elements
    case CrossoverOp::kDeformConv2d: return 4096;  // output elements
  }
  return 0;
}

inline const char* crossover_env_name(CrossoverOp op) {
  switch (op) {
    case CrossoverOp::kNms: return "OPFORGE_MPS_CPU_BELOW_NMS";
    case CrossoverOp::kRoiAlign: return "OPFORGE_MPS_CPU_BELOW_ROI_ALIGN";
    case CrossoverOp::kRoiPool: return "OPFORGE_MPS_CPU_BELOW_ROI_POOL";
    case CrossoverOp::kDeformConv2d: return "OPFORGE_MPS_CPU_BELOW_DEFORM_CONV2D";
  }
  return "";
}

// Read on every call (getenv is cheap next to a dispatch), so a test can
// change it between calls.
inline int64_t cpu_below(CrossoverOp op) {
  if (const char* v = std::getenv(crossover_env_name(op))) return std::strtoll(v, nullptr, 10);
  if (const char* v = std::getenv("OPFORGE_MPS_CPU_BELOW")) {
    if (std::strtoll(v, nullptr, 10) == 0) return 0;
  }
  return default_cpu_below(op);
}

inline bool route_to_cpu(CrossoverOp op, int64_t size) { return size < cpu_below(op); }

}  // namespace metal
}  // namespace opforge
#endif  // __METAL_VERSION__

#endif  // OPFORGE_METAL_DISPATCH_H
