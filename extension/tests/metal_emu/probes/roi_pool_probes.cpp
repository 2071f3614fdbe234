// Index probes of roi_pool.metal (see roi_align_probes.cpp).

// in: C H W PH PW index batch sn sc sh sw -> out: n c ph pw plane_offset grad_offset
EMU_PROBE(roi_pool_index) {
  OpfRoiPoolParams p{};
  p.channels = in[0];
  p.height = in[1];
  p.width = in[2];
  p.pooled_height = in[3];
  p.pooled_width = in[4];
  p.grad_stride_n = in[7];
  p.grad_stride_c = in[8];
  p.grad_stride_h = in[9];
  p.grad_stride_w = in[10];
  const RoiPoolItem it = roi_pool_item(static_cast<ulong>(in[5]), p);
  out[0] = it.n;
  out[1] = it.c;
  out[2] = it.ph;
  out[3] = it.pw;
  out[4] = roi_pool_plane_offset(in[6], it.c, p);
  out[5] = roi_pool_grad_offset(it, p);
}
