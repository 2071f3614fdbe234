// A float32 matrix product for deform_conv2d's forward, c = a @ b with a (rows, depth) read in
// place at row stride lda and b (depth, cols) dense, on AVX-512 machines.
//
// Why not torch's bmm (MKL): the forward multiplies each block of sampled columns (a few
// hundred positions x kh * kw * channels, just written and still in L2) with the same small
// weight. A BLAS packs the columns into its own layout first, and with only out_channels
// (64) columns of product per packed element that copy was a ninth of MKL's time in the
// forward (b8 c64 56x56, one thread). Here a register tile of kRows rows by up to 64 columns
// (24 of the 32 zmm registers) reads a's rows where they are, one broadcast element per row
// and depth step, and b's row of the step from L1/L2: 224 x 576 @ 576 x 64 blocks at about
// 115 GFLOP/s of thread CPU time on one Zen 4 core, against 95 for torch.mm on them.
//
// Each element is one chain of fused multiply-adds over the depth in order, so the result
// depends on neither the block nor the thread: a rounding-level difference from MKL's.
#pragma once

#include <cstdint>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define OPFORGE_SMALL_GEMM 1
#include <immintrin.h>
#endif

namespace opforge::cpu {

#ifdef OPFORGE_SMALL_GEMM
namespace small_gemm_detail {

constexpr int kRows = 6;

// c[r][16 * v + j] = sum over k of a[r * lda + k] * b[k * ldb + 16 * v + j], r < R, v < V.
template <int R, int V>
__attribute__((target("avx512f"))) void tile(const float* __restrict a, int64_t lda,
                                             const float* __restrict b, int64_t ldb, int64_t depth,
                                             float* __restrict c, int64_t ldc) {
  __m512 acc[R][V];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      acc[r][v] = _mm512_setzero_ps();
    }
  }
  for (int64_t k = 0; k < depth; ++k) {
    __m512 bk[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      bk[v] = _mm512_loadu_ps(b + k * ldb + 16 * v);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 ar = _mm512_set1_ps(a[r * lda + k]);
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) {
        acc[r][v] = _mm512_fmadd_ps(ar, bk[v], acc[r][v]);
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      _mm512_storeu_ps(c + r * ldc + 16 * v, acc[r][v]);
    }
  }
}

// Rows [0, rows) of one strip of at most 64 columns (V vectors): full tiles, then one tile
// of the rows left.
template <int V>
void strip(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t rows, int64_t depth,
           float* c, int64_t ldc) {
  int64_t r = 0;
  for (; r + kRows <= rows; r += kRows) {
    tile<kRows, V>(a + r * lda, lda, b, ldb, depth, c + r * ldc, ldc);
  }
  const float* ar = a + r * lda;
  float* cr = c + r * ldc;
  switch (rows - r) {
    case 5:
      return tile<5, V>(ar, lda, b, ldb, depth, cr, ldc);
    case 4:
      return tile<4, V>(ar, lda, b, ldb, depth, cr, ldc);
    case 3:
      return tile<3, V>(ar, lda, b, ldb, depth, cr, ldc);
    case 2:
      return tile<2, V>(ar, lda, b, ldb, depth, cr, ldc);
    case 1:
      return tile<1, V>(ar, lda, b, ldb, depth, cr, ldc);
    default:
      return;
  }
}

}  // namespace small_gemm_detail
#endif

// Whether small_gemm can multiply into `cols` columns on this machine: AVX-512 and whole
// vectors of columns.
inline bool small_gemm_available(int64_t cols) {
#ifdef OPFORGE_SMALL_GEMM
  static const bool avx512 = [] {
    __builtin_cpu_init();  // idempotent; needed if this runs before libgcc's own constructor
    return __builtin_cpu_supports("avx512f") != 0;
  }();
  return avx512 && cols > 0 && cols % 16 == 0;
#else
  (void)cols;
  return false;
#endif
}

// c (rows, cols), dense = a (rows, depth) at row stride lda @ b (depth, cols), dense. Only where
// small_gemm_available(cols).
inline void small_gemm(const float* a, int64_t lda, const float* b, int64_t rows, int64_t depth,
                       int64_t cols, float* c) {
#ifdef OPFORGE_SMALL_GEMM
  namespace d = small_gemm_detail;
  // Strips of 64 columns (b's rows of a strip, depth * 256 bytes, are reread per tile from L2).
  for (int64_t j = 0; j < cols; j += 64) {
    const float* bj = b + j;
    float* cj = c + j;
    switch ((cols - j >= 64 ? 64 : cols - j) / 16) {
      case 4:
        d::strip<4>(a, lda, bj, cols, rows, depth, cj, cols);
        break;
      case 3:
        d::strip<3>(a, lda, bj, cols, rows, depth, cj, cols);
        break;
      case 2:
        d::strip<2>(a, lda, bj, cols, rows, depth, cj, cols);
        break;
      default:
        d::strip<1>(a, lda, bj, cols, rows, depth, cj, cols);
        break;
    }
  }
#else
  (void)a, (void)lda, (void)b, (void)rows, (void)depth, (void)cols, (void)c;
#endif
}

}  // namespace opforge::cpu
