// Index probes of nms.metal (see roi_align_probes.cpp).

// in: row tile col_blocks -> out: mask word index
EMU_PROBE(nms_mask_word_index) { out[0] = static_cast<long>(nms_mask_word(in[0], in[1], in[2])); }
