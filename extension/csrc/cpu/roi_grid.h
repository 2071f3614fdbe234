// The bilinear sampling grid of one roi on the CPU (roi_align, ps_roi_align): per
// output bin, the valid samples (taps) with their four neighbours' offsets and
// weights, computed once per roi and reused for every channel.
#pragma once

#include "../abi.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace opforge::cpu {

// Bilinear sampling is separable: a sample at (y, x) is valid when both its row
// and its column are, and its weights are products of row and column weights.
// So each roi keeps, per output row (column), only the sample rows (columns)
// that touch the image: memory is O(pooled * grid) and samples outside the image
// cost nothing, however large the roi.
constexpr int64_t kMaxSamplesPerAxis = int64_t(1) << 24;

template <typename acc_t>
struct AxisSample {
  int64_t low, high;  // neighbouring rows (columns)
  acc_t l, h;         // weights of high and low
};

struct AxisRange {
  int64_t begin, end;  // into the samples vector
};

// One valid bilinear sample: the offsets of its four neighbours in an H*W plane
// and their weights. Built per roi from the axis samples, reused by every channel.
template <typename acc_t>
struct Tap {
  int32_t pos[4];
  acc_t w[4];
};

template <typename acc_t>
struct RoiGrid {
  int64_t batch_index = 0;
  acc_t count = 1;             // samples averaged per bin, valid or not
  acc_t roi_h = 0, roi_w = 0;  // roi size in input pixels, as sampled
  std::vector<AxisSample<acc_t>> ys, xs;
  std::vector<AxisRange> y_range, x_range;  // one per output row / column
  std::vector<Tap<acc_t>> taps;
  std::vector<int64_t> bin_begin;  // taps of bin b: [bin_begin[b], bin_begin[b + 1])
};

// Appends the valid samples of one axis, following the Detectron border rule:
// outside [-1, size] a sample is zero; below 0 it clamps to 0; past size-1 to size-1.
template <typename acc_t>
void fill_axis(std::vector<AxisSample<acc_t>>& samples, std::vector<AxisRange>& ranges, acc_t start,
               acc_t bin, int64_t pooled, int64_t grid, int64_t size) {
  samples.clear();
  ranges.resize(pooled);
  for (int64_t p = 0; p < pooled; ++p) {
    ranges[p].begin = static_cast<int64_t>(samples.size());
    for (int64_t i = 0; i < grid; ++i) {
      acc_t v = start + p * bin + static_cast<acc_t>(i + .5f) * bin / static_cast<acc_t>(grid);
      // Written so that NaN and empty planes are invalid too.
      if (!(v >= acc_t(-1) && v <= size) || size == 0) {
        continue;
      }
      v = std::max(v, acc_t(0));
      int64_t low = static_cast<int64_t>(v);
      int64_t high;
      if (low >= size - 1) {
        high = low = size - 1;
        v = static_cast<acc_t>(low);
      } else {
        high = low + 1;
      }
      const acc_t l = v - low;
      samples.push_back({low, high, l, acc_t(1) - l});
    }
    ranges[p].end = static_cast<int64_t>(samples.size());
  }
}

