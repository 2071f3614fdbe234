// DELIBERATELY WRONG: the negative control of test_metal_emu.py.
// roi_align backward with the grid-stride bug seen in the field: a loop that
// strides by one threadgroup's width while the host also dispatches one
// threadgroup per 256 items.  Every item is then processed by every
// threadgroup at or before it, so gradients are added up to groups-many
// times.  The test proves the same check that passes roi_align_backward_float
// fails on this kernel.
#include "roi_align.metal"

kernel void roi_align_backward_grid_stride_float(
    device const float* grad [[buffer(OPF_ROI_ALIGN_BWD_BUF_GRAD)]],
    device const float* rois [[buffer(OPF_ROI_ALIGN_BWD_BUF_ROIS)]],
    device float* grad_input [[buffer(OPF_ROI_ALIGN_BWD_BUF_GRAD_INPUT)]],
    constant OpfRoiAlignParams& p [[buffer(OPF_ROI_ALIGN_BWD_BUF_PARAMS)]],
    uint3 tgid [[threadgroup_position_in_grid]],
    uint3 threads [[threads_per_threadgroup]],
    uint3 tid [[thread_position_in_threadgroup]]) {
  for (ulong index = (ulong)tgid.x * threads.x + tid.x; index < (ulong)p.total; index += threads.x) {
    roi_align_backward_item<float>(grad, rois, grad_input, p, index);
  }
}
