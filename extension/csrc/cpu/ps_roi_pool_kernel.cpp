// Position-sensitive RoIPool on the CPU: output channel c of bin b = (ph, pw) is
// the mean of input channel c * PH * PW + b over the bin quantized to input pixels.
// As in torchvision, forward bins end at row H - 1 / column W - 1 (the last row and
// column are never pooled); the backward is the gradient of exactly that forward.
// Forward work is split over (roi, output channel) pairs; backward over input
// channels, so no two threads add into the same gradient element.

#include <algorithm>
#include <cmath>
#include <tuple>
#include <vector>

#include "../common.h"
#include "parallel_policy.h"
#include "ps_roi_common.h"
#include "roi_grid.h"

namespace opforge::cpu {
namespace {

// One bin of a roi in its input plane: the offset of its first pixel, its rows and columns
// (no pixel when either is 0).
struct BinSpan {
  int64_t offset, rows, cols;
  // At most 2 x 2 pixels, and at least one: most bins of a small roi.
  bool small() const { return rows > 0 && rows <= 2 && cols <= 2; }
};

template <typename acc_t, typename scalar_t>
acc_t sum_span(const scalar_t* p, const BinSpan& span, int64_t width) {
  acc_t sum = 0;
  for (int64_t h = 0; h < span.rows; ++h, p += width) {
    for (int64_t w = 0; w < span.cols; ++w) {
      sum += static_cast<acc_t>(p[w]);
    }
  }
  return sum;
}

// A small bin without branching on its size (the sizes vary bin to bin and mispredict): the
// pixels of the 2 x 2 square outside the bin add zero, in sum_span's order. The square stays
// in the plane: ps_roi_pool's bins end before its last row and column.
template <typename acc_t, typename scalar_t>
acc_t sum_small(const scalar_t* p, const BinSpan& span, int64_t width) {
  const bool two_cols = span.cols == 2, two_rows = span.rows == 2;
  const acc_t v0 = static_cast<acc_t>(p[0]), v1 = static_cast<acc_t>(p[1]);
  const acc_t v2 = static_cast<acc_t>(p[width]), v3 = static_cast<acc_t>(p[width + 1]);
  acc_t sum = 0;
  sum += v0;
  sum += two_cols ? v1 : acc_t(0);
  sum += two_rows ? v2 : acc_t(0);
  sum += two_rows && two_cols ? v3 : acc_t(0);
  return sum;
}

template <typename acc_t>
void add_small(acc_t* p, const BinSpan& span, int64_t width, acc_t value) {
  const bool two_cols = span.cols == 2, two_rows = span.rows == 2;
  p[0] += value;
  p[1] += two_cols ? value : acc_t(0);
  p[width] += two_rows ? value : acc_t(0);
  p[width + 1] += two_rows && two_cols ? value : acc_t(0);
}

inline BinSpan bin_span(const PoolBins& b, int64_t ph, int64_t pw, int64_t width) {
  const int64_t rows = std::max<int64_t>(b.h_end[ph] - b.h_start[ph], 0);
  const int64_t cols = std::max<int64_t>(b.w_end[pw] - b.w_start[pw], 0);
  return {b.h_start[ph] * width + b.w_start[pw], cols > 0 ? rows : 0, rows > 0 ? cols : 0};
}

// Asks for the first and last rows of a bin in its plane.
template <typename T>
inline void prefetch_span(const T* plane, const BinSpan& span, int64_t width) {
  if (span.rows > 0) {
    prefetch(plane + span.offset);
    prefetch(plane + span.offset + (span.rows - 1) * width);
  }
}

template <typename scalar_t>
void ps_roi_pool_forward_impl(const Tensor& input, const Tensor& rois, Tensor& output,
                              Tensor& channel_mapping, double spatial_scale, int64_t pooled_h,
                              int64_t pooled_w) {
  using acc_t = opmath_t<scalar_t>;
  const int64_t channels = input.size(1);
  const int64_t height = input.size(2);
  const int64_t width = input.size(3);
  const int64_t plane_size = height * width;
  const int64_t bins = pooled_h * pooled_w;
  const int64_t channels_out = channels / bins;
  const scalar_t* in = input.const_data_ptr<scalar_t>();
  const scalar_t* roi_p = rois.const_data_ptr<scalar_t>();
  scalar_t* out = output.mutable_data_ptr<scalar_t>();
  int32_t* mapping = channel_mapping.mutable_data_ptr<int32_t>();
  // Each (roi, output channel) sums the pixels of every bin once, a different plane per bin:
  // the loop waits on memory, so it asks for the bin kAhead bins on first. (Plane by plane,
  // every roi of an image in one input channel at a time, measured no faster: 0.95x-1.27x.)
  const int64_t pixels = pixels_per_roi(roi_p, rois.size(0), spatial_scale, height, width);

  parallel_for_work(rois.size(0) * channels_out, pixels + bins, [&](int64_t begin, int64_t end) {
    PoolBins b;
    std::vector<BinSpan> spans(bins);
    int64_t current = -1;
    for (int64_t index = begin; index < end; ++index) {
      const int64_t n = index / channels_out;
      const int64_t c_out = index % channels_out;
      if (n != current) {
        compute_pool_bins(b, roi_p + n * 5, spatial_scale, height, width, pooled_h, pooled_w,
                          /*position_sensitive=*/true);
        for (int64_t bin = 0; bin < bins; ++bin) {
          spans[bin] = bin_span(b, bin / pooled_w, bin % pooled_w, width);
        }
        current = n;
      }
      // This roi's planes from c_out on: the next output channel's follow this one's.
      const scalar_t* planes = in + (b.batch_index * channels + c_out * bins) * plane_size;
      const int64_t ahead_end = (c_out + 1 < channels_out ? 2 : 1) * bins;
      for (int64_t bin = 0; bin < bins; ++bin) {
        const int64_t next = bin + kAhead;
        if (next < ahead_end) {
          prefetch_span(planes + next * plane_size, spans[next % bins], width);
        }
        const BinSpan& span = spans[bin];
        const scalar_t* p = planes + bin * plane_size + span.offset;
        const acc_t sum =
            span.small() ? sum_small<acc_t>(p, span, width) : sum_span<acc_t>(p, span, width);
        out[index * bins + bin] =
            span.rows == 0 ? scalar_t(0)
                           : static_cast<scalar_t>(sum / static_cast<acc_t>(span.rows * span.cols));
        mapping[index * bins + bin] = static_cast<int32_t>(c_out * bins + bin);
      }
    }
  });
}

template <typename scalar_t>
void ps_roi_pool_backward_impl(const Tensor& grad, const Tensor& rois,
                               const Tensor& channel_mapping, Tensor& grad_input,
                               double spatial_scale, int64_t pooled_h, int64_t pooled_w) {
  using acc_t = opmath_t<scalar_t>;
  const int64_t num_rois = rois.size(0);
  const int64_t channels = grad_input.size(1);
  const int64_t height = grad_input.size(2);
  const int64_t width = grad_input.size(3);
  const int64_t plane_size = height * width;
  const int64_t bins = pooled_h * pooled_w;
  const int64_t per_roi = grad.size(1) * bins;
  const scalar_t* g = grad.const_data_ptr<scalar_t>();
  const scalar_t* roi_p = rois.const_data_ptr<scalar_t>();
  acc_t* gi = grad_input.mutable_data_ptr<acc_t>();

  // Every roi's bins once, bin-major: the entries of one input channel (one bin, under the
  // forward's mapping) read their spans in roi order. Then each chunk of input channels adds
  // its own grad entries (ps_roi_common.h).
  std::vector<BinSpan> spans(bins * num_rois);
  std::vector<int64_t> batch_index(num_rois);
  {
    PoolBins b;
    for (int64_t n = 0; n < num_rois; ++n) {
      compute_pool_bins(b, roi_p + n * 5, spatial_scale, height, width, pooled_h, pooled_w,
                        /*position_sensitive=*/true);
      for (int64_t bin = 0; bin < bins; ++bin) {
        spans[bin * num_rois + n] = bin_span(b, bin / pooled_w, bin % pooled_w, width);
      }
      batch_index[n] = b.batch_index;
    }
  }
  const int32_t* mapping = channel_mapping.const_data_ptr<int32_t>();
  const bool forward_mapping = is_forward_mapping(mapping, num_rois, per_roi);
  const int64_t pixels = pixels_per_roi(roi_p, num_rois, spatial_scale, height, width);
  const int64_t work = total_work(total_work(num_rois, per_roi), 1 + pixels / bins);
  parallel_for_work(
      channels, work / std::max<int64_t>(channels, 1), [&](int64_t c_begin, int64_t c_end) {
        for_each_owned_entry(mapping, forward_mapping, g, num_rois, per_roi, bins, c_begin, c_end,
                             [&](int64_t n, int64_t e, int64_t bin, int64_t c_in) {
                               const BinSpan& span = spans[bin * num_rois + n];
                               if (span.rows == 0) {
                                 return;
                               }
                               const acc_t value = static_cast<acc_t>(g[n * per_roi + e]) /
                                                   static_cast<acc_t>(span.rows * span.cols);
                               acc_t* p = gi + (batch_index[n] * channels + c_in) * plane_size +
                                          span.offset;
                               if (span.small()) {
                                 add_small(p, span, width, value);
                               } else {
                                 for (int64_t h = 0; h < span.rows; ++h, p += width) {
                                   for (int64_t w = 0; w < span.cols; ++w) {
                                     p[w] += value;
                                   }
                                 }
                               }
                             });
      });
}

std::tuple<Tensor, Tensor> ps_roi_pool_forward_kernel(const Tensor& input, const Tensor& rois,
                                                      double spatial_scale, int64_t pooled_height,
                                                      int64_t pooled_width) {
  return ps_roi_forward("ps_roi_pool", input, rois, pooled_height, pooled_width,
                        /*sampling_ratio=*/0,
                        [&](auto scalar, const Tensor& input_c, const Tensor& rois_c,
                            Tensor& output, Tensor& channel_mapping) {
                          ps_roi_pool_forward_impl<decltype(scalar)>(input_c, rois_c, output,
                                                                     channel_mapping, spatial_scale,
                                                                     pooled_height, pooled_width);
                        });
}

Tensor ps_roi_pool_backward_kernel(const Tensor& grad, const Tensor& rois,
                                   const Tensor& channel_mapping, double spatial_scale,
                                   int64_t pooled_height, int64_t pooled_width, int64_t batch_size,
                                   int64_t channels, int64_t height, int64_t width) {
  return ps_roi_backward("_ps_roi_pool_backward", grad, rois, channel_mapping, pooled_height,
                         pooled_width, batch_size, channels, height, width,
                         /*sampling_ratio=*/0,
                         [&](auto scalar, const Tensor& grad_c, const Tensor& rois_c,
                             const Tensor& mapping_c, Tensor& grad_input) {
                           ps_roi_pool_backward_impl<decltype(scalar)>(grad_c, rois_c, mapping_c,
                                                                       grad_input, spatial_scale,
                                                                       pooled_height, pooled_width);
                         });
}

}  // namespace

OPFORGE_LIBRARY_IMPL(CPU, m) {
  m.impl("ps_roi_pool", OPFORGE_KERNEL(ps_roi_pool_forward_kernel));
  m.impl("_ps_roi_pool_backward", OPFORGE_KERNEL(ps_roi_pool_backward_kernel));
}

}  // namespace opforge::cpu
