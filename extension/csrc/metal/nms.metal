// nms in two dispatches that never leave the GPU:
//   nms_mask_<T>: IoU bitmask over 64-box tiles; bit k of mask[i, t] says box
//     i (sorted by score) suppresses box 64*t + k.  One threadgroup per
//     (column tile, row tile), one thread per row box; tiles below the
//     diagonal are never read and exit at once.
//   nms_reduce: the greedy scan, in one threadgroup.  Tile by tile, thread 0
//     decides which boxes of the tile survive (in-tile suppression is
//     sequential), then all threads OR the survivors' mask rows into the
//     removed-set of the later tiles.  Two barriers per tile.  It writes the
//     kept box indices (original numbering) and their count.
// IoU is computed in float for float and half boxes.
#include <metal_stdlib>
#include "nms.h"
using namespace metal;

inline bool nms_suppresses(float4 a, float4 b, float threshold) {
  const float w = max(min(a.z, b.z) - max(a.x, b.x), 0.0f);
  const float h = max(min(a.w, b.w) - max(a.y, b.y), 0.0f);
  const float inter = w * h;
  const float area_a = (a.z - a.x) * (a.w - a.y);
  const float area_b = (b.z - b.x) * (b.w - b.y);
  return inter / (area_a + area_b - inter) > threshold;
}

inline long nms_min(long a, long b) { return a < b ? a : b; }

// Word (row, tile) of the [n, col_blocks] mask.
inline ulong nms_mask_word(long row, long tile, long col_blocks) {
  return (ulong)row * (ulong)col_blocks + (ulong)tile;
}

template <typename T>
inline float4 nms_load_box(device const T* boxes, long i) {
  device const T* b = boxes + i * 4;
  return float4((float)b[0], (float)b[1], (float)b[2], (float)b[3]);
}

#define OPF_NMS_MASK_KERNEL(T)                                                         \
  kernel void nms_mask_##T(device const T* boxes [[buffer(OPF_NMS_MASK_BUF_BOXES)]],   \
                           device ulong* mask [[buffer(OPF_NMS_MASK_BUF_MASK)]],       \
                           constant OpfNmsParams& p [[buffer(OPF_NMS_MASK_BUF_PARAMS)]], \
                           uint3 tgid [[threadgroup_position_in_grid]],                \
                           uint3 tid [[thread_position_in_threadgroup]]) {             \
    threadgroup float4 col_boxes[OPF_NMS_TILE];                                        \
    const long row_tile = (long)tgid.y;                                                \
    const long col_tile = (long)tgid.x;                                                \
    if (row_tile > col_tile) return; /* whole threadgroup: no barrier is skipped */    \
    const long row_start = row_tile * OPF_NMS_TILE;                                    \
    const long col_start = col_tile * OPF_NMS_TILE;                                    \
    const long row_size = nms_min(p.num_boxes - row_start, OPF_NMS_TILE);            \
    const long col_size = nms_min(p.num_boxes - col_start, OPF_NMS_TILE);            \
    const long t = (long)tid.x;                                                        \
    if (t < col_size) col_boxes[t] = nms_load_box(boxes, col_start + t);               \
    threadgroup_barrier(mem_flags::mem_threadgroup);                                   \
    if (t < row_size) {                                                                \
      const long i = row_start + t;                                                    \
      const float4 box = nms_load_box(boxes, i);                                       \
      ulong bits = 0;                                                                  \
      for (long k = row_tile == col_tile ? t + 1 : 0; k < col_size; ++k) {             \
        if (nms_suppresses(box, col_boxes[k], p.iou_threshold)) bits |= (ulong)1 << k;  \
      }                                                                                \
      mask[nms_mask_word(i, col_tile, p.col_blocks)] = bits;                           \
    }                                                                                  \
  }

OPF_NMS_MASK_KERNEL(float)
OPF_NMS_MASK_KERNEL(half)

kernel void nms_reduce(device const ulong* mask [[buffer(OPF_NMS_REDUCE_BUF_MASK)]],
                       device const long* order [[buffer(OPF_NMS_REDUCE_BUF_ORDER)]],
                       device long* keep [[buffer(OPF_NMS_REDUCE_BUF_KEEP)]],
                       device long* num_keep [[buffer(OPF_NMS_REDUCE_BUF_NUM_KEEP)]],
                       device ulong* removed [[buffer(OPF_NMS_REDUCE_BUF_REMOVED)]],
                       constant OpfNmsParams& p [[buffer(OPF_NMS_REDUCE_BUF_PARAMS)]],
                       uint3 tgid [[threadgroup_position_in_grid]],
                       uint3 tid [[thread_position_in_threadgroup]],
                       uint3 threads [[threads_per_threadgroup]]) {
  threadgroup ulong survivors;  // bits of the current tile's kept boxes
  threadgroup long kept;
  // Exactly one threadgroup does the scan; any other would repeat it (a
  // whole-threadgroup exit, so no barrier is skipped).
  if (tgid.x != 0 || tgid.y != 0 || tgid.z != 0) return;
  const long t = (long)tid.x;
  const long nt = (long)threads.x;
  const long blocks = p.col_blocks;
  // Strided over the threads of this single threadgroup only (dispatched as
  // exactly one threadgroup: see dispatch_nms_reduce).
  for (long j = t; j < blocks; j += nt) removed[j] = 0;
  if (t == 0) kept = 0;
  threadgroup_barrier(mem_flags::mem_device | mem_flags::mem_threadgroup);
  for (long tile = 0; tile < blocks; ++tile) {
    if (t == 0) {
      ulong gone = removed[tile];
      ulong alive = 0;
      long count = kept;
      const long start = tile * OPF_NMS_TILE;
      const long size = nms_min(p.num_boxes - start, OPF_NMS_TILE);
      for (long k = 0; k < size; ++k) {
        if ((gone >> k) & 1) continue;
        alive |= (ulong)1 << k;
        keep[count++] = order[start + k];
        gone |= mask[nms_mask_word(start + k, tile, blocks)];
      }
      kept = count;
      survivors = alive;
    }
    threadgroup_barrier(mem_flags::mem_device | mem_flags::mem_threadgroup);
    const ulong alive = survivors;
    if (alive != 0) {
      for (long j = tile + 1 + t; j < blocks; j += nt) {
        ulong acc = removed[j];
        for (long k = 0; k < OPF_NMS_TILE; ++k) {
          if ((alive >> k) & 1) acc |= mask[nms_mask_word(tile * OPF_NMS_TILE + k, j, blocks)];
        }
        removed[j] = acc;
      }
    }
    threadgroup_barrier(mem_flags::mem_device | mem_flags::mem_threadgroup);
  }
  if (t == 0) num_keep[0] = kept;
}
