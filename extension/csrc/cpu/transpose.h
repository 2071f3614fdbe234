// Transposes of small blocks in vector registers, for the kernels that change an array's
// layout on the way in or out (deform_conv2d's padded image and output, roi_align's
// channels-last copy). Exact: values are moved, never computed.
#pragma once

#include <cstdint>
#include <cstring>

// The tiles' vectors travel by value only between always-inlined functions: no call passes
// one, whatever a clone's vector ABI.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"

namespace opforge::cpu {

// dst[j * dst_ld + i] = src[i * src_ld + j] + (add ? add[j] : 0) for i < rows, j < cols: a
// transpose in square tiles of one vector's width (8 floats, 4 doubles) held in registers,
// the edges element by element. Addition of +0 changes no value.
#if defined(__GNUC__) && (defined(__clang__) || __GNUC__ >= 12)
#define OPFORGE_SHUFFLE_TILES 1
template <typename T>
struct TransposeTile {
  static constexpr int64_t size = 32 / sizeof(T);
  typedef T V __attribute__((vector_size(32), aligned(sizeof(T))));
  [[gnu::always_inline]] static V load(const T* p) {
    V v;
    std::memcpy(&v, p, sizeof(V));
    return v;
  }
  [[gnu::always_inline]] static void store(T* p, V v) { std::memcpy(p, &v, sizeof(V)); }
  // The tile of rows r[0..size) transposed in place.
  [[gnu::always_inline]] static void transpose(V* r) {
    if constexpr (size == 8) {
      V t[8], u[8];
      for (int k = 0; k < 8; k += 2) {
        t[k] = __builtin_shufflevector(r[k], r[k + 1], 0, 8, 1, 9, 4, 12, 5, 13);
        t[k + 1] = __builtin_shufflevector(r[k], r[k + 1], 2, 10, 3, 11, 6, 14, 7, 15);
      }
      for (int k = 0; k < 8; k += 4) {
        u[k] = __builtin_shufflevector(t[k], t[k + 2], 0, 1, 8, 9, 4, 5, 12, 13);
        u[k + 1] = __builtin_shufflevector(t[k], t[k + 2], 2, 3, 10, 11, 6, 7, 14, 15);
        u[k + 2] = __builtin_shufflevector(t[k + 1], t[k + 3], 0, 1, 8, 9, 4, 5, 12, 13);
        u[k + 3] = __builtin_shufflevector(t[k + 1], t[k + 3], 2, 3, 10, 11, 6, 7, 14, 15);
      }
      for (int k = 0; k < 4; ++k) {
        r[k] = __builtin_shufflevector(u[k], u[k + 4], 0, 1, 2, 3, 8, 9, 10, 11);
        r[k + 4] = __builtin_shufflevector(u[k], u[k + 4], 4, 5, 6, 7, 12, 13, 14, 15);
      }
    } else {
      static_assert(size == 4);
      const V t0 = __builtin_shufflevector(r[0], r[1], 0, 4, 2, 6);
      const V t1 = __builtin_shufflevector(r[0], r[1], 1, 5, 3, 7);
      const V t2 = __builtin_shufflevector(r[2], r[3], 0, 4, 2, 6);
      const V t3 = __builtin_shufflevector(r[2], r[3], 1, 5, 3, 7);
      r[0] = __builtin_shufflevector(t0, t2, 0, 1, 4, 5);
      r[1] = __builtin_shufflevector(t1, t3, 0, 1, 4, 5);
      r[2] = __builtin_shufflevector(t0, t2, 2, 3, 6, 7);
      r[3] = __builtin_shufflevector(t1, t3, 2, 3, 6, 7);
    }
  }
};
#endif

// rows_outer: tiles in source row order (reads front to back), else in destination row order
// (writes front to back).
template <bool rows_outer, typename T>
[[gnu::always_inline]] inline void transpose_block(const T* __restrict src, int64_t src_ld,
                                                   T* __restrict dst, int64_t dst_ld, int64_t rows,
                                                   int64_t cols, const T* add) {
  const auto element = [&](int64_t i, int64_t j) {
    dst[j * dst_ld + i] = add ? src[i * src_ld + j] + add[j] : src[i * src_ld + j];
  };
  int64_t full_rows = 0, full_cols = 0;
#ifdef OPFORGE_SHUFFLE_TILES
  using Tile = TransposeTile<T>;
  constexpr int64_t k = Tile::size;
  full_rows = rows / k * k;
  full_cols = cols / k * k;
  const auto tile = [&](int64_t i0, int64_t j0) {
    typename Tile::V r[k];
    for (int64_t i = 0; i < k; ++i) {
      r[i] = Tile::load(src + (i0 + i) * src_ld + j0);
    }
    Tile::transpose(r);
    for (int64_t j = 0; j < k; ++j) {
      Tile::store(dst + (j0 + j) * dst_ld + i0, add ? r[j] + add[j0 + j] : r[j]);
    }
  };
  if constexpr (rows_outer) {
    for (int64_t i0 = 0; i0 < full_rows; i0 += k) {
      for (int64_t j0 = 0; j0 < full_cols; j0 += k) {
        tile(i0, j0);
      }
    }
  } else {
    for (int64_t j0 = 0; j0 < full_cols; j0 += k) {
      for (int64_t i0 = 0; i0 < full_rows; i0 += k) {
        tile(i0, j0);
      }
    }
  }
#endif
  // The edges: the columns past the last full tile, then the rows past it.
  for (int64_t i = 0; i < full_rows; ++i) {
    for (int64_t j = full_cols; j < cols; ++j) {
      element(i, j);
    }
  }
  for (int64_t i = full_rows; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      element(i, j);
    }
  }
}

}  // namespace opforge::cpu

#pragma GCC diagnostic pop
