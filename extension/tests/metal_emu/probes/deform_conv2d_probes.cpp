// Index probes of deform_conv2d.metal (see roi_align_probes.cpp).

// in: batch C H W OH OW KH KW OG  b c g i j y x
// out: plane offset_base mask_base column
EMU_PROBE(deform_index) {
  OpfDeformParams p{};
  p.batch = in[0];
  p.channels = in[1];
  p.height = in[2];
  p.width = in[3];
  p.out_h = in[4];
  p.out_w = in[5];
  p.kernel_h = in[6];
  p.kernel_w = in[7];
  p.offset_groups = in[8];
  const long b = in[9], c = in[10], g = in[11], i = in[12], j = in[13], y = in[14], x = in[15];
  out[0] = deform_plane(b, c, p);
  out[1] = deform_offset_base(b, g, p);
  out[2] = deform_mask_base(b, g, p);
  out[3] = deform_column(c, i, j, b, y, x, p);
}
