// Index probes of roi_align.metal: the helpers the kernels use, evaluated on
// shapes far past 2^31 elements without allocating them.

// in: tgid.x tgid.y groups.x groups.y threads.x tid.x -> out: linear index
EMU_PROBE(linear_index) {
  const uint3 tgid(in[0], in[1], 0), groups(in[2], in[3], 1), threads(in[4], 1, 1), tid(in[5], 0, 0);
  out[0] = static_cast<long>(opf_linear_index(tgid, groups, threads, tid));
}

// in: C H W PH PW index batch sn sc sh sw -> out: n c ph pw plane_offset grad_offset
EMU_PROBE(roi_align_index) {
  OpfRoiAlignParams p{};
  p.channels = in[0];
  p.height = in[1];
  p.width = in[2];
  p.pooled_height = in[3];
  p.pooled_width = in[4];
  p.grad_stride_n = in[7];
  p.grad_stride_c = in[8];
  p.grad_stride_h = in[9];
  p.grad_stride_w = in[10];
  const RoiAlignItem it = roi_align_item(static_cast<ulong>(in[5]), p);
  out[0] = it.n;
  out[1] = it.c;
  out[2] = it.ph;
  out[3] = it.pw;
  out[4] = roi_align_plane_offset(in[6], it.c, p);
  out[5] = roi_align_grad_offset(it, p);
}
