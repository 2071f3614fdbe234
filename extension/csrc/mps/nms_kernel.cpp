// nms on MPS: IoU bitmask and greedy reduction both on the GPU
// (csrc/metal/nms.metal); only the kept count (8 bytes) is read back, to size
// the result.  Below the CPU crossover (dispatch.h) the CPU kernel runs instead.
#include <opforge_metal/nms.h>

#include "common.h"
#include "metal/nms.h"
#include "mps/metal_host.h"

namespace opforge::mps {
namespace {

OPFORGE_KERNEL_LIBRARY(nms)

Tensor nms_mps(const Tensor& dets, const Tensor& scores, double iou_threshold) {
  check_nms_inputs(dets, scores);
  check_mps("nms", "boxes (dets)", dets);
  const char* type = metal_type(dets, "nms");
  const int64_t n = dets.size(0);
  if (n == 0) {
    return alloc_empty(dets, {0}, ScalarType::Long);
  }
  if (metal::route_to_cpu(metal::kNmsCrossover, n)) {
    return call_cpu<1>(dets, "opforge::nms", dets, scores, iou_threshold)[0];
  }

  const Tensor order = argsort_descending_stable(scores);
  const Tensor boxes = as_contiguous(index_selected(dets, 0, order));
  const int64_t blocks = metal::nms_col_blocks(n);
  const Tensor mask = alloc_empty(dets, {n * blocks}, ScalarType::Long);
  const Tensor keep = alloc_empty(dets, {n}, ScalarType::Long);
  const Tensor num_keep = alloc_empty(dets, {1}, ScalarType::Long);
  const Tensor removed = alloc_empty(dets, {blocks}, ScalarType::Long);

  Pipeline mask_pso = nms_library().pipeline(std::string("nms_mask_") + type);
  Pipeline reduce_pso = nms_library().pipeline("nms_reduce");
  check_threads("nms", mask_pso, OPF_NMS_TILE);
  const Dispatch mask_dispatch = metal::dispatch_nms_mask(n);
  const Dispatch reduce_dispatch = metal::dispatch_nms_reduce(max_threads(reduce_pso));
  OpfNmsParams p{};
  p.num_boxes = n;
  p.col_blocks = blocks;
  p.iou_threshold = static_cast<float>(iou_threshold);

  encode(mask_pso, [&](Encoder enc) {
    set_pipeline(enc, mask_pso);
    bind(enc, boxes, OPF_NMS_MASK_BUF_BOXES);
    bind(enc, mask, OPF_NMS_MASK_BUF_MASK);
    bind_params(enc, p, OPF_NMS_MASK_BUF_PARAMS);
    dispatch(enc, mask_dispatch);
    // Same encoder: Metal runs the second dispatch after the first completes.
    set_pipeline(enc, reduce_pso);
    bind(enc, mask, OPF_NMS_REDUCE_BUF_MASK);
    bind(enc, order, OPF_NMS_REDUCE_BUF_ORDER);
    bind(enc, keep, OPF_NMS_REDUCE_BUF_KEEP);
    bind(enc, num_keep, OPF_NMS_REDUCE_BUF_NUM_KEEP);
    bind(enc, removed, OPF_NMS_REDUCE_BUF_REMOVED);
    bind_params(enc, p, OPF_NMS_REDUCE_BUF_PARAMS);
    dispatch(enc, reduce_dispatch);
  });
  const int64_t count = item_int64(num_keep);
  return narrowed(keep, 0, 0, count);
}

}  // namespace

// opforge::<op> on the MPS key; see metal_host.h
OPFORGE_MPS_LIBRARY_IMPL(m) {
  m.impl("nms", OPFORGE_KERNEL(nms_mps));
}

}  // namespace opforge::mps