template <typename scalar_t, typename acc_t>
void compute_roi_grid(const char* op, RoiGrid<acc_t>& grid, const scalar_t* roi,
                      acc_t spatial_scale, int64_t height, int64_t width, int64_t pooled_h,
                      int64_t pooled_w, int64_t sampling_ratio, bool aligned) {
  const acc_t offset = aligned ? acc_t(0.5) : acc_t(0);
  grid.batch_index = static_cast<int64_t>(roi[0]);
  const acc_t start_w = static_cast<acc_t>(roi[1]) * spatial_scale - offset;
  const acc_t start_h = static_cast<acc_t>(roi[2]) * spatial_scale - offset;
  const acc_t end_w = static_cast<acc_t>(roi[3]) * spatial_scale - offset;
  const acc_t end_h = static_cast<acc_t>(roi[4]) * spatial_scale - offset;
  acc_t roi_w = end_w - start_w;
  acc_t roi_h = end_h - start_h;
  if (!aligned) {
    // Legacy behaviour: malformed rois are forced to be at least 1x1.
    roi_w = std::max(roi_w, acc_t(1));
    roi_h = std::max(roi_h, acc_t(1));
  }
  grid.roi_h = roi_h;
  grid.roi_w = roi_w;
  const acc_t bin_h = roi_h / static_cast<acc_t>(pooled_h);
  const acc_t bin_w = roi_w / static_cast<acc_t>(pooled_w);
  // Adaptive sampling: about one sample per input pixel in each bin.
  const double grid_h =
      sampling_ratio > 0 ? sampling_ratio : std::max(0.0, std::ceil(double(roi_h / pooled_h)));
  const double grid_w =
      sampling_ratio > 0 ? sampling_ratio : std::max(0.0, std::ceil(double(roi_w / pooled_w)));
  OPFORGE_CHECK(grid_h * pooled_h <= double(kMaxSamplesPerAxis) &&
                    grid_w * pooled_w <= double(kMaxSamplesPerAxis),
                op, ": a roi of ", double(roi_h), " x ", double(roi_w),
                " (after spatial_scale) with sampling_ratio ", sampling_ratio, " needs more than ",
                kMaxSamplesPerAxis,
                " samples along one side; check the rois or pass a small positive sampling_ratio");
  grid.count = static_cast<acc_t>(std::max<int64_t>(int64_t(grid_h) * int64_t(grid_w), 1));
  fill_axis(grid.ys, grid.y_range, start_h, bin_h, pooled_h, int64_t(grid_h), height);
  fill_axis(grid.xs, grid.x_range, start_w, bin_w, pooled_w, int64_t(grid_w), width);

  // Bin (ph, pw) has a tap per (valid y sample of row ph, valid x sample of column pw): all
  // bins together have ys.size() * xs.size() of them, written in place (no growth checks).
  grid.taps.resize(grid.ys.size() * grid.xs.size());
  grid.bin_begin.resize(pooled_h * pooled_w + 1);
  Tap<acc_t>* tap = grid.taps.data();
  int64_t* bin_begin = grid.bin_begin.data();
  int64_t count = 0;
  *bin_begin++ = 0;
  for (int64_t ph = 0; ph < pooled_h; ++ph) {
    const AxisRange yr = grid.y_range[ph];
    for (int64_t pw = 0; pw < pooled_w; ++pw) {
      const AxisRange xr = grid.x_range[pw];
      for (int64_t iy = yr.begin; iy < yr.end; ++iy) {
        const AxisSample<acc_t>& y = grid.ys[iy];
        const int32_t row_low = static_cast<int32_t>(y.low * width);
        const int32_t row_high = static_cast<int32_t>(y.high * width);
        for (int64_t ix = xr.begin; ix < xr.end; ++ix) {
          const AxisSample<acc_t>& x = grid.xs[ix];
          const int32_t x_low = static_cast<int32_t>(x.low), x_high = static_cast<int32_t>(x.high);
          tap[count++] = {{row_low + x_low, row_low + x_high, row_high + x_low, row_high + x_high},
                          {y.h * x.h, y.h * x.l, y.l * x.h, y.l * x.l}};
        }
      }
      *bin_begin++ = count;
    }
  }
}

// The quantized bins of the pooling kernels (roi_pool, ps_roi_pool): per output row (column),
// the half-open range of input rows (columns) it covers.
struct PoolBins {
  int64_t batch_index = 0;
  std::vector<int64_t> h_start, h_end, w_start, w_end;
};

// Rounds half away from zero; the clamp keeps far-away rois finite in int64.
inline int64_t round_coordinate(double value) {
  return static_cast<int64_t>(std::round(std::clamp(value, -1e15, 1e15)));
}

