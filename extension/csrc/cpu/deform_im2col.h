// deform_conv2d's forward sampling (the "bilinear im2col") over a padded channels-last copy
// of one image.
//
// The image is copied, one image at a time by the thread that samples it (so the copy is
// still in that core's L2 when it is read), to (height + 3, width + 2, channels) with the
// image at row 1, column 1 and a zero border. Every corner of a point inside
// (-1, height) x (-1, width) then lies inside the copy, and the 2x2 cells at row height + 1,
// column 0 are all zero: a point outside the image reads them. So no corner needs a
// bounds check.
//
// For a run of output positions of one image and one offset group, the sampling tables are
// computed tap by tap, a loop over positions that the compiler vectorizes: the offset of
// each point's top-left corner in the copy and its four bilinear weights with the mask
// folded in. One loop over the channels then does the weighted sum of four contiguous runs
// of channels, also vectorized. The columns it writes are laid out
//     columns[group][position][tap][channel in group]
// so that one group's columns for a block of positions are a (positions, taps * channels)
// matrix: the GEMM's reduction dimension runs over (tap, channel), and the weight is
// permuted to (out_channels, kernel_h, kernel_w, in_channels / groups) to match.
//
// Each channel's arithmetic is
//     ((mw0 * v0 + mw1 * v1) + mw2 * v2) + mw3 * v3,   mwi = bilinear weight i * mask
// (the mask multiplied into the weights rather than into the sum: a rounding-level
// difference from torchvision's mask * (...)); a neighbour outside the image reads a zero
// of the border. A point outside the image samples 0, a NaN coordinate NaN (its first
// weight is NaN, and its corners are zeros). The AVX2 / AVX-512 clones may fuse the
// multiply-adds, also a rounding-level difference.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "../common.h"
#include "transpose.h"
#include "vector_clones.h"  // the sampling loops: AVX2 and AVX-512 clones

