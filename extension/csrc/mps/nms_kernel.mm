// nms on MPS: IoU bitmask and greedy reduction both on the GPU
// (csrc/metal/nms.metal); only the kept count (8 bytes) is read back, to size
// the result.  Below the CPU crossover (dispatch.h) the CPU kernel runs instead.
#include <opforge_metal/nms.h>
#include <torch/library.h>

#include "common.h"
#include "metal/nms.h"
#include "mps/metal_host.h"

namespace opforge::mps {
namespace {

OPFORGE_KERNEL_LIBRARY(nms)

at::Tensor nms_mps(const at::Tensor& dets, const at::Tensor& scores, double iou_threshold) {
  check_nms_inputs(dets, scores);
  check_mps("nms", "boxes (dets)", dets);
  const char* type = metal_type(dets, "nms");
  const int64_t n = dets.size(0);
  if (n == 0)
    return at::empty({0}, dets.options().dtype(at::kLong));
  if (metal::route_to_cpu(metal::kNmsCrossover, n)) {
    auto out = call_cpu("opforge::nms", {dets, scores, iou_threshold});
    return to_device(out[0], dets.device());
  }

  const at::Tensor order =
      std::get<1>(scores.sort(/*stable=*/true, /*dim=*/0, /*descending=*/true));
  const at::Tensor boxes = dets.index_select(0, order).contiguous();
  const int64_t blocks = metal::nms_col_blocks(n);
  const auto long_opts = dets.options().dtype(at::kLong);
  const at::Tensor mask = at::empty({n * blocks}, long_opts);
  const at::Tensor keep = at::empty({n}, long_opts);
  const at::Tensor num_keep = at::empty({1}, long_opts);
  const at::Tensor removed = at::empty({blocks}, long_opts);

  Pipeline mask_pso = nms_library().pipeline(std::string("nms_mask_") + type);
  Pipeline reduce_pso = nms_library().pipeline("nms_reduce");
  TORCH_CHECK(max_threads(mask_pso) >= OPF_NMS_TILE, "nms: the GPU allows only ",
              max_threads(mask_pso), " threads per threadgroup; the mask kernel needs ",
              OPF_NMS_TILE);
  const Dispatch mask_dispatch = metal::dispatch_nms_mask(n);
  const Dispatch reduce_dispatch = metal::dispatch_nms_reduce(max_threads(reduce_pso));
  OpfNmsParams p{};
  p.num_boxes = n;
  p.col_blocks = blocks;
  p.iou_threshold = static_cast<float>(iou_threshold);

  encode([&](Encoder enc) {
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
  const int64_t count = num_keep.item<int64_t>();
  return keep.narrow(0, 0, count);
}

}  // namespace

// TORCH_LIBRARY_IMPL(opforge, MPS, m); see metal_host.h
OPFORGE_MPS_LIBRARY_IMPL(m) {
  m.impl("nms", TORCH_FN(nms_mps));
}

}  // namespace opforge::mps