// roi_pool's roi covers its end pixel (extent end - start + 1) and its bins reach the plane's
// last row and column; ps_roi_pool's, as torchvision's, stops before them (extent end -
// start, bins clamped to size - 1). Malformed rois are forced to be at least 1x1.
template <typename scalar_t>
void compute_pool_bins(PoolBins& bins, const scalar_t* roi, double spatial_scale, int64_t height,
                       int64_t width, int64_t pooled_h, int64_t pooled_w, bool position_sensitive) {
  using acc_t = opmath_t<scalar_t>;
  const acc_t scale = static_cast<acc_t>(spatial_scale);
  bins.batch_index = static_cast<int64_t>(roi[0]);
  const int64_t start_w = round_coordinate(static_cast<acc_t>(roi[1]) * scale);
  const int64_t start_h = round_coordinate(static_cast<acc_t>(roi[2]) * scale);
  const int64_t end_w = round_coordinate(static_cast<acc_t>(roi[3]) * scale);
  const int64_t end_h = round_coordinate(static_cast<acc_t>(roi[4]) * scale);
  const int64_t inclusive = position_sensitive ? 0 : 1;
  const acc_t bin_h = static_cast<acc_t>(std::max<int64_t>(end_h - start_h + inclusive, 1)) /
                      static_cast<acc_t>(pooled_h);
  const acc_t bin_w = static_cast<acc_t>(std::max<int64_t>(end_w - start_w + inclusive, 1)) /
                      static_cast<acc_t>(pooled_w);
  auto fill = [](std::vector<int64_t>& lo, std::vector<int64_t>& hi, int64_t pooled, acc_t bin,
                 int64_t start, int64_t limit) {
    lo.resize(pooled);
    hi.resize(pooled);
    for (int64_t p = 0; p < pooled; ++p) {
      const auto a = static_cast<int64_t>(std::floor(static_cast<acc_t>(p) * bin));
      const auto b = static_cast<int64_t>(std::ceil(static_cast<acc_t>(p + 1) * bin));
      lo[p] = std::clamp<int64_t>(a + start, 0, limit);
      hi[p] = std::clamp<int64_t>(b + start, 0, limit);
    }
  };
  const int64_t last = position_sensitive ? 1 : 0;
  fill(bins.h_start, bins.h_end, pooled_h, bin_h, start_h, std::max<int64_t>(height - last, 0));
  fill(bins.w_start, bins.w_end, pooled_w, bin_w, start_w, std::max<int64_t>(width - last, 0));
}

// Asks for the cache line at p before it is read (or written: for_write): the pooling loops
// read a few pixels from a different plane per bin, and wait on memory, not arithmetic.
inline void prefetch(const void* p, bool for_write = false) {
#if defined(__GNUC__) || defined(__clang__)
  if (for_write) {
    __builtin_prefetch(p, 1);
  } else {
    __builtin_prefetch(p, 0);
  }
#else
  (void)p;
  (void)for_write;
#endif
}

// Sampled points per roi (valid or not), about: what one roi costs per channel.
template <typename scalar_t>
int64_t samples_per_roi(const scalar_t* roi_p, int64_t num_rois, double spatial_scale,
                        int64_t pooled_h, int64_t pooled_w, int64_t sampling_ratio) {
  const int64_t bins = pooled_h * pooled_w;
  if (sampling_ratio > 0) {
    return bins * sampling_ratio * sampling_ratio;
  }
  // Adaptive: ceil(roi / pooled) per side; the mean over the rois, capped so that it stays
  // an int64 for any roi (the grid itself refuses oversized ones).
  double total = 0;
  for (int64_t n = 0; n < num_rois; ++n) {
    const scalar_t* r = roi_p + n * 5;
    const double h = std::abs(double(r[4]) - double(r[2])) * spatial_scale;
    const double w = std::abs(double(r[3]) - double(r[1])) * spatial_scale;
    total += std::max(1.0, std::ceil(h / pooled_h)) * std::max(1.0, std::ceil(w / pooled_w));
  }
  return static_cast<int64_t>(std::min(1e12, bins * total / std::max<int64_t>(num_rois, 1)));
}

// The input pixels a roi covers, clipped to the image, about (the mean over the rois): what
// one roi costs per channel in the pooling kernels.
template <typename scalar_t>
int64_t pixels_per_roi(const scalar_t* roi_p, int64_t num_rois, double spatial_scale,
                       int64_t height, int64_t width) {
  double total = 0;
  for (int64_t n = 0; n < num_rois; ++n) {
    const scalar_t* r = roi_p + n * 5;
    const double h = std::abs(double(r[4]) - double(r[2])) * spatial_scale + 1;
    const double w = std::abs(double(r[3]) - double(r[1])) * spatial_scale + 1;
    // NaN fails both comparisons and counts as the whole image.
    total += (h < double(height) ? h : double(height)) * (w < double(width) ? w : double(width));
  }
  return static_cast<int64_t>(std::max(1.0, total / std::max<int64_t>(num_rois, 1)));
}

}  // namespace opforge::cpu
