// deform_conv2d's forward sampling (the "bilinear im2col") over a channels-last input.
//
// With channels innermost, the four bilinear neighbours of one sampling point are four
// contiguous runs of channels: the point's corners, weights and mask are computed once
// per (output position, kernel tap, offset group) and applied to the whole channel run,
// a loop the compiler vectorizes. The columns it writes are laid out
//     columns[group][position][tap][channel in group]
// so that one group's columns for a block of positions are a (positions, taps * channels)
// matrix: the GEMM's reduction dimension runs over (tap, channel), and the weight is
// permuted to (out_channels, kernel_h, kernel_w, in_channels / groups) to match.
//
// Each channel's arithmetic is the channels-first kernel's, in its order:
//     mask * (((w0 * v0 + w1 * v1) + w2 * v2) + w3 * v3)
// with a neighbour outside the image read from a row of zeros (adding +0 changes no sum);
// the AVX2 / AVX-512 clones may fuse its multiply-adds, a rounding-level difference.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "../common.h"

// Vector width is chosen at load time: the kernels are compiled for the baseline x86-64
// (SSE2) like the rest of the extension, and the sampling loop is cloned for AVX2 and
// AVX-512 machines (GCC's function multiversioning: an ifunc, which glibc resolves once at
// load time, picks the clone). Elsewhere the one baseline version.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && \
    defined(__GLIBC__)
#define OPFORGE_VECTOR_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define OPFORGE_VECTOR_CLONES
#endif

