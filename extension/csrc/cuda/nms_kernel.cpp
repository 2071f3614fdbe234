// CUDA kernel for opforge::nms (dispatch key CUDA).
//
// 1. Sort boxes by score on the device.
// 2. nms_mask_kernel: block (r, c) compares the 64 boxes of row block r with the 64 boxes
//    of column block c (c >= r) and writes one 64-bit word per row box: bit k is set when
//    IoU(row box, column box c*64+k) > iou_threshold and the column box comes later.
// 3. nms_reduce_kernel: ONE block walks the sorted boxes in order, keeping the
//    "removed" bitmask in shared memory, and writes the kept indices and their count on
//    the device. The N x N/64 mask never leaves the device.
// 4. The host reads the 8-byte count (the one device->host sync of this op, needed to
//    size the result tensor) and returns a view of the first `count` indices.
#include "cuda_utils.h"

namespace opforge::cuda {
namespace {

inline int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

Tensor nms_cuda(const Tensor& dets, const Tensor& scores, double iou_threshold) {
  check_cuda("nms", "boxes (dets)", dets);
  check_nms_inputs(dets, scores);

  const CudaDeviceGuard device_guard(dets);
  const int64_t n_boxes = dets.size(0);
  if (n_boxes == 0) {
    return alloc_empty(dets, {0}, ScalarType::Long);
  }
  const int64_t col_blocks = ceil_div(n_boxes, kNmsBoxesPerBlock);
  OPFORGE_CHECK(col_blocks <= 65535, "nms: at most ", 65535 * int64_t(kNmsBoxesPerBlock),
                " boxes are supported on CUDA, got ", n_boxes);

  const int64_t shared_bytes = col_blocks * int64_t(sizeof(unsigned long long));
  const int64_t shared_optin = cuda_shared_memory_optin();
  OPFORGE_CHECK(
      shared_bytes <= shared_optin - 1024, "nms: ", n_boxes, " boxes need ", shared_bytes,
      " bytes of shared memory for the suppression bitmask, more than this device allows (",
      shared_optin, ")");

  const Tensor order = argsort_descending_stable(scores);
  const Tensor sorted_boxes = as_contiguous(index_selected(dets, 0, order));
  const Tensor mask = alloc_empty(dets, {n_boxes * col_blocks}, ScalarType::Long);
  const Tensor keep = alloc_empty(dets, {n_boxes}, ScalarType::Long);
  const Tensor num_kept = alloc_empty(dets, {1}, ScalarType::Long);

  const cudaStream_t stream = current_cuda_stream(dets);
  const Grid mask_grid{dim3(col_blocks, col_blocks), dim3(kNmsBoxesPerBlock), 0, stream};
  OPFORGE_DISPATCH_FLOATING_TYPES(dets.scalar_type(), "opforge_nms_cuda", [&] {
    OPFORGE_CUDA_CHECK(launch(mask_grid, NmsMask<scalar_t>{
                                             .n_boxes = n_boxes,
                                             .iou_threshold = iou_threshold,
                                             .boxes = sorted_boxes.const_data_ptr<scalar_t>(),
                                             .mask = reinterpret_cast<unsigned long long*>(
                                                 mask.mutable_data_ptr<int64_t>()),
                                             .col_blocks = col_blocks,
                                         }));
  });

  const Grid reduce_grid{dim3(1), dim3(kNmsReduceThreads), static_cast<size_t>(shared_bytes),
                         stream};
  OPFORGE_CUDA_CHECK(launch(reduce_grid, NmsReduce{
                                             .n_boxes = n_boxes,
                                             .col_blocks = col_blocks,
                                             .mask = reinterpret_cast<const unsigned long long*>(
                                                 mask.const_data_ptr<int64_t>()),
                                             .order = order.const_data_ptr<int64_t>(),
                                             .keep = keep.mutable_data_ptr<int64_t>(),
                                             .num_kept = num_kept.mutable_data_ptr<int64_t>(),
                                         }));

  // The single host sync: the result's length is data-dependent.
  const int64_t count = item_int64(num_kept);
  return narrowed(keep, 0, 0, count);
}

}  // namespace

OPFORGE_LIBRARY_IMPL(CUDA, m) {
  m.impl("nms", OPFORGE_KERNEL(nms_cuda));
}

}  // namespace opforge::cuda
