// nms's Metal contract, read by nms.metal (embed.py inlines it),
// mps/nms_kernel.cpp and the Linux emulation: tile size, buffer bindings,
// the parameter struct and the two kernels' dispatch.
#ifndef OPFORGE_METAL_NMS_H
#define OPFORGE_METAL_NMS_H

#include "dispatch.h"

// nms works on 64-box tiles: one bit per box in a 64-bit mask word.
#define OPF_NMS_TILE 64
// Threads of the single-threadgroup nms reduction.
#define OPF_NMS_REDUCE_THREADS 256

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

struct OpfNmsParams {
  int64_t num_boxes;
  int64_t col_blocks;  // ceil(num_boxes / OPF_NMS_TILE)
  float iou_threshold;
  int32_t reserved;
};

#ifndef __METAL_VERSION__
namespace opforge::metal {
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

// Below this many boxes the MPS kernel runs the CPU kernel instead (see dispatch.h;
// nms syncs once anyway); an estimate, not a measurement on a Mac.
inline constexpr Crossover kNmsCrossover{"OPFORGE_MPS_CPU_BELOW_NMS", 256};
}  // namespace opforge::metal
#endif

#endif  // OPFORGE_METAL_NMS_H