namespace opforge::cpu {

// Output positions whose sampling tables are computed together: the tables of a run (about
// 24 bytes per position and tap in float32) stay in L1 while the run's columns are written.
inline constexpr int64_t kDeformRun = 64;

// The padded copy of one image (see above), in elements of its scalar type.
struct DeformPadding {
  int64_t row_cells;  // width + 2
  int64_t rows;       // height + 3
  int64_t channels;
  int64_t elements() const { return rows * row_cells * channels; }
  // From the start of the copy to the image's (0, 0).
  int64_t origin() const { return (row_cells + 1) * channels; }
  // From the image's (0, 0) to the all-zero cells an outside point reads: (height, -1).
  int64_t zero_cell(int64_t height) const { return (height * row_cells - 1) * channels; }
};

inline DeformPadding deform_padding(const DeformConv2dGeometry& g) {
  return {g.width + 2, g.height + 3, g.channels};
}

// Zeroes the border of a padded copy (the interior is written by pad_image_*).
template <typename T>
void zero_padding_border(T* dst, const DeformPadding& pad, int64_t height, int64_t width) {
  const int64_t c = pad.channels, row = pad.row_cells * c;
  std::fill(dst, dst + row, T(0));
  for (int64_t y = 1; y <= height; ++y) {
    std::fill(dst + y * row, dst + y * row + c, T(0));
    std::fill(dst + y * row + (width + 1) * c, dst + (y + 1) * row, T(0));
  }
  std::fill(dst + (height + 1) * row, dst + (height + 3) * row, T(0));
}

// One NCHW image (channels, height, width) into the interior of a padded copy, row by row.
// (Called from a function cloned per vector width, like deform_im2col_run.)
template <typename T>
[[gnu::always_inline]] inline void pad_image_from_nchw(const T* __restrict src, T* __restrict dst,
                                                       const DeformPadding& pad, int64_t height,
                                                       int64_t width) {
  const int64_t channels = pad.channels, plane = height * width;
  for (int64_t y = 0; y < height; ++y) {
    // (channels, width) at stride plane -> (width, channels)
    transpose_block<true>(src + y * width, plane, dst + ((y + 1) * pad.row_cells + 1) * channels,
                          channels, channels, width, static_cast<const T*>(nullptr));
  }
}

// One channels-last image (height, width, channels) into the interior of a padded copy.
template <typename T>
void pad_image_from_nhwc(const T* src, T* dst, const DeformPadding& pad, int64_t height,
                         int64_t width) {
  const int64_t channels = pad.channels;
  for (int64_t y = 0; y < height; ++y) {
    std::memcpy(dst + ((y + 1) * pad.row_cells + 1) * channels, src + y * width * channels,
                sizeof(T) * width * channels);
  }
}

// What deform_im2col_run reads and writes.
template <typename T>
struct DeformIm2colArgs {
  const DeformConv2dGeometry* g;
  DeformPadding pad;
  const T* image;   // the padded copy of image `image_index`, at its (0, 0)
  const T* offset;  // (batch, offset_groups * kk * 2, out_h, out_w), dense
  const T* mask;    // (batch, offset_groups * kk, out_h, out_w), dense; nullptr: no mask
  int64_t image_index;
  int64_t p0, p1;  // positions [p0, p1) of that image, at most kDeformRun of them
  T* columns;      // position p0's row in group 0's slab
  int64_t stride;  // elements from one group's slab to the next
  // Scratch of kDeformRun positions: base_y, base_x (kDeformRun each), weights
  // (4 * kk * kDeformRun), corners (kk * kDeformRun).
  T* base_y;
  T* base_x;
  T* weights;
  int64_t* corners;
};

// Sampling tables of one offset group for positions [p0, p1): for tap t and position i of the
// run, corners[t * kDeformRun + i] is the top-left corner's offset from the image's (0, 0)
// and weights[(4 * t + k) * kDeformRun + i] the k-th corner's weight times the mask.
template <bool masked, typename T>
[[gnu::always_inline]] inline void deform_tables(const DeformIm2colArgs<T>& a, int64_t og) {
  const DeformConv2dGeometry& g = *a.g;
  const int64_t kk = g.kernel_size();
  const int64_t out_size = g.out_size();
  const int64_t n = a.p1 - a.p0;
  const int64_t channels = a.pad.channels;
  const int64_t row_cells = a.pad.row_cells;
  const int64_t zero_cell = a.pad.zero_cell(g.height);
  const T height = static_cast<T>(g.height), width = static_cast<T>(g.width);
  using Bits = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
  static_assert(sizeof(Bits) == sizeof(T));
  const Bits nan_bits = std::bit_cast<Bits>(std::numeric_limits<T>::quiet_NaN());
  const T* off = a.offset + (a.image_index * g.offset_groups + og) * 2 * kk * out_size + a.p0;
  const T* msk =
      masked ? a.mask + (a.image_index * g.offset_groups + og) * kk * out_size + a.p0 : nullptr;
  const T* __restrict by = a.base_y;
  const T* __restrict bx = a.base_x;
  for (int64_t tap = 0; tap < kk; ++tap) {
    const T dy = static_cast<T>((tap / g.kernel_w) * g.dilation_h);
    const T dx = static_cast<T>((tap % g.kernel_w) * g.dilation_w);
    const T* __restrict oy = off + 2 * tap * out_size;
    const T* __restrict ox = oy + out_size;
    const T* __restrict m = masked ? msk + tap * out_size : nullptr;
    T* __restrict w0 = a.weights + 4 * tap * kDeformRun;
    T* __restrict w1 = w0 + kDeformRun;
    T* __restrict w2 = w1 + kDeformRun;
    T* __restrict w3 = w2 + kDeformRun;
    int64_t* __restrict corner = a.corners + tap * kDeformRun;
    // Branch-free, so that the loop vectorizes: values that only matter inside the image are
    // masked with bit operations (a select of the outside case's constants would make the
    // compiler split the loop into branches).
    for (int64_t i = 0; i < n; ++i) {
      const T y = (by[i] + dy) + oy[i];
      const T x = (bx[i] + dx) + ox[i];
      // Written so that NaN coordinates fail it.
      const bool inside = (y > T(-1)) & (y < height) & (x > T(-1)) & (x < width);
      const Bits keep = Bits(0) - static_cast<Bits>(inside);
      // Outside, 0: no conversion of a value out of an integer's range.
      const T yc = std::bit_cast<T>(std::bit_cast<Bits>(y) & keep);
      const T xc = std::bit_cast<T>(std::bit_cast<Bits>(x) & keep);
      // floor, for values above -1.
      int32_t iy = static_cast<int32_t>(yc), ix = static_cast<int32_t>(xc);
      iy -= static_cast<T>(iy) > yc;
      ix -= static_cast<T>(ix) > xc;
      const T ly = yc - static_cast<T>(iy), lx = xc - static_cast<T>(ix);
      const T hy = T(1) - ly, hx = T(1) - lx;
      // The mask inside, +0 outside (where the weights are finite): outside weights are 0.
      const T mi = std::bit_cast<T>(std::bit_cast<Bits>(masked ? m[i] : T(1)) & keep);
      const Bits is_nan = Bits(0) - static_cast<Bits>((y != y) | (x != x));
      w0[i] = (hy * hx) * mi + std::bit_cast<T>(nan_bits & is_nan);
      w1[i] = (hy * lx) * mi;
      w2[i] = (ly * hx) * mi;
      w3[i] = (ly * lx) * mi;
      const int64_t cell = static_cast<int64_t>(iy) * row_cells + ix;
      corner[i] = inside ? cell * channels : zero_cell;
    }
  }
}

// Samples positions [p0, p1) of one image for every tap and channel into `columns` (layout
// above). Sampling semantics are torchvision's: a point with y <= -1, y >= height, x <= -1
// or x >= width samples 0 (NaN when a coordinate is NaN); otherwise the bilinear
// interpolation of its four neighbours, neighbours outside the image counting as 0.
template <bool masked, typename T>
[[gnu::always_inline]] inline void deform_im2col_run(const DeformIm2colArgs<T>& a) {
  const DeformConv2dGeometry& g = *a.g;
  const int64_t kk = g.kernel_size();
  const int64_t channels = a.pad.channels;
  const int64_t below = a.pad.row_cells * channels;  // from a cell to the one below it
  const int64_t cpg = g.channels_per_offset_group();
  const int64_t cg = channels / g.groups;  // channels of one group
  const int64_t row = kk * cg;             // one position's entries in one group's slab
  const int64_t n = a.p1 - a.p0;

  // The run's integer sampling origins, once for every tap and offset group.
  for (int64_t i = 0, oh = a.p0 / g.out_w, ow = a.p0 % g.out_w; i < n; ++i) {
    a.base_y[i] = static_cast<T>(oh * g.stride_h - g.pad_h);
    a.base_x[i] = static_cast<T>(ow * g.stride_w - g.pad_w);
    if (++ow == g.out_w) {
      ow = 0;
      ++oh;
    }
  }
  for (int64_t og = 0; og < g.offset_groups; ++og) {
    deform_tables<masked>(a, og);
    const int64_t c_first = og * cpg, c_last = c_first + cpg;
    const int64_t g_first = cg > 0 ? c_first / cg : 0;
    for (int64_t i = 0; i < n; ++i) {
      T* dst_i = a.columns + g_first * a.stride + i * row + (c_first - g_first * cg);
      for (int64_t tap = 0; tap < kk; ++tap) {
        const T* __restrict r0 = a.image + a.corners[tap * kDeformRun + i];
        const T* __restrict r1 = r0 + below;
        const T* wt = a.weights + 4 * tap * kDeformRun + i;
        const T w0 = wt[0], w1 = wt[kDeformRun], w2 = wt[2 * kDeformRun], w3 = wt[3 * kDeformRun];
        // The offset group's channels, one run per group they fall in.
        T* dst = dst_i + tap * cg;
        for (int64_t c0 = c_first, grp_end = (g_first + 1) * cg; c0 < c_last; grp_end += cg) {
          const int64_t c1 = std::min(c_last, grp_end);
          T* __restrict out = dst;
          for (int64_t c = c0; c < c1; ++c) {
            out[c - c0] =
                ((w0 * r0[c] + w1 * r0[c + channels]) + w2 * r1[c]) + w3 * r1[c + channels];
          }
          // The next group's run starts at its first channel.
          dst += a.stride - (c0 - (grp_end - cg));
          c0 = c1;
        }
      }
    }
  }
}

}  // namespace opforge::cpu
