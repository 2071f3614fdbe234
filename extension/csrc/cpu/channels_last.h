// The channels-last paths of the bilinear kernels (roi_align): with channels innermost,
// one bilinear sample's four neighbours are four contiguous runs of channels, so a
// sample's weights are loaded once and applied to a vector of channels at a time.
//
// Vec<T> is a fixed-width group of lanes that the compiler turns into vector
// instructions. It is what at::vec::Vectorized<T> is in an extension: without the
// per-CPU-capability builds ATen compiles itself as, Vectorized is its portable
// fallback, this same loop. Vec is used in both builds: the stable ABI has no ATen
// headers (the header-only tree has no Vectorized), and ATen's vector headers would
// add a screen of -Wunknown-pragmas warnings (`#pragma unroll`) to every legacy
// build. Each channel's arithmetic is the scalar kernel's, in its order: results
// are the same as the channels-first loops give.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "../abi.h"
#include "parallel_policy.h"
#include "transpose.h"

namespace opforge::cpu {

template <typename T>
struct Lanes {
  static constexpr int64_t size() { return 32 / static_cast<int64_t>(sizeof(T)); }
  T v[32 / sizeof(T)];
  Lanes() = default;
  // A broadcast, implicit as Vectorized's is.
  // NOLINTNEXTLINE(google-explicit-constructor)
  [[gnu::always_inline]] Lanes(T value) {
    for (int64_t i = 0; i < size(); ++i)
      v[i] = value;
  }
  [[gnu::always_inline]] static Lanes loadu(const T* p) {
    Lanes out;
    for (int64_t i = 0; i < size(); ++i)
      out.v[i] = p[i];
    return out;
  }
  [[gnu::always_inline]] void store(T* p) const {
    for (int64_t i = 0; i < size(); ++i)
      p[i] = v[i];
  }
  [[gnu::always_inline]] friend Lanes operator+(const Lanes& a, const Lanes& b) {
    Lanes out;
    for (int64_t i = 0; i < size(); ++i)
      out.v[i] = a.v[i] + b.v[i];
    return out;
  }
  [[gnu::always_inline]] friend Lanes operator*(const Lanes& a, const Lanes& b) {
    Lanes out;
    for (int64_t i = 0; i < size(); ++i)
      out.v[i] = a.v[i] * b.v[i];
    return out;
  }
  [[gnu::always_inline]] friend Lanes operator/(const Lanes& a, const Lanes& b) {
    Lanes out;
    for (int64_t i = 0; i < size(); ++i)
      out.v[i] = a.v[i] / b.v[i];
    return out;
  }
};
template <typename T>
using Vec = Lanes<T>;

// Whether a tensor of shape (N, C, H, W) is laid out channels-last (N, H, W, C), dense.
inline bool is_channels_last(const Tensor& t) {
  if (t.dim() != 4) {
    return false;
  }
  const int64_t c = t.size(1), h = t.size(2), w = t.size(3);
  // Size-1 dimensions may carry any stride.
  return (c == 1 || t.stride(1) == 1) && (w == 1 || t.stride(3) == c) &&
         (h == 1 || t.stride(2) == w * c) && (t.size(0) == 1 || t.stride(0) == h * w * c);
}

// acc[c] += w0 * p0[c] + w1 * p1[c] + w2 * p2[c] + w3 * p3[c], for c in [0, n).
template <typename acc_t, typename scalar_t>
[[gnu::always_inline]] inline void add_bilinear(acc_t* acc, const scalar_t* p0, const scalar_t* p1,
                                                const scalar_t* p2, const scalar_t* p3,
                                                const acc_t* w, int64_t n) {
  int64_t c = 0;
  if constexpr (std::is_same_v<acc_t, scalar_t>) {
    using V = Vec<acc_t>;
    const V w0(w[0]), w1(w[1]), w2(w[2]), w3(w[3]);
    for (; c + V::size() <= n; c += V::size()) {
      const V sum = w0 * V::loadu(p0 + c) + w1 * V::loadu(p1 + c) + w2 * V::loadu(p2 + c) +
                    w3 * V::loadu(p3 + c);
      (V::loadu(acc + c) + sum).store(acc + c);
    }
  }
  for (; c < n; ++c) {
    acc[c] += w[0] * static_cast<acc_t>(p0[c]) + w[1] * static_cast<acc_t>(p1[c]) +
              w[2] * static_cast<acc_t>(p2[c]) + w[3] * static_cast<acc_t>(p3[c]);
  }
}

// out[c] = 0 for c in [0, n).
template <typename T>
[[gnu::always_inline]] inline void zero_fill(T* out, int64_t n) {
  std::fill(out, out + n, T(0));
}

// Channels [c0, c1) of one dense (C, plane) image into its (plane, C) copy, converted to
// acc_t: same-type float and double in register tiles (transpose.h), other types in 16 x 16
// blocks element by element.
template <typename scalar_t, typename acc_t>
[[gnu::always_inline]] inline void channels_to_last(const scalar_t* src, acc_t* dst,
                                                    int64_t channels, int64_t plane, int64_t c0,
                                                    int64_t c1) {
  if constexpr (std::is_same_v<scalar_t, acc_t> &&
                (std::is_same_v<acc_t, float> || std::is_same_v<acc_t, double>)) {
    transpose_block<true>(src + c0 * plane, plane, dst + c0, channels, c1 - c0, plane,
                          static_cast<const acc_t*>(nullptr));
  } else {
    constexpr int64_t block = 16;
    for (int64_t p0 = 0; p0 < plane; p0 += block) {
      const int64_t p1 = std::min(plane, p0 + block);
      for (int64_t c = c0; c < c1; ++c) {
        for (int64_t p = p0; p < p1; ++p) {
          dst[p * channels + c] = static_cast<acc_t>(src[c * plane + p]);
        }
      }
    }
  }
}

// channels_to_last as a callable; a kernel file may pass its own, compiled for wider vectors
// (vector_clones.h), to to_channels_last.
struct ChannelsToLast {
  template <typename scalar_t, typename acc_t>
  void operator()(const scalar_t* src, acc_t* dst, int64_t channels, int64_t plane, int64_t c0,
                  int64_t c1) const {
    channels_to_last(src, dst, channels, plane, c0, c1);
  }
};

// A dense (N, C, H, W) array as (N, H, W, C), converted to acc_t: the transpose runs over
// (image, block of 16 channels) items as the work asks.
template <typename scalar_t, typename acc_t, typename Transpose = ChannelsToLast>
void to_channels_last(const scalar_t* in, acc_t* out, int64_t batch, int64_t channels,
                      int64_t plane, Transpose transpose = {}) {
  constexpr int64_t block = 16;
  const int64_t blocks = (channels + block - 1) / block;
  parallel_for_work(batch * blocks, block * plane, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t n = item / blocks;
      const int64_t c0 = (item % blocks) * block;
      const int64_t c1 = std::min(channels, c0 + block);
      transpose(in + n * channels * plane, out + n * channels * plane, channels, plane, c0, c1);
    }
  });
}

}  // namespace opforge::cpu
