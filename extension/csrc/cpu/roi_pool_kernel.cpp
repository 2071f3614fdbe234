// RoIPool (max pooling over quantized roi bins) on the CPU. Forward work is
// split over (roi, channel) pairs; backward over channels so no two threads
// add into the same input-gradient element.

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

#include "../common.h"
#include "contiguous.h"
#include "channels_last.h"
#include "parallel_policy.h"
#include "roi_grid.h"

namespace opforge::cpu {
namespace {

// Channels-first, the scans are tiled: a block of kChannelBlock channels at a time, every roi
// over those channels' planes, so the planes a block reads (or, backward, adds into) stay in
// cache across the rois instead of coming from memory once per (roi, channel).
constexpr int64_t kChannelBlock = 64;

// The widest bin side the fixed-shape scans take; wider bins take the general loop.
constexpr int64_t kMaxSide = 3;

// A roi's bins for the channels-first scan. When every bin has 1 to kMaxSide rows and columns
// (`rows`, `cols`: the most of any bin, at least 2), each output row keeps `rows` input row
// offsets (h * width) and each output column `cols` column offsets, a bin with fewer repeating
// its last one: the repeats come after the pixel they repeat in scan order, and a pixel equal
// to the running maximum never replaces it (strict comparison), so the scan gives the same
// maximum and the same first argmax as the plain loop. Otherwise rows = 0: the general loop.
struct ScanBins {
  int64_t batch_index = 0;
  int64_t rows = 0, cols = 0;
  std::vector<int64_t> row_off, col_off;  // pooled_h * kMaxSide, pooled_w * kMaxSide
};

inline void fill_scan_bins(ScanBins& s, const PoolBins& b, int64_t width) {
  s.batch_index = b.batch_index;
  const int64_t pooled_h = static_cast<int64_t>(b.h_start.size());
  const int64_t pooled_w = static_cast<int64_t>(b.w_start.size());
  int64_t rows = 2, cols = 2;
  bool fits = true;
  for (int64_t p = 0; p < pooled_h; ++p) {
    const int64_t n = b.h_end[p] - b.h_start[p];
    fits = fits && n >= 1 && n <= kMaxSide;
    rows = std::max(rows, n);
  }
  for (int64_t p = 0; p < pooled_w; ++p) {
    const int64_t n = b.w_end[p] - b.w_start[p];
    fits = fits && n >= 1 && n <= kMaxSide;
    cols = std::max(cols, n);
  }
  s.rows = fits ? rows : 0;
  s.cols = fits ? cols : 0;
  if (!fits) {
    return;
  }
  s.row_off.resize(pooled_h * kMaxSide);
  s.col_off.resize(pooled_w * kMaxSide);
  for (int64_t p = 0; p < pooled_h; ++p) {
    for (int64_t r = 0; r < kMaxSide; ++r) {
      s.row_off[p * kMaxSide + r] = std::min(b.h_start[p] + r, b.h_end[p] - 1) * width;
    }
  }
  for (int64_t p = 0; p < pooled_w; ++p) {
    for (int64_t c = 0; c < kMaxSide; ++c) {
      s.col_off[p * kMaxSide + c] = std::min(b.w_start[p] + c, b.w_end[p] - 1);
    }
  }
}

// Bins of exactly R x C scanned pixels (repeats included), for the planes of channels
// [c_begin, c_end): no branch on a bin's size.
template <int64_t R, int64_t C, typename scalar_t>
void max_fixed_bins(const ScanBins& s, const scalar_t* image, int64_t plane_size, int64_t c_begin,
                    int64_t c_end, int64_t pooled_h, int64_t pooled_w, scalar_t* out,
                    int32_t* arg) {
  const int64_t* row_off = s.row_off.data();
  const int64_t* col_off = s.col_off.data();
  for (int64_t c = c_begin; c < c_end; ++c) {
    const scalar_t* plane = image + c * plane_size;
    for (int64_t ph = 0; ph < pooled_h; ++ph) {
      const int64_t* ro = row_off + ph * kMaxSide;
      for (int64_t pw = 0; pw < pooled_w; ++pw) {
        const int64_t* co = col_off + pw * kMaxSide;
        scalar_t best = std::numeric_limits<scalar_t>::lowest();
        int64_t best_index = -1;
        for (int64_t r = 0; r < R; ++r) {
          for (int64_t k = 0; k < C; ++k) {
            const int64_t i = ro[r] + co[k];
            const scalar_t v = plane[i];
            const bool greater = v > best;  // NaN never wins
            best = greater ? v : best;
            best_index = greater ? i : best_index;
          }
        }
        *out++ = best;
        *arg++ = static_cast<int32_t>(best_index);
      }
    }
  }
}

// Any bins (empty, or wider than kMaxSide), the plain scan.
template <typename scalar_t>
void max_any_bins(const PoolBins& bins, const scalar_t* image, int64_t plane_size, int64_t width,
                  int64_t c_begin, int64_t c_end, int64_t pooled_h, int64_t pooled_w, scalar_t* out,
                  int32_t* arg) {
  for (int64_t c = c_begin; c < c_end; ++c) {
    const scalar_t* plane = image + c * plane_size;
    for (int64_t ph = 0; ph < pooled_h; ++ph) {
      for (int64_t pw = 0; pw < pooled_w; ++pw) {
        const bool empty = bins.h_end[ph] <= bins.h_start[ph] || bins.w_end[pw] <= bins.w_start[pw];
        // An empty bin outputs 0 with argmax -1; NaN never wins the comparison.
        scalar_t best = empty ? scalar_t(0) : std::numeric_limits<scalar_t>::lowest();
        int64_t best_index = -1;
        for (int64_t h = bins.h_start[ph]; h < bins.h_end[ph]; ++h) {
          for (int64_t w = bins.w_start[pw]; w < bins.w_end[pw]; ++w) {
            const int64_t i = h * width + w;
            if (plane[i] > best) {
              best = plane[i];
              best_index = i;
            }
          }
        }
        *out++ = best;
        *arg++ = static_cast<int32_t>(best_index);
      }
    }
  }
}

template <typename scalar_t>
void roi_pool_forward_planes(const Tensor& input, const Tensor& rois, Tensor& output,
                             Tensor& argmax, double spatial_scale, int64_t pooled_h,
                             int64_t pooled_w) {
  const int64_t num_rois = rois.size(0);
  const int64_t channels = input.size(1);
  const int64_t height = input.size(2);
  const int64_t width = input.size(3);
  const int64_t plane_size = height * width;
  const scalar_t* in = input.const_data_ptr<scalar_t>();
  const scalar_t* roi_p = rois.const_data_ptr<scalar_t>();
  scalar_t* out = output.mutable_data_ptr<scalar_t>();
  int32_t* arg = argmax.mutable_data_ptr<int32_t>();
  const int64_t bins_per_plane = pooled_h * pooled_w;
  // Every roi's bins once, before the channel blocks reuse them.
  std::vector<PoolBins> pool_bins(num_rois);
  std::vector<ScanBins> scan_bins(num_rois);
  for (int64_t n = 0; n < num_rois; ++n) {
    compute_pool_bins(pool_bins[n], roi_p + n * 5, spatial_scale, height, width, pooled_h, pooled_w,
                      /*position_sensitive=*/false);
    fill_scan_bins(scan_bins[n], pool_bins[n], width);
  }
  // Each (roi, channel) compares the pixels of every bin once.
  const int64_t pixels = pixels_per_roi(roi_p, num_rois, spatial_scale, height, width);
  const int64_t blocks = (channels + kChannelBlock - 1) / kChannelBlock;
  const int64_t block_work = total_work(num_rois * kChannelBlock, pixels + bins_per_plane);
  parallel_for_work(blocks, block_work, [&](int64_t begin, int64_t end) {
    for (int64_t block = begin; block < end; ++block) {
      const int64_t c0 = block * kChannelBlock;
      const int64_t c1 = std::min(channels, c0 + kChannelBlock);
      for (int64_t n = 0; n < num_rois; ++n) {
        const ScanBins& s = scan_bins[n];
        const scalar_t* image = in + s.batch_index * channels * plane_size;
        const int64_t first = (n * channels + c0) * bins_per_plane;
        scalar_t* o = out + first;
        int32_t* a = arg + first;
        const int64_t shape = s.rows * 10 + s.cols;
        if (shape == 22) {
          max_fixed_bins<2, 2>(s, image, plane_size, c0, c1, pooled_h, pooled_w, o, a);
        } else if (shape == 23) {
          max_fixed_bins<2, 3>(s, image, plane_size, c0, c1, pooled_h, pooled_w, o, a);
        } else if (shape == 32) {
          max_fixed_bins<3, 2>(s, image, plane_size, c0, c1, pooled_h, pooled_w, o, a);
        } else if (shape == 33) {
          max_fixed_bins<3, 3>(s, image, plane_size, c0, c1, pooled_h, pooled_w, o, a);
        } else {
          max_any_bins(pool_bins[n], image, plane_size, width, c0, c1, pooled_h, pooled_w, o, a);
        }
      }
    }
  });
}

// Channels-last: `in` is (N, H, W, C). A bin's maximum is kept for a vector of channels at a
// time, pixel by pixel in the channels-first order (rows, then columns; the first maximum
// wins, NaN never does), then written out channels-first.
template <typename scalar_t, typename elem_t>
void roi_pool_forward_channels_last(const elem_t* in, const scalar_t* roi_p, scalar_t* out,
                                    int32_t* arg, int64_t num_rois, int64_t channels,
                                    int64_t height, int64_t width, double spatial_scale,
                                    int64_t pooled_h, int64_t pooled_w, int64_t pixels) {
  const int64_t bins = pooled_h * pooled_w;
  parallel_for_work(num_rois, (pixels + bins) * channels, [&](int64_t begin, int64_t end) {
    PoolBins rb;
    std::vector<elem_t> best(channels);
    std::vector<int32_t> best_index(channels);
    for (int64_t n = begin; n < end; ++n) {
      compute_pool_bins(rb, roi_p + n * 5, spatial_scale, height, width, pooled_h, pooled_w,
                        /*position_sensitive=*/false);
      const elem_t* image = in + rb.batch_index * height * width * channels;
      scalar_t* out_roi = out + n * channels * bins;
      int32_t* arg_roi = arg + n * channels * bins;
      for (int64_t ph = 0; ph < pooled_h; ++ph) {
        for (int64_t pw = 0; pw < pooled_w; ++pw) {
          const bool empty = rb.h_end[ph] <= rb.h_start[ph] || rb.w_end[pw] <= rb.w_start[pw];
          std::fill(best.begin(), best.end(),
                    empty ? elem_t(0) : std::numeric_limits<elem_t>::lowest());
          std::fill(best_index.begin(), best_index.end(), -1);
          elem_t* b = best.data();
          int32_t* bi = best_index.data();
          for (int64_t h = rb.h_start[ph]; h < rb.h_end[ph]; ++h) {
            for (int64_t w = rb.w_start[pw]; w < rb.w_end[pw]; ++w) {
              const elem_t* p = image + (h * width + w) * channels;
              const int32_t i = static_cast<int32_t>(h * width + w);
              for (int64_t c = 0; c < channels; ++c) {  // vectorized: selects, no branch
                const bool greater = p[c] > b[c];
                b[c] = greater ? p[c] : b[c];
                bi[c] = greater ? i : bi[c];
              }
            }
          }
          const int64_t bin = ph * pooled_w + pw;
          for (int64_t c = 0; c < channels; ++c) {
            out_roi[c * bins + bin] = static_cast<scalar_t>(b[c]);
            arg_roi[c * bins + bin] = bi[c];
          }
        }
      }
    }
  });
}

template <typename scalar_t>
void roi_pool_forward_impl(const Tensor& input, const Tensor& rois, Tensor& output, Tensor& argmax,
                           double spatial_scale, int64_t pooled_h, int64_t pooled_w) {
  using acc_t = opmath_t<scalar_t>;
  const int64_t num_rois = rois.size(0);
  const int64_t channels = input.size(1);
  const int64_t height = input.size(2);
  const int64_t width = input.size(3);
  const scalar_t* roi_p = rois.const_data_ptr<scalar_t>();
  scalar_t* out = output.mutable_data_ptr<scalar_t>();
  int32_t* arg = argmax.mutable_data_ptr<int32_t>();
  const int64_t pixels = pixels_per_roi(roi_p, num_rois, spatial_scale, height, width);
  const bool vector_wide = channels >= Vec<acc_t>::size();
  if (vector_wide && is_channels_last(input)) {
    roi_pool_forward_channels_last(input.const_data_ptr<scalar_t>(), roi_p, out, arg, num_rois,
                                   channels, height, width, spatial_scale, pooled_h, pooled_w,
                                   pixels);
    return;
  }
  // Channels-first, the scan stays in place: measured, transposing first cost more than the
  // vector maximum saved (roi_pool fwd, 512 rois, 256 channels: 1.3x slower).
  const Tensor input_c = contiguous_planes(input);
  roi_pool_forward_planes<scalar_t>(input_c, rois, output, argmax, spatial_scale, pooled_h,
                                    pooled_w);
}

// An argmax outside the plane must be -1 (an empty bin). Out of line: the error message's
// arguments would otherwise keep the scatter loop's registers on the stack.
[[gnu::noinline, gnu::cold]] inline void check_empty_bin(int64_t i, int64_t plane_size) {
  OPFORGE_CHECK(i == -1, "_roi_pool_backward: argmax holds ", i, ", outside an input plane of ",
                plane_size, " elements");
}

// Adds each of `planes` planes' `bins` grads at its argmax (a and g run plane after plane).
template <typename acc_t, typename scalar_t>
void scatter_max_grads(const int32_t* a, const scalar_t* g, acc_t* plane, int64_t plane_size,
                       int64_t planes, int64_t bins) {
  for (int64_t c = 0; c < planes; ++c, a += bins, g += bins, plane += plane_size) {
    for (int64_t bin = 0; bin < bins; ++bin) {
      const int64_t i = a[bin];
      // One unsigned comparison for both ends: -1 (an empty bin) and the out of range.
      if (static_cast<uint64_t>(i) >= static_cast<uint64_t>(plane_size)) {
        check_empty_bin(i, plane_size);
        continue;
      }
      plane[i] += static_cast<acc_t>(g[bin]);
    }
  }
}

// grad_input arrives uninitialized: each block of channels zeroes its own planes (of every
// image) right before adding into them, so the zeros are written into cache, not in a pass of
// their own over memory. Every plane belongs to exactly one block, and no block adds into
// another's planes: every element is zeroed once, before its first add, on one thread.
template <typename scalar_t>
void roi_pool_backward_impl(const Tensor& grad, const Tensor& rois, const Tensor& argmax,
                            Tensor& grad_input) {
  using acc_t = opmath_t<scalar_t>;
  const int64_t num_rois = rois.size(0);
  const int64_t batch = grad_input.size(0);
  const int64_t channels = grad_input.size(1);
  const int64_t plane_size = grad_input.size(2) * grad_input.size(3);
  const int64_t bins = grad.size(2) * grad.size(3);
  const scalar_t* g = grad.const_data_ptr<scalar_t>();
  const scalar_t* roi_p = rois.const_data_ptr<scalar_t>();
  const int32_t* arg = argmax.const_data_ptr<int32_t>();
  acc_t* gi = grad_input.mutable_data_ptr<acc_t>();
  std::vector<int64_t> batch_index(num_rois);
  for (int64_t n = 0; n < num_rois; ++n) {
    batch_index[n] = static_cast<int64_t>(roi_p[n * 5]);
  }

  const int64_t blocks = (channels + kChannelBlock - 1) / kChannelBlock;
  const int64_t block_work = total_work(num_rois * kChannelBlock, bins);
  parallel_for_work(blocks, block_work, [&](int64_t begin, int64_t end) {
    for (int64_t block = begin; block < end; ++block) {
      const int64_t c0 = block * kChannelBlock;
      const int64_t c1 = std::min(channels, c0 + kChannelBlock);
      for (int64_t b = 0; b < batch; ++b) {
        acc_t* planes = gi + (b * channels + c0) * plane_size;
        std::fill(planes, planes + (c1 - c0) * plane_size, acc_t(0));
      }
      for (int64_t n = 0; n < num_rois; ++n) {
        acc_t* image = gi + batch_index[n] * channels * plane_size;
        const int64_t first = (n * channels + c0) * bins;
        const int32_t* a = arg + first;
        const scalar_t* gn = g + first;
        scatter_max_grads(a, gn, image + c0 * plane_size, plane_size, (c1 - c0), bins);
      }
    }
  });
}

std::tuple<Tensor, Tensor> roi_pool_forward_kernel(const Tensor& input, const Tensor& rois,
                                                   double spatial_scale, int64_t pooled_height,
                                                   int64_t pooled_width) {
  check_roi_inputs("roi_pool", input, rois, pooled_height, pooled_width);
  const std::vector<int64_t> shape{rois.size(0), input.size(1), pooled_height, pooled_width};
  Tensor output = alloc_empty(input, shape);
  Tensor argmax = alloc_empty(input, shape, ScalarType::Int);
  if (output.numel() == 0) {
    return {output, argmax};
  }
  const Tensor rois_c = as_contiguous(rois);
  OPFORGE_DISPATCH_FLOATING_TYPES(input.scalar_type(), "opforge_roi_pool_forward_cpu", [&] {
    check_rois_values("roi_pool", rois_c.mutable_data_ptr<scalar_t>(), rois_c.size(0),
                      input.size(0));
    roi_pool_forward_impl<scalar_t>(input, rois_c, output, argmax, spatial_scale, pooled_height,
                                    pooled_width);
  });
  return {output, argmax};
}

Tensor roi_pool_backward_kernel(const Tensor& grad, const Tensor& rois, const Tensor& argmax,
                                double spatial_scale, int64_t pooled_height, int64_t pooled_width,
                                int64_t batch_size, int64_t channels, int64_t height,
                                int64_t width) {
  check_roi_backward_inputs("_roi_pool_backward", grad, rois, pooled_height, pooled_width,
                            batch_size, channels, height, width);
  check_int32_like_grad("_roi_pool_backward", "argmax", argmax, grad);
  (void)spatial_scale;  // argmax already says where each bin's maximum came from
  const auto acc_dtype = opmath_dtype(grad.scalar_type());
  const std::vector<int64_t> shape{batch_size, channels, height, width};
  if (grad.numel() == 0 || batch_size == 0 || channels == 0 || height == 0 || width == 0) {
    return to_dtype(alloc_zeros(grad, shape, acc_dtype), grad.scalar_type());
  }
  // Zeroed by the kernel, plane by plane (roi_pool_backward_impl).
  Tensor grad_input = alloc_empty(grad, shape, acc_dtype);
  const Tensor grad_c = contiguous_planes(grad);
  const Tensor rois_c = as_contiguous(rois);
  const Tensor argmax_c = contiguous_planes(argmax);
  OPFORGE_DISPATCH_FLOATING_TYPES(grad.scalar_type(), "opforge_roi_pool_backward_cpu", [&] {
    check_rois_values("_roi_pool_backward", rois_c.mutable_data_ptr<scalar_t>(), rois_c.size(0),
                      batch_size);
    roi_pool_backward_impl<scalar_t>(grad_c, rois_c, argmax_c, grad_input);
  });
  return to_dtype(grad_input, grad.scalar_type());
}

}  // namespace

OPFORGE_LIBRARY_IMPL(CPU, m) {
  m.impl("roi_pool", OPFORGE_KERNEL(roi_pool_forward_kernel));
  m.impl("_roi_pool_backward", OPFORGE_KERNEL(roi_pool_backward_kernel));
}

}  // namespace opforge::cpu
