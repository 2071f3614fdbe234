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
// with a neighbour outside the image read from a row of zeros (adding +0 changes no sum),
// so a column entry is the same number either way.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "../common.h"

// Vector width is chosen at load time: the kernels are compiled for the baseline x86-64
// (SSE2) like the rest of the extension, and the sampling loop is cloned for AVX2 and
// AVX-512 machines (GCC's function multiversioning: an ifunc picks the clone once).
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
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

// dst[c] = m * (((w0 * a[c] + w1 * b[c]) + w2 * d[c]) + w3 * e[c]) for c in [0, n).
template <typename T>
[[gnu::always_inline]] inline void bilinear_run(T* __restrict dst, const T* __restrict a,
                                                const T* __restrict b, const T* __restrict d,
                                                const T* __restrict e, T w0, T w1, T w2, T w3,
                                                T m, int64_t n) {
  for (int64_t c = 0; c < n; ++c) {
    dst[c] = m * (((w0 * a[c] + w1 * b[c]) + w2 * d[c]) + w3 * e[c]);
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
template <typename T>
[[gnu::always_inline]] inline void deform_im2col_block(const DeformIm2colArgs<T>& a) {
  const DeformConv2dGeometry& g = *a.g;
  const int64_t kk = g.kernel_size();
  const int64_t out_size = g.out_size();
  const int64_t channels = g.channels;
  const int64_t cpg = g.channels_per_offset_group();
  const int64_t cg = channels / g.groups;  // channels of one group
  const int64_t row = kk * cg;             // one position's entries in one group's slab
  const int64_t height = g.height, width = g.width;
  const T nan = std::numeric_limits<T>::quiet_NaN();

  for (int64_t og = 0; og < g.offset_groups; ++og) {
    const int64_t c_first = og * cpg, c_last = c_first + cpg;
    for (int64_t tap = 0; tap < kk; ++tap) {
      const int64_t ki = tap / g.kernel_w, kj = tap % g.kernel_w;
      int64_t image = a.q0 / out_size;
      int64_t p = a.q0 % out_size;
      for (int64_t q = a.q0; q < a.q1; ++q, ++p) {
        if (p == out_size) {
          p = 0;
          ++image;
        }
        const T* off =
            a.offset + ((image * g.offset_groups + og) * 2 * kk + 2 * tap) * out_size + p;
        const int64_t oh = p / g.out_w, ow = p % g.out_w;
        const T y = static_cast<T>(oh * g.stride_h - g.pad_h + ki * g.dilation_h) + off[0];
        const T x = static_cast<T>(ow * g.stride_w - g.pad_w + kj * g.dilation_w) + off[out_size];
        const T m = a.mask ? a.mask[((image * g.offset_groups + og) * kk + tap) * out_size + p]
                           : T(1);
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
          const T* base = a.input + image * height * width * channels;
          const bool vy0 = y0 >= 0, vy1 = y0 + 1 <= height - 1;
          const bool vx0 = x0 >= 0, vx1 = x0 + 1 <= width - 1;
          if (vy0 && vx0) v[0] = base + (y0 * width + x0) * channels;
          if (vy0 && vx1) v[1] = base + (y0 * width + x0 + 1) * channels;
          if (vy1 && vx0) v[2] = base + ((y0 + 1) * width + x0) * channels;
          if (vy1 && vx1) v[3] = base + ((y0 + 1) * width + x0 + 1) * channels;
        }
        const bool is_nan = std::isnan(y) || std::isnan(x);
        // The offset group's channels, one run per group they fall in.
        for (int64_t c0 = c_first; c0 < c_last;) {
          const int64_t grp = c0 / cg;
          const int64_t c1 = std::min(c_last, (grp + 1) * cg);
          T* dst = a.columns + (grp * a.stride + (q - a.q0)) * row + tap * cg + (c0 - grp * cg);
          if (inside) {
            bilinear_run(dst, v[0] + c0, v[1] + c0, v[2] + c0, v[3] + c0, w[0], w[1], w[2], w[3],
                         m, c1 - c0);
          } else {
            fill_run(dst, is_nan ? nan : T(0), c1 - c0);
          }
          c0 = c1;
        }
      }
    }
  }
}

}  // namespace opforge::cpu