namespace opforge::cpu {

// What deform_im2col_block reads and writes.
template <typename T>
struct DeformIm2colArgs {
  const DeformConv2dGeometry* g;
  const T* input;   // (batch, height, width, channels), dense
  const T* offset;  // (batch, offset_groups * kk * 2, out_h, out_w), dense
  const T* mask;    // (batch, offset_groups * kk, out_h, out_w), dense; nullptr: no mask
  const T* zeros;   // `channels` zeros: the row a neighbour outside the image reads
  int64_t q0, q1;   // positions [q0, q1) of the flattened (image, out_y, out_x) index
  int64_t stride;   // positions one group's slab of `columns` holds (>= q1 - q0)
  T* columns;       // (groups, stride, kk * channels / groups)
};

// dst[c] = m * (((w0 * a[c] + w1 * b[c]) + w2 * d[c]) + w3 * e[c]) for c in [0, n);
// without a mask, the same sum unscaled.
template <bool masked, typename T>
[[gnu::always_inline]] inline void bilinear_run(T* __restrict dst, const T* __restrict a,
                                                const T* __restrict b, const T* __restrict d,
                                                const T* __restrict e, T w0, T w1, T w2, T w3, T m,
                                                int64_t n) {
  for (int64_t c = 0; c < n; ++c) {
    const T v = ((w0 * a[c] + w1 * b[c]) + w2 * d[c]) + w3 * e[c];
    dst[c] = masked ? m * v : v;
  }
}

template <typename T>
[[gnu::always_inline]] inline void fill_run(T* __restrict dst, T value, int64_t n) {
  for (int64_t c = 0; c < n; ++c) {
    dst[c] = value;
  }
}

// Samples positions [q0, q1) for every tap and channel into `columns` (layout above).
// Sampling semantics are torchvision's: a point with y <= -1, y >= height, x <= -1 or
// x >= width samples 0 (NaN when a coordinate is NaN); otherwise the bilinear
// interpolation of its four neighbours, neighbours outside the image counting as 0.
// Taps run innermost: a position's taps and its neighbours' read the same few input rows,
// which stay in L1, and the columns are written in order. No integer division below the
// offset group loop: positions, taps and channel runs advance by steps.
template <bool masked, typename T>
[[gnu::always_inline]] inline void deform_im2col_block(const DeformIm2colArgs<T>& a) {
  const DeformConv2dGeometry& g = *a.g;
  const int64_t kk = g.kernel_size();
  const int64_t out_size = g.out_size();
  const int64_t channels = g.channels;
  const int64_t cpg = g.channels_per_offset_group();
  const int64_t cg = channels / g.groups;  // channels of one group
  const int64_t row = kk * cg;             // one position's entries in one group's slab
  const int64_t height = g.height, width = g.width;
  const int64_t image_elems = height * width * channels;
  const T nan = std::numeric_limits<T>::quiet_NaN();
  const int64_t first_image = a.q0 / out_size;
  const int64_t first_p = a.q0 % out_size;
  const int64_t first_oh = first_p / g.out_w, first_ow = first_p % g.out_w;
  const int64_t off_step = g.offset_groups * 2 * kk * out_size;  // one image of offsets
  const int64_t mask_step = g.offset_groups * kk * out_size;

  for (int64_t og = 0; og < g.offset_groups; ++og) {
    const int64_t c_first = og * cpg, c_last = c_first + cpg;
    const int64_t g_first = cg > 0 ? c_first / cg : 0;
    const T* off = a.offset + (first_image * g.offset_groups + og) * 2 * kk * out_size;
    const T* msk = masked ? a.mask + (first_image * g.offset_groups + og) * kk * out_size : nullptr;
    const T* image_base = a.input + first_image * image_elems;
    int64_t p = first_p, oh = first_oh, ow = first_ow;
    for (int64_t q = a.q0; q < a.q1; ++q) {
      const int64_t y_pos = oh * g.stride_h - g.pad_h, x_pos = ow * g.stride_w - g.pad_w;
      T* dst_q = a.columns + (g_first * a.stride + (q - a.q0)) * row + (c_first - g_first * cg);
      for (int64_t tap = 0, ki = 0, kj = 0; tap < kk; ++tap) {
        const T y = static_cast<T>(y_pos + ki * g.dilation_h) + off[2 * tap * out_size + p];
        const T x = static_cast<T>(x_pos + kj * g.dilation_w) + off[(2 * tap + 1) * out_size + p];
        const T m = masked ? msk[tap * out_size + p] : T(1);
        if (++kj == g.kernel_w) {
          kj = 0;
          ++ki;
        }
        // Written so that NaN coordinates fail it.
        const bool inside = y > -1 && y < height && x > -1 && x < width;
        const T* v[4] = {a.zeros, a.zeros, a.zeros, a.zeros};
        T w[4] = {0, 0, 0, 0};
        if (inside) {
          const int64_t y0 = static_cast<int64_t>(std::floor(y));
          const int64_t x0 = static_cast<int64_t>(std::floor(x));
          const T ly = y - static_cast<T>(y0), lx = x - static_cast<T>(x0);
          const T hy = 1 - ly, hx = 1 - lx;
          w[0] = hy * hx;
          w[1] = hy * lx;
          w[2] = ly * hx;
          w[3] = ly * lx;
          const T* r0 = image_base + (y0 * width + x0) * channels;
          const T* r1 = r0 + width * channels;
          const bool vy0 = y0 >= 0, vy1 = y0 + 1 <= height - 1;
          const bool vx0 = x0 >= 0, vx1 = x0 + 1 <= width - 1;
          if (vy0 && vx0)
            v[0] = r0;
          if (vy0 && vx1)
            v[1] = r0 + channels;
          if (vy1 && vx0)
            v[2] = r1;
          if (vy1 && vx1)
            v[3] = r1 + channels;
        }
        const T fill = inside || !(std::isnan(y) || std::isnan(x)) ? T(0) : nan;
        // The offset group's channels, one run per group they fall in.
        T* dst = dst_q + tap * cg;
        for (int64_t c0 = c_first, grp_end = (g_first + 1) * cg; c0 < c_last; grp_end += cg) {
          const int64_t c1 = std::min(c_last, grp_end);
          if (inside) {
            bilinear_run<masked>(dst, v[0] + c0, v[1] + c0, v[2] + c0, v[3] + c0, w[0], w[1], w[2],
                                 w[3], m, c1 - c0);
          } else {
            fill_run(dst, fill, c1 - c0);
          }
          // The next group's run starts at its first channel.
          dst += a.stride * row - (c0 - (grp_end - cg));
          c0 = c1;
        }
      }
      if (++ow == g.out_w) {
        ow = 0;
        if (++oh == g.out_h) {
          oh = 0;
          // The next image.
          p = -1;
          off += off_step;
          if (masked)
            msk += mask_step;
          image_base += image_elems;
        }
      }
      ++p;
    }
  }
}

}  // namespace opforge::cpu
